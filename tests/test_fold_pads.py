"""Pads folded into the convolution or pool that reads them (tvm_nimble/compiler/frontend/fold_pads.py): the built
model against onnx.reference on the original graph, and which Pads are left."""
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_nimble
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.compiler.frontend.fold_pads import fold_pads

C, H, W = 4, 9, 9


def _c(name, value, dtype=np.int64):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype), name))


def _pad(name, src, pads, value=0.0):
    return [_c(name + "_p", pads), _c(name + "_v", value, np.float32),
            helper.make_node("Pad", [src, name + "_p", name + "_v"], [name], mode="constant")]


def padded_model(crop: bool = True):
    """Six Pads in front of convolutions and pools; the first three fold, the last three must not. The fourth is a
    crop, or (``crop=False``: onnx.reference takes no negative pad) a pad before a pool in ceil mode."""
    rng = np.random.default_rng(0)
    dw = numpy_helper.from_array(rng.standard_normal((C, 1, 3, 3)).astype(np.float32), "dw")
    full = numpy_helper.from_array(rng.standard_normal((3, C, 3, 3)).astype(np.float32), "full")
    nodes = [helper.make_node("Relu", ["input"], ["x"])]
    # 1. zeros, asymmetric ("SAME" for stride 2) -> depthwise Conv
    nodes += _pad("p1", "input", [0, 0, 1, 0, 0, 0, 2, 1])
    nodes.append(helper.make_node("Conv", ["p1", "dw"], ["y1"], kernel_shape=[3, 3], strides=[2, 2], group=C))
    # 2. -inf -> MaxPool (timm's MaxPool2dSame)
    nodes += _pad("p2", "input", [0, 0, 0, 0, 0, 0, 1, 1], -math.inf)
    nodes.append(helper.make_node("MaxPool", ["p2"], ["y2"], kernel_shape=[3, 3], strides=[2, 2]))
    # 3. zeros -> AveragePool that does not count its own pads: the padded zeros are elements, so they count
    nodes += _pad("p3", "input", [0, 0, 1, 1, 0, 0, 1, 1])
    nodes.append(helper.make_node("AveragePool", ["p3"], ["y3"], kernel_shape=[3, 3], strides=[2, 2],
                                  count_include_pad=0))
    # 4. a crop (NASNet's shifted path), or a pool in ceil mode: stays
    nodes += _pad("p4", "x", [0, 0, -1, -1, 0, 0, 1, 1] if crop else [0, 0, 0, 0, 0, 0, 1, 1])
    nodes.append(helper.make_node("AveragePool", ["p4"], ["y4"], kernel_shape=[1, 1], strides=[2, 2],
                                  ceil_mode=int(not crop)))
    # 5. read by two convolutions: stays
    nodes += _pad("p5", "x", [0, 0, 1, 1, 0, 0, 1, 1])
    nodes += [helper.make_node("Conv", ["p5", "full"], ["y5a"], kernel_shape=[3, 3]),
              helper.make_node("Conv", ["p5", "full"], ["y5b"], kernel_shape=[3, 3], strides=[2, 2])]
    # 6. a pad of ones is no convolution padding: stays
    nodes += _pad("p6", "x", [0, 0, 1, 1, 0, 0, 1, 1], 1.0)
    nodes.append(helper.make_node("Conv", ["p6", "full"], ["y6"], kernel_shape=[3, 3]))
    outs = {"y1": [1, C, 5, 4], "y2": [1, C, 4, 4], "y3": [1, C, 5, 5], "y4": [1, C, 5, 5] if crop else [1, C, 6, 6], "y5a": [1, 3, 9, 9],
            "y5b": [1, 3, 5, 5], "y6": [1, 3, 9, 9]}
    graph = helper.make_graph(nodes, "pads", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, C, H, W])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o, shape in outs.items()],
                              initializer=[dw, full])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_the_foldable_pads_fold_and_the_others_stay():
    model = padded_model()
    folded = fold_pads(model)
    onnx.checker.check_model(folded, full_check=True)
    pads = [n for n in folded.graph.node if n.op_type == "Pad"]
    assert sorted(n.output[0] for n in pads) == ["p4", "p5", "p6"]
    by_out = {n.output[0]: n for n in folded.graph.node}
    attrs = {o: {a.name: helper.get_attribute_value(a) for a in by_out[o].attribute} for o in ("y1", "y2", "y3")}
    assert attrs["y1"]["pads"] == [1, 0, 2, 1] and by_out["y1"].input[0] == "input"
    assert attrs["y2"]["pads"] == [0, 0, 1, 1]
    assert attrs["y3"]["pads"] == [1, 1, 1, 1] and attrs["y3"]["count_include_pad"] == 1


def test_a_model_without_foldable_pads_is_returned_as_is():
    model = padded_model()
    unfoldable = fold_pads(model)
    assert fold_pads(unfoldable) is unfoldable


def test_the_folded_model_computes_what_the_original_does():
    model = padded_model(crop=False)
    x = np.random.default_rng(1).standard_normal((1, C, H, W)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"input": x})
    mod = from_onnx(model)
    pad_calls = str(mod["main"]).count("R.call_tir(pad")
    assert pad_calls == 3  # p4, p5, p6: the importer's opaque TE pads; the folded ones are attributes now
    with tvm_nimble.NimbleExecutor(tvm_nimble.build(mod, "llvm")) as ex:
        got = [y.numpy() for y in ex(x)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool, value", [("MaxPool", 0.0), ("AveragePool", -math.inf)])
def test_a_pool_keeps_a_pad_whose_value_it_would_not_pad_with(pool, value):
    nodes = _pad("p", "input", [0, 0, 1, 1, 0, 0, 1, 1], value)
    nodes.append(helper.make_node(pool, ["p"], ["output"], kernel_shape=[3, 3]))
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, C, H, W])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, C, 9, 9])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert fold_pads(model) is model
