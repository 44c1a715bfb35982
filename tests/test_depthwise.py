"""Our depthwise-convolution and pool kernel as a provider (relay_passes/providers/depthwise.py): what it takes, and
that models with its calls compute what the ONNX reference evaluator does. The calls run here as the kernel's numpy
contract (tests/vendor_reference.py: padded windows, an independent formulation of the CUDA kernel's index
arithmetic); the CUDA kernel itself is checked against PyTorch on a GPU (tests/gpu/test_depthwise_gpu.py)."""
import math

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from tvm import relax

from test_cudnn_graph import _reference  # the zoo model, seeded inputs, the ONNX reference's (input-dependent) output
from tvm_nimble import NimbleExecutor, build
from tvm_nimble.compiler import stages
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.relay_passes import providers
from tvm_nimble.relay_passes.providers import depthwise
from tvm_nimble.relay_passes.vendor_offload import OffloadToVendor

C, H, W = 8, 12, 12


def _module(model, layout):
    opts = BuildOptions.create("llvm", layout=layout, timing_cache="off")
    return stages.apply_layout(stages.import_model(model), opts)


def _vendor_calls(mod):
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_dps_packed":
            found.append((str(e.args[0].global_symbol), [int(v) for v in e.args[1].fields[-1].values]))

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


def _ops(mod, names):
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in names:
            found.append(e)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


def _run(mod, inputs):
    result = build(mod, "llvm", max_streams=None, timing_cache="off")
    return [y.numpy() for y in NimbleExecutor(result)(*inputs)]


def _c(name, value, dtype=np.int64):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype), name))


def stencil_model():
    """A separable branch and the pools of a NASNet cell, with every form the kernel takes: a ReLU in front, a
    SAME pad (folded into the convolution's attributes by the importer), bias, residual and ReLU6 after; average
    pools counting and not counting their padding; a max pool with -inf SAME padding and a ReLU after it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((C, 1, 5, 5)).astype(np.float32), "dw"),
             numpy_helper.from_array(rng.standard_normal((1, C, 1, 1)).astype(np.float32), "bias4"),
             numpy_helper.from_array(rng.standard_normal((C, 1, 3, 3)).astype(np.float32), "dw3")]
    nodes = [
        _c("zero", 0.0, np.float32), _c("six", 6.0, np.float32),
        # first a convolution, so that a channels-last build is NHWC from here on
        helper.make_node("Conv", ["input", "dw3"], ["x0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=C),
        helper.make_node("Relu", ["x0"], ["r"]),
        _c("p_pads", [0, 0, 1, 1, 0, 0, 2, 2]), _c("p_val", 0.0, np.float32),
        helper.make_node("Pad", ["r", "p_pads", "p_val"], ["rp"], mode="constant"),
        helper.make_node("Conv", ["rp", "dw"], ["d"], kernel_shape=[5, 5], strides=[2, 2], group=C),
        helper.make_node("Add", ["d", "bias4"], ["db"]),
        helper.make_node("AveragePool", ["x0"], ["a_all"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         count_include_pad=1),
        helper.make_node("Add", ["db", "a_all"], ["dz"]),
        helper.make_node("Clip", ["dz", "zero", "six"], ["y_conv"]),
        # stride 1, 3x3, a residual and nothing else
        helper.make_node("Conv", ["x0", "dw3"], ["d3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=C),
        helper.make_node("AveragePool", ["x0"], ["a_valid"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         count_include_pad=0),
        helper.make_node("Add", ["a_valid", "d3"], ["y_pool"]),
        _c("m_pads", [0, 0, 0, 0, 0, 0, 1, 1]), _c("m_val", -math.inf, np.float32),
        helper.make_node("Pad", ["x0", "m_pads", "m_val"], ["mp"], mode="constant"),
        helper.make_node("MaxPool", ["mp"], ["m"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("Relu", ["m"], ["y_max"]),
        # ceil mode (torchvision's GoogLeNet): the last window hangs over the input's end
        helper.make_node("MaxPool", ["x0"], ["y_ceil"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    ]
    outs = {"y_conv": [1, C, 6, 6], "y_pool": [1, C, H, W], "y_max": [1, C, 6, 6], "y_ceil": [1, C, 6, 6]}
    graph = helper.make_graph(nodes, "stencils", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, C, H, W])],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in outs.items()],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_every_stencil_form_runs_on_the_kernel_and_matches_the_reference(layout, vendor_reference):
    model = stencil_model()
    x = np.random.default_rng(1).standard_normal((1, C, H, W)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"input": x})
    mod = OffloadToVendor(providers=[depthwise.PROVIDER])(_module(model, layout))
    calls = _vendor_calls(mod)
    names = sorted(n for n, _ in calls)
    assert names == sorted([depthwise.CONV2D_ADD, depthwise.CONV2D, depthwise.CONV2D, depthwise.POOL2D,
                            depthwise.POOL2D_ADD, depthwise.POOL2D, depthwise.POOL2D]), names
    assert not _ops(mod, ("relax.nn.conv2d", "relax.nn.avg_pool2d", "relax.nn.max_pool2d", "relax.nn.relu",
                          "relax.clip"))  # the ReLU in front, ReLU6 and the max pool's ReLU are all in the calls
    by_mode = {(n, a[11]): a for n, a in calls}
    conv = by_mode[(depthwise.CONV2D_ADD, depthwise.MODE_CONV)]
    assert conv[:8] == [5, 5, 2, 2, 1, 1, 1, 1] and conv[8:10] == [2, 1]  # SAME pads top/left 1; relu6; relu in
    assert sorted(a[8] for n, a in calls if a[11] == depthwise.MODE_MAX) == [0, 1]  # the ReLU after one of them
    assert (depthwise.POOL2D, depthwise.MODE_AVG_ALL) in by_mode
    assert (depthwise.POOL2D_ADD, depthwise.MODE_AVG_VALID) in by_mode
    assert all(a[10] == (layout == "nhwc") for _, a in calls)
    got = _run(mod, [x])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["nasnet", "mobilenet"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_zoo_models_with_their_depthwise_layers_on_the_kernel_match_the_reference(name, layout, vendor_reference):
    model, inputs, ref = _reference(name)
    mod = _module(model, layout)
    depthwise_convs = [c for c in _ops(mod, ("relax.nn.conv2d",)) if int(c.attrs.groups) > 1]
    pools = _ops(mod, ("relax.nn.avg_pool2d", "relax.nn.max_pool2d"))
    assert depthwise_convs or pools
    offloaded = OffloadToVendor(providers=[depthwise.PROVIDER])(mod)
    calls = _vendor_calls(offloaded)
    assert len([1 for _, a in calls if a[11] == depthwise.MODE_CONV]) == len(depthwise_convs)
    assert len([1 for _, a in calls if a[11] != depthwise.MODE_CONV]) == len(pools)
    out = _run(offloaded, list(inputs.values()))[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_convolutions_that_are_not_depthwise_are_left_to_the_others(vendor_reference):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((2 * C, 1, 3, 3)).astype(np.float32), "mult2"),
             numpy_helper.from_array(rng.standard_normal((C, C, 3, 3)).astype(np.float32), "full")]
    nodes = [helper.make_node("Conv", ["input", "mult2"], ["a"], kernel_shape=[3, 3], group=C),
             helper.make_node("Conv", ["input", "full"], ["b"], kernel_shape=[3, 3])]
    graph = helper.make_graph(nodes, "others", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, C, H, W])],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2 * C, 10, 10]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, C, 10, 10])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert not _vendor_calls(OffloadToVendor(providers=[depthwise.PROVIDER])(_module(model, "nchw")))


def test_the_provider_is_registered_after_cudnn_so_vendor_builds_keep_cudnn():
    names = providers.names()
    assert names.index("depthwise") > names.index("cudnn_graph") > names.index("cudnn")
    assert providers.get("depthwise").by_default
