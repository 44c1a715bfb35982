"""A training step on vendor kernels (#34): the forward convolutions and both convolution gradients that TVM's
Gradient pass writes (conv2d_transpose for dL/dx, a CNHW convolution for dL/dW, trimmed by a strided_slice after
a strided convolution) become cuDNN calls (the gradients: provider cudnn_grad, named by build_training when its
kernels are vendor or best); on llvm, with the calls run as their numpy contract
(tests/vendor_reference.py: the gradients brute-forced from the forward convolution's windows), the steps equal
TVM's own trainer on TVM's kernels."""
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.training import Trainer

from tvm_nimble import zoo
from tvm_nimble.compiler.build import build
from tvm_nimble.compiler.training import NimbleTrainer, build_step, training_step
from tvm_nimble.contract import vendor_abi
from tvm_nimble.relay_passes import providers
from tvm_nimble.relay_passes.providers.cudnn import CONV2D
from tvm_nimble.relay_passes.providers.cudnn_grad import CONV2D_BWD_DATA, CONV2D_BWD_FILTER
from tvm_nimble.relay_passes.vendor_offload import OffloadReport, OffloadToVendor

STEPS = 3


def _ops(mod, name) -> int:
    return sum(1 for blk in mod["main"].body.blocks for b in blk.bindings
               if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op) and b.value.op.name == name)


def strided_net():
    """Stride-2 convolutions whose inputs leave a row unread (10x10 -> 5x5 -> 2x2): TVM trims their dL/dW with a
    strided_slice, and its dL/dW convolution has the forward stride as its dilation. (Not dilated: TVM 0.27's
    conv2d gradient gets dL/dx's shape wrong for a dilated kernel.)"""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype("float32") * 0.3, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((10, 6, 2, 2)).astype("float32") * 0.3, "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["y"])]
    graph = helper.make_graph(nodes, "strided", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MODELS = {"resnet": lambda: zoo.get_model("resnet"), "inception": lambda: zoo.get_model("inception"),
          "strided": strided_net}
INPUT = {"resnet": (1, 3, 16, 16), "inception": (1, 3, 16, 16), "strided": (1, 3, 10, 10)}


#: an inference build's providers and the gradients' (as build_training names them)
TRAINING = providers.offloading("cuda") + [providers.get("cudnn_grad")]


@pytest.fixture(scope="module", params=list(MODELS))
def step(request):
    s = training_step(MODELS[request.param](), "mse", "momentum", lr=0.01)
    s.input_shape, s.label = INPUT[request.param], request.param
    return s


def test_the_strided_net_has_the_trimmed_gradients_this_file_is_about():
    s = training_step(strided_net(), "mse", "momentum", lr=0.01)
    assert _ops(s.mod, "relax.strided_slice") == 2
    assert _ops(OffloadToVendor(providers=TRAINING)(s.mod), "relax.strided_slice") == 0  # into their calls


def test_every_convolution_and_its_gradients_go_to_cudnn(step):
    convs, transposes = _ops(step.mod, "relax.nn.conv2d"), _ops(step.mod, "relax.nn.conv2d_transpose")
    assert transposes > 0 and convs == 2 * (transposes + 1)  # forward and dL/dW per layer; the first has no dL/dx
    report = OffloadReport()
    offloaded = OffloadToVendor(report=report, providers=TRAINING)(step.mod)
    assert _ops(offloaded, "relax.nn.conv2d") == _ops(offloaded, "relax.nn.conv2d_transpose") == 0
    assert not [r for r in report.kept if r[0] in ("conv2d", "conv2d_transpose")]
    # without it (an inference build's providers) the gradients stay on TVM
    inference = OffloadToVendor()(step.mod)
    assert _ops(inference, "relax.nn.conv2d") == transposes + 1 and _ops(inference, "relax.nn.conv2d_transpose") == transposes
    result = build_step(step, {"kind": "cuda", "arch": "sm_90"}, kernels="vendor", max_streams=None,
                        compile_kernels=False)  # what build_training(kernels="vendor") builds
    kernels = [l.kernel for l in result.plan.launches]
    assert kernels.count(CONV2D_BWD_DATA) == transposes and kernels.count(CONV2D_BWD_FILTER) == transposes + 1
    assert kernels.count(CONV2D) + kernels.count(CONV2D + "_add") == transposes + 1
    used = {providers.provider_of(k).name for k in kernels if k.startswith(vendor_abi.VENDOR_PREFIXES)}
    assert {"cudnn", "cudnn_grad"} <= used <= {"cudnn", "cudnn_grad", "depthwise"}
    assert all(k.startswith(vendor_abi.DEPTHWISE_POOL2D) for k in kernels if providers.provider_of(k).name == "depthwise")
    # (the forward max pools cuDNN does not take; the depthwise convolutions' weights are inputs here: cuDNN's)
    # the default (kernels="auto"), as for inference: with no GPU here to measure on, vendor where the extension
    # can be built (the same plan as above), else TVM's kernels
    from tvm_nimble.codegen.vendor_build import vendor_available

    default = [l.kernel for l in build_step(step, {"kind": "cuda", "arch": "sm_90"}, max_streams=None,
                                            compile_kernels=False).plan.launches]
    assert default == kernels if vendor_available()[0] else not [k for k in default if k.startswith("nimble.")]


def test_steps_on_the_gradient_calls_equal_tvms_trainer(step, vendor_reference):
    module = build(OffloadToVendor(providers=TRAINING)(step.mod), "llvm", max_streams=None)
    assert any(l.kernel == CONV2D_BWD_FILTER for l in module.plan.launches)
    trainer = NimbleTrainer(module, step)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(step.input_shape).astype("float32") for _ in range(STEPS)]
    ys = [rng.standard_normal((1, 10)).astype("float32") for _ in range(STEPS)]
    losses = [trainer.step(x, y) for x, y in zip(xs, ys)]
    vm = relax.VirtualMachine(tvm.compile(step.train_mod, "llvm"), tvm.cpu())
    reference = Trainer(step.train_mod, vm, tvm.cpu(), zero_init_param_state=True)
    reference.load_params([tvm.runtime.tensor(w) for w in step.params.values()])
    np.testing.assert_allclose(losses, [float(reference.update([x], [y]).numpy()) for x, y in zip(xs, ys)],
                               rtol=1e-4)
    ref_params = {k: v.numpy() for k, v in reference.export_params().items()}
    for k, v in trainer.params.items():
        np.testing.assert_allclose(v, ref_params[k], rtol=1e-4, atol=1e-5)
