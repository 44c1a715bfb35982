"""Powers by a constant 2 or 3 imported as multiplications (tvm_nimble/compiler/frontend/fold_powers.py): the built
model equals the ONNX reference evaluator on negative and positive inputs, no power is left in the Relax module,
and other exponents stay powers."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvm_nimble.compiler.frontend.fold_powers import fold_powers


def _pow_model(exponent: float):
    """y = Pow(x, c) + Pow(x, 2) (GPT-2's GELU spells x^3 as Pow(x, 3.0))."""
    g = helper.make_graph(
        [helper.make_node("Pow", ["x", "c"], ["p"]), helper.make_node("Pow", ["x", "two"], ["q"]),
         helper.make_node("Add", ["p", "q"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        initializer=[numpy_helper.from_array(np.array(exponent, np.float32), "c"),
                     numpy_helper.from_array(np.array([2], np.int64), "two")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_cubes_and_squares_build_as_multiplications_and_match_the_reference():
    from tvm_nimble import NimbleExecutor, build
    from tvm_nimble.compiler.frontend import from_onnx

    model = _pow_model(3.0)
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)  # negative bases too
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert "power" not in from_onnx(model).script()
    np.testing.assert_allclose(NimbleExecutor(build(model, "llvm"))(x)[0].numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("exponent", [0.5, 4.0])
def test_other_exponents_stay_powers(exponent):
    model = _pow_model(exponent)
    folded = fold_powers(model)
    assert [n.op_type for n in folded.graph.node].count("Pow") == 1
    x = np.linspace(0.1, 3, 16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_allclose(ReferenceEvaluator(folded).run(None, {"x": x})[0],
                               ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-6)


@pytest.mark.parametrize("shape_dict", [None, {"x": (2, 8)}])
def test_the_import_folds_its_own_copy_and_leaves_the_callers_model_alone(shape_dict):
    """The folds change the copy the import made (in place: a copy of a large model is mostly its weights);
    the model the caller passed is the same, byte for byte, after the import."""
    from tvm_nimble.compiler.frontend import from_onnx

    model = _pow_model(3.0)
    before = model.SerializeToString()
    assert "power" not in from_onnx(model, shape_dict=shape_dict).script()
    assert model.SerializeToString() == before


def test_in_place_the_fold_changes_the_model_it_is_given():
    model = _pow_model(3.0)
    folded = fold_powers(model, in_place=True)
    assert folded is model and "Pow" not in [n.op_type for n in model.graph.node]
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_allclose(ReferenceEvaluator(model).run(None, {"x": x})[0],
                               ReferenceEvaluator(_pow_model(3.0)).run(None, {"x": x})[0], rtol=1e-6)
