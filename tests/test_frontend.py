"""ONNX -> Relax import: every accepted input form, and a one-line NimbleError for every bad one."""
import pathlib

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvm_nimble import zoo
from tvm_nimble.errors import ModelError, NimbleError, ShapeError, UnsupportedOperatorError
from tvm_nimble.compiler.frontend import (OnnxFileNotFoundError, from_onnx, load_onnx_model, supported_operators,
                                 unsupported_operators)

LLVM = tvm.target.Target({"kind": "llvm"})


def run(mod, *arrays):
    ex = tvm.compile(mod, target=LLVM)
    out = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a, tvm.cpu()) for a in arrays])
    return [out.numpy()] if isinstance(out, tvm.runtime.Tensor) else [o.numpy() for o in out]


def tiny_model(nodes, in_shape, out_shape, inits=(), opsets=(("", 17),), functions=(), in_name="input"):
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)],
                              initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                              functions=list(functions))
    model.ir_version = 8
    return model


def symbolic_model():
    """Relu -> Conv over an input whose batch dim is the symbol 'batch_size' and height unknown."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    return tiny_model([helper.make_node("Relu", ["input"], ["r"]),
                       helper.make_node("Conv", ["r", "w"], ["output"], pads=[1, 1, 1, 1])],
                      ["batch_size", 3, None, 8], ["batch_size", 4, None, 8], inits=[w])


def error_of(exc_type, *args, **kw) -> str:
    """The message of the NimbleError ``from_onnx`` raises; it must be one line."""
    with pytest.raises(exc_type) as info:
        from_onnx(*args, **kw)
    assert isinstance(info.value, NimbleError)
    msg = str(info.value)
    assert "\n" not in msg and msg
    return msg


@pytest.fixture(scope="module")
def resnet():
    return zoo.resnet_chain(blocks=1, hw=8, channels=8)


# ---- accepted inputs --------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["ModelProto", "str path", "pathlib.Path", "bytes"])
def test_from_onnx_accepts_every_form_and_compiles(form, resnet, tmp_path):
    path = zoo.save(resnet, tmp_path / "resnet.onnx")
    arg = {"ModelProto": resnet, "str path": path, "pathlib.Path": pathlib.Path(path),
           "bytes": resnet.SerializeToString()}[form]
    mod = from_onnx(arg)
    assert isinstance(mod, tvm.IRModule)
    assert [p.name for p in mod["main"].params] == ["input"]  # weights are constants, not inputs
    x = zoo.random_inputs(resnet, seed=1)["input"]
    (ref,) = ReferenceEvaluator(resnet).run(None, {"input": x})
    (got,) = run(mod, x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_load_onnx_model_roundtrip(resnet, tmp_path):
    path = zoo.save(resnet, tmp_path / "m.onnx")
    for arg in (path, pathlib.Path(path), resnet.SerializeToString(), resnet):
        assert load_onnx_model(arg).SerializeToString() == resnet.SerializeToString()
    assert load_onnx_model(resnet) is resnet


def test_batch_norm_is_decomposed_for_inference():
    rng = np.random.default_rng(0)
    c = 4
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("scale", rng.uniform(0.5, 1.5, c)), ("bias", rng.normal(size=c)), ("mean", rng.normal(size=c)),
        ("var", rng.uniform(0.5, 1.5, c))]]
    model = tiny_model([helper.make_node("BatchNormalization", ["input", "scale", "bias", "mean", "var"], ["output"])],
                       [1, c, 5, 5], [1, c, 5, 5], inits=inits)
    mod = from_onnx(model)
    assert "batch_norm" not in mod.script()
    x = rng.standard_normal((1, c, 5, 5)).astype(np.float32)
    (got,) = run(mod, x)
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"input": x})[0], rtol=1e-4, atol=1e-4)


def test_model_local_functions_are_inlined():
    fn = helper.make_function("my.funcs", "DoubleRelu", ["x"], ["y"],
                              [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Add", ["t", "t"], ["y"])],
                              opset_imports=[helper.make_opsetid("", 17)])
    model = tiny_model([helper.make_node("DoubleRelu", ["input"], ["output"], domain="my.funcs")], [2, 3], [2, 3],
                       opsets=[("", 17), ("my.funcs", 1)], functions=[fn])
    x = np.array([[-1, 2, -3], [4, -5, 6]], dtype=np.float32)
    (got,) = run(from_onnx(model), x)
    np.testing.assert_allclose(got, np.maximum(x, 0) * 2)


# ---- file problems ----------------------------------------------------------------------------
def test_missing_file(tmp_path):
    path = tmp_path / "nope.onnx"
    msg = error_of(OnnxFileNotFoundError, str(path))
    assert msg == f"ONNX file not found: {path}"
    with pytest.raises(FileNotFoundError):  # also catchable as the builtin
        from_onnx(path)
    with pytest.raises(ModelError, match="ONNX file not found"):
        load_onnx_model(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    msg = error_of(ModelError, str(path))
    assert msg.startswith(f"{path} is not a valid ONNX model (") and msg.endswith("re-export it")
    assert "empty" in msg


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_file(tmp_path, resnet, cut):
    data = resnet.SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: int(len(data) * cut)])
    msg = error_of(ModelError, str(path))
    assert msg.startswith(f"{path} is not a valid ONNX model (") and msg.endswith("re-export it")
    assert "truncated" in msg


@pytest.mark.parametrize("payload", [b"\x00" * 16, b"definitely not protobuf\n", b"\x08"])
def test_malformed_file(tmp_path, payload):
    path = tmp_path / "junk.onnx"
    path.write_bytes(payload)
    msg = error_of(ModelError, str(path))
    assert msg.startswith(f"{path} is not a valid ONNX model (") and msg.endswith("re-export it")


def test_malformed_bytes_and_bad_argument_types(tmp_path):
    assert "not a valid ONNX model" in error_of(ModelError, b"\xff\xff\xff garbage")
    assert "got int" in error_of(ModelError, 42)
    assert "is a directory" in error_of(ModelError, str(tmp_path))


def test_checker_failure():
    # a node reading a tensor nothing produces: protobuf-valid, rejected by onnx.checker
    model = tiny_model([helper.make_node("Relu", ["nowhere"], ["output"], name="lost")], [1, 4], [1, 4])
    msg = error_of(ModelError, model)
    assert "fails the ONNX checker" in msg and "nowhere" in msg and "re-export" in msg


# ---- unsupported operators --------------------------------------------------------------------
def test_unsupported_operators_are_all_named_before_import(monkeypatch):
    model = tiny_model([helper.make_node("NotARealOp", ["input"], ["a"], name="mystery"),
                        helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("AlsoFake", ["b"], ["c"], name="fake1"),
                        helper.make_node("AlsoFake", ["c"], ["output"], name="fake2")],
                       [1, 4], [1, 4])
    import tvm.relax.frontend.onnx as tvm_onnx

    def must_not_import(*a, **k):
        raise AssertionError("TVM's importer was called")

    monkeypatch.setattr(tvm_onnx, "from_onnx", must_not_import)
    msg = error_of(UnsupportedOperatorError, model)
    assert "NotARealOp" in msg and "AlsoFake" in msg and "Relu" not in msg.split("support:")[1]
    assert "2 operator types" in msg and "'mystery'" in msg and "2 nodes" in msg
    assert "does not support" in msg and "TVM" in msg
    assert unsupported_operators(model) == {"AlsoFake": ["fake1", "fake2"], "NotARealOp": ["mystery"]}
    assert issubclass(UnsupportedOperatorError, ModelError)


def test_unsupported_operator_in_custom_domain_and_inside_if_branch():
    custom = tiny_model([helper.make_node("Relu", ["input"], ["output"], domain="com.example")], [1, 4], [1, 4],
                        opsets=[("", 17), ("com.example", 1)])
    assert "com.example::Relu" in error_of(UnsupportedOperatorError, custom)

    def branch(op):
        return helper.make_graph([helper.make_node(op, ["input"], ["y"])], op,
                                 [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])

    cond = numpy_helper.from_array(np.array(True), "cond")
    model = tiny_model([helper.make_node("If", ["cond"], ["output"], then_branch=branch("Relu"),
                                         else_branch=branch("NotARealOp"))], [1, 4], [1, 4], inits=[cond])
    assert "NotARealOp" in error_of(UnsupportedOperatorError, model)


def test_supported_operators_come_from_the_importer():
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    ops = supported_operators()
    assert set(_get_convert_map()) <= ops
    assert {"Conv", "Relu", "Add", "Concat", "Gemm", "If", "Constant"} <= ops
    assert "NotARealOp" not in ops
    for name in sorted(zoo.ZOO):
        assert unsupported_operators(zoo.get_model(name)) == {}


def test_importer_failure_is_wrapped(monkeypatch):
    from tvm.relax.frontend.onnx import onnx_frontend

    class Exploding(onnx_frontend.OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            raise tvm.error.InternalError("deep inside TVM\nStack trace:\n  0: frobnicate")

    real = onnx_frontend._get_convert_map
    monkeypatch.setattr(onnx_frontend, "_get_convert_map", lambda: {**real(), "Relu": Exploding})
    model = tiny_model([helper.make_node("Relu", ["input"], ["output"])], [1, 4], [1, 4])
    msg = error_of(ModelError, model)
    assert "ONNX importer failed" in msg and "Relu" in msg and "deep inside TVM" in msg
    assert "Stack trace" not in msg


# ---- shapes -----------------------------------------------------------------------------------
def test_symbolic_dims_name_input_dim_and_the_fix():
    msg = error_of(ShapeError, symbolic_model())
    assert "'input'" in msg and "dim 0 ('batch_size')" in msg and "dim 2 (unknown)" in msg
    assert "shape_dict={'input': (1, 3, 1, 8)}" in msg


def test_unknown_rank_input():
    graph = helper.make_graph([helper.make_node("Relu", ["input"], ["output"])], "g",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    msg = error_of(ShapeError, model)  # (onnx.checker alone would only say "Field 'shape' ... missing")
    assert "'input' has unknown rank" in msg and "shape_dict=" in msg
    (got,) = run(from_onnx(model, shape_dict={"input": (2, 3)}), -np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(got, np.zeros((2, 3), np.float32))


def test_shape_dict_makes_symbolic_model_static():
    model = symbolic_model()
    mod = from_onnx(model, shape_dict={"input": (2, 3, 6, 8)})
    [param] = mod["main"].params
    assert [int(d) for d in param.ty.shape] == [2, 3, 6, 8]
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 8)).astype(np.float32)
    (got,) = run(mod, x)
    (ref,) = ReferenceEvaluator(model).run(None, {"input": x})
    assert got.shape == (2, 4, 6, 8)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_shape_dict_unknown_input():
    msg = error_of(ShapeError, symbolic_model(), shape_dict={"images": (1, 3, 8, 8)})
    assert "'images'" in msg and "does not have" in msg and "inputs are 'input'" in msg


@pytest.mark.parametrize("shape,what", [((1, 3, 8), "rank 3"), ((1, 3, -1, 8), "dim 2 = -1, which is not a valid size"),
                                         ((1, 3, None, 8), "not a static shape"), ("1x3x8x8", "not a static shape")])
def test_shape_dict_bad_shapes(shape, what):
    msg = error_of(ShapeError, symbolic_model(), shape_dict={"input": shape})
    assert what in msg and "'input'" in msg


def test_shape_dict_not_a_mapping():
    assert "shape_dict must map" in error_of(ShapeError, symbolic_model(), shape_dict=[(1, 3, 8, 8)])


@pytest.mark.parametrize("limit", [1_000, 1_000_000])
def test_the_in_memory_check_size_agrees_with_protobuf(limit):
    """Whether a model is checked in memory: its weights' size from their shapes first (a 0.5B decoder's ByteSize
    walked 2 GB of bytes for seconds, then raised), the serialized size otherwise; the same answer as protobuf's."""
    from tvm_nimble.compiler.frontend.onnx_import import _serialized_in_memory, fits_in_memory_checks

    inits = [numpy_helper.from_array(np.arange(300, dtype=np.float32).reshape(3, 100), "a"),
             numpy_helper.from_array(np.ones((10, 30), np.float16), "b")]
    model = helper.make_model(helper.make_graph([], "g", [], [], initializer=inits))
    assert fits_in_memory_checks(model, limit) == (model.ByteSize() < limit)
    # the import's checker reads the model serialized once, where it fits: the same answer, the model's bytes
    data = _serialized_in_memory(model, limit)
    assert (data is not None) == fits_in_memory_checks(model, limit)
    assert data is None or onnx.load_from_string(data) == model
