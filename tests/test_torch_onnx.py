"""The PyTorch mirror of a zoo ONNX graph (PyTorch's side of the training benchmark) against the ONNX
reference evaluator, on every zoo net."""
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from tvm_nimble import zoo
from tvm_nimble.errors import NimbleError

torch = pytest.importorskip("torch")
from tvm_nimble.bench.torch_onnx import torch_module  # noqa: E402


@pytest.mark.parametrize("name", ["inception", "nasnet", "resnet", "mobilenet", "random_dag"])
def test_forward_matches_the_onnx_reference(name):
    model = zoo.get_model(name, batch=2)
    feeds = zoo.random_inputs(model, seed=1)
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    with torch.no_grad():
        out = torch_module(model)(*[torch.from_numpy(x) for x in feeds.values()]).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    other = zoo.random_inputs(model, seed=2)
    assert not np.allclose(ReferenceEvaluator(model).run(None, other)[0], ref, atol=1e-3)  # input-dependent


def test_trainable_initializers_are_parameters_the_rest_buffers():
    model = zoo.get_model("mobilenet")
    names = {t.name for t in model.graph.initializer}
    weights = {n for n in names if n.startswith("w_")}
    m = torch_module(model, trainable=weights)
    assert set(m.weights.keys()) == weights
    assert {n for n, _ in m.named_buffers()} == names - weights


def test_an_operator_it_lacks_is_one_clear_error():
    model = zoo.get_model("inception")
    model.graph.node[1].op_type = "Softsign"
    with pytest.raises(NimbleError, match=r"lacks operator\(s\) \['Softsign'\]"):
        torch_module(model)
