"""Exporter patterns that TVM 0.27's ONNX importer cannot take as they are, imported through
tvm_nimble.compiler.frontend (which folds static shape computations first) and checked against
onnx.reference.

The main one is torch.onnx's (TorchScript exporter, opset >= 11) F.pad with computed pads, as timm's
"same" padding emits it (nasnetalarge): the pads come out of Shape -> Gather -> ... arithmetic, and
are then padded to 2 * rank with Shape -> Gather -> Sub -> ConstantOfShape -> Concat and reordered
with Reshape(-1, 2) -> Slice(reversed) -> Transpose -> Reshape(-1). Unfolded, the importer gives the
ConstantOfShape no shape and fails on the first Reshape: "Reshape expects the input tensor to have
known shape when there is some dimension length to infer".
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_nimble
from tvm_nimble.compiler.frontend import fold_shapes, onnx_import
from tvm_nimble.errors import ModelError
from tvm_nimble.compiler.frontend import fold_static_shapes, from_onnx

H = W = 9
K, S, C_OUT = 3, 2, 4


def _c(name, value, dtype=np.int64):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype), name))


def same_pad_conv_model(sizes_from="constants"):
    """Relu -> Pad -> Conv(k3, s2) -> Relu, the pads computed as in nasnetalarge's export: timm's
    pad = max((ceil(i / s) - 1) * s + (k - 1) + 1 - i, 0) per spatial dim in float scalars, from
    sizes the tracer baked in as constants (``sizes_from="constants"``, the node that fails first
    in nasnetalarge) or read with Shape -> Gather off the activation (``"shape"``, later cells)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((C_OUT, 3, K, K)).astype(np.float32), "w")
    nodes = [helper.make_node("Relu", ["input"], ["x"]),
             _c("s", float(S), np.float32), _c("one", 1.0, np.float32), _c("km1", float(K - 1), np.float32),
             _c("zero_f", 0.0, np.float32), _c("two", 2.0, np.float32)]
    if sizes_from == "shape":
        nodes.append(helper.make_node("Shape", ["x"], ["x_shape"]))
    pads_torch = []  # torch's order: last dim first, (before, after) per dim
    for dim, size in ((3, W), (2, H)):
        d = f"d{dim}_"
        if sizes_from == "shape":
            nodes += [_c(d + "idx", dim), helper.make_node("Gather", ["x_shape", d + "idx"], [d + "i_int"], axis=0),
                      helper.make_node("Cast", [d + "i_int"], [d + "i"], to=TensorProto.FLOAT)]
        else:
            nodes.append(_c(d + "i", float(size), np.float32))
        nodes += [helper.make_node("Div", [d + "i", "s"], [d + "q"]),
                  helper.make_node("Ceil", [d + "q"], [d + "qc"]),
                  helper.make_node("Sub", [d + "qc", "one"], [d + "q1"]),
                  helper.make_node("Mul", [d + "q1", "s"], [d + "q1s"]),
                  helper.make_node("Add", [d + "q1s", "km1"], [d + "a"]),
                  helper.make_node("Add", [d + "a", "one"], [d + "span"]),
                  helper.make_node("Sub", [d + "span", d + "i"], [d + "raw"]),
                  helper.make_node("Clip", [d + "raw", "zero_f", ""], [d + "pad"]),
                  helper.make_node("Div", [d + "pad", "two"], [d + "half"]),
                  helper.make_node("Cast", [d + "half"], [d + "half_int"], to=TensorProto.INT64),
                  helper.make_node("Cast", [d + "half_int"], [d + "before"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", [d + "pad", d + "before"], [d + "after"])]
        pads_torch += [d + "before", d + "after"]
    nodes += [_c("ax0", [0]), _c("i0", [0]), _c("eight", 8)]
    nodes += [helper.make_node("Unsqueeze", [v, "ax0"], [v + "_1"]) for v in pads_torch]
    nodes += [
        helper.make_node("Concat", [v + "_1" for v in pads_torch], ["pads_torch"], axis=0),
        # torch's F.pad symbolic: extend to 2 * rank with zeros, then reorder to ONNX's layout
        helper.make_node("Shape", ["pads_torch"], ["np_shape"]),
        helper.make_node("Gather", ["np_shape", "i0"], ["n_pads"], axis=0),
        helper.make_node("Sub", ["eight", "n_pads"], ["n_zeros"]),
        helper.make_node("Cast", ["pads_torch"], ["pads_torch_int"], to=TensorProto.INT64),
        helper.make_node("ConstantOfShape", ["n_zeros"], ["zeros"],
                         value=numpy_helper.from_array(np.zeros(1, np.int64))),
        helper.make_node("Concat", ["pads_torch_int", "zeros"], ["pads_full"], axis=0),
        _c("pairs", [-1, 2]),
        helper.make_node("Reshape", ["pads_full", "pairs"], ["pads_2d"]),
        _c("st", [-1]), _c("en", [-(2**63) + 1]), _c("stp", [-1]),
        helper.make_node("Slice", ["pads_2d", "st", "en", "ax0", "stp"], ["pads_rev"]),
        helper.make_node("Transpose", ["pads_rev"], ["pads_t"], perm=[1, 0]),
        _c("flat", [-1]),
        helper.make_node("Reshape", ["pads_t", "flat"], ["pads_flat"]),
        helper.make_node("Cast", ["pads_flat"], ["pads"], to=TensorProto.INT64),
        helper.make_node("Pad", ["x", "pads", "zero_f"], ["xp"], mode="constant"),
        helper.make_node("Conv", ["xp", "w"], ["y"], kernel_shape=[K, K], strides=[S, S]),
        helper.make_node("Relu", ["y"], ["output"]),
    ]
    out_hw = -(-H // S)
    graph = helper.make_graph(nodes, "same_pad",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, H, W])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, C_OUT, out_hw, out_hw])],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def reference(model, x):
    return ReferenceEvaluator(model).run(None, {"input": x})[0]


@pytest.mark.parametrize("sizes_from", ["constants", "shape"])
def test_same_pad_chain_builds_and_matches_reference(sizes_from):
    model = same_pad_conv_model(sizes_from)
    x = np.random.default_rng(1).standard_normal((1, 3, H, W)).astype(np.float32)
    want = reference(model, x)
    mod = from_onnx(model)
    nm = tvm_nimble.build(mod, "llvm")
    with tvm_nimble.NimbleExecutor(nm) as ex:
        got = ex(x)[0].numpy()
    assert got.shape == want.shape == (1, C_OUT, 5, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sizes_from, error", [
    ("constants", r"converting a Reshape node: .*Reshape expects the input tensor to have known shape"),
    ("shape", r"converting a Ceil node: .*requires argument 0 \(x\) to be a tensor"),
])
def test_same_pad_chain_fails_in_the_importer_without_folding(monkeypatch, sizes_from, error):
    """The graphs above really are failing patterns: unfolded, TVM 0.27's importer rejects them
    ("constants" with nasnetalarge's exact error). If a newer TVM takes them, this test says so
    and the fold is merely an optimisation."""
    monkeypatch.setattr(onnx_import, "fold_static_shapes", lambda m, in_place=False: m)
    with pytest.raises(ModelError, match=error):
        from_onnx(same_pad_conv_model(sizes_from))


@pytest.mark.parametrize("sizes_from", ["constants", "shape"])
def test_fold_leaves_only_the_compute(sizes_from):
    folded = fold_static_shapes(same_pad_conv_model(sizes_from))
    onnx.checker.check_model(folded, full_check=True)
    ops = [n.op_type for n in folded.graph.node]
    assert sorted(set(ops)) == ["Constant", "Conv", "Pad", "Relu"]
    pads = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in folded.graph.node if n.op_type == "Constant"}
    pad_node = next(n for n in folded.graph.node if n.op_type == "Pad")
    # "same" padding of 9 with k3 s2: 2 in total per spatial dim, 1 before and 1 after
    assert pads[pad_node.input[1]].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]


def test_fold_returns_a_model_without_shape_computations_unchanged():
    w = numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["input", "w"], ["output"])], "plain",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2, 4, 4])],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert fold_static_shapes(model) is model


def test_fold_shape_slice_and_flatten_reshape():
    """Shape-15 start/end and the x.view(x.size(0), -1) pattern: Shape -> Slice -> Concat -> Reshape."""
    nodes = [
        helper.make_node("Relu", ["input"], ["x"]),
        helper.make_node("Shape", ["x"], ["batch"], start=0, end=1),
        _c("minus1", [-1]),
        helper.make_node("Concat", ["batch", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["output"]),
    ]
    graph = helper.make_graph(nodes, "flatten", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 12])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded = fold_static_shapes(model)
    assert [n.op_type for n in folded.graph.node] == ["Constant", "Relu", "Reshape"]
    target = numpy_helper.to_array(folded.graph.node[0].attribute[0].t)
    assert target.tolist() == [2, -1] and target.dtype == np.int64
    x = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    nm = tvm_nimble.build(from_onnx(model), "llvm")
    with tvm_nimble.NimbleExecutor(nm) as ex:
        np.testing.assert_allclose(ex(x)[0].numpy(), reference(model, x), rtol=1e-6, atol=1e-6)


def test_fold_does_not_expand_large_constants():
    """A ConstantOfShape bigger than the folding limit stays in the graph for TVM."""
    n = fold_shapes._FOLD_MAX_ELEMENTS + 1
    nodes = [_c("shape", [1, n]),
             helper.make_node("ConstantOfShape", ["shape"], ["big"],
                              value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("Add", ["input", "big"], ["output"])]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert fold_static_shapes(model) is model
