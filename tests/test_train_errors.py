"""`tvm-nimble train` and build_training as a newcomer meets them (issue #33): a model TVM's gradient
cannot differentiate, a learning rate that is not positive, a loss that diverges, the progress bar,
and the mse loss (a mean, as PyTorch's). The CLI runs on real files, through ``tvm_nimble.cli.main`` in this
process (tests/cli_runner.py); references are numpy's closed-form gradients and PyTorch's mse_loss."""
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_runner import run_cli
from tvm_nimble import zoo
from tvm_nimble.compiler.training import build_training, training_step
from tvm_nimble.errors import ModelError, NimbleError, TrainingDivergedError

VOCAB, DIM, OUT, IDS = 10, 4, 3, np.array([1, 2, 3, 1, 5, 6, 1, 8])  # ids repeat: their gradients add up


def cli(*args):
    return run_cli("train", *args, "--target", "llvm")


def one_line_error(r, code=1):
    """The command failed with ``code`` and said why in exactly one line, no traceback."""
    assert r.returncode == code, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    lines = [l for l in r.stderr.splitlines() if l.startswith("tvm-nimble:")]  # (progress and TVM warnings aside)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


def embedding_model(ids_shape):
    """ids -> Gather on an embedding table -> MatMul -> Add -> Reshape to [2, 4, OUT] (an int64 shape
    initializer). With 2-D ids [2, 4] the Gather's gradient is one TVM cannot lower; with 1-D ids [8]
    it trains."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((VOCAB, DIM)).astype("float32"), "table"),
             numpy_helper.from_array((rng.standard_normal((DIM, OUT)) * 0.5).astype("float32"), "w"),
             numpy_helper.from_array((rng.standard_normal(OUT) * 0.1).astype("float32"), "b"),
             numpy_helper.from_array(np.array([2, 4, OUT], np.int64), "shape")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=0),
             helper.make_node("MatMul", ["e", "w"], ["m"], name="proj"),
             helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
             helper.make_node("Reshape", ["a", "shape"], ["output"], name="rows")]
    graph = helper.make_graph(nodes, "embedding", [helper.make_tensor_value_info("ids", TensorProto.INT64, ids_shape)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 4, OUT])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    return (zoo.save(embedding_model([8]), str(d / "emb1d.onnx")),
            zoo.save(embedding_model([2, 4]), str(d / "emb2d.onnx")))


# -- 1. operators TVM's gradient cannot differentiate: named up front, in one line --------------------
def test_cli_train_names_the_gather_it_cannot_differentiate(model_files):
    line = one_line_error(cli(model_files[1], "--steps", "2"))
    assert "cannot train this model" in line and "Gather on indices that are not 1-D (node 'embed')" in line
    assert "1-D indices, then a Reshape" in line  # what to do


@pytest.mark.parametrize("model,named", [
    (lambda: zoo.bert(layers=1, seq=8, dim=16, ffn=16), ["Gather on indices that are not 1-D (node 'gather_0_node')",
                                                          "Erf (node 'erf_0_node')"]),
    (lambda: zoo.get_model("mobilenet", blocks=1), ["Clip (nodes 'clip_0_node', 'clip_1_node', 'clip_2_node')"]),
])
def test_untrainable_operators_are_named_by_onnx_type_and_node(model, named):
    with pytest.raises(ModelError) as err:
        training_step(model())
    message = str(err.value)
    assert "\n" not in message and all(n in message for n in named), message


def test_a_gather_on_1d_ids_and_a_reshape_train_to_numpys_gradient(model_files):
    """What the error advises trains: one SGD step on the 1-D model (its Reshape's int64 shape is an
    initializer, bound as a constant, not trained) matches numpy's gradient of the mean squared error,
    repeated ids accumulating into the same table row."""
    import onnx

    lr = 0.05
    trainer = build_training(model_files[0], "llvm", loss="mse", optimizer="sgd", lr=lr)
    assert sorted(trainer.params) == ["b", "table", "w"]
    w0 = {i.name: numpy_helper.to_array(i) for i in onnx.load(model_files[0]).graph.initializer}
    y = np.random.default_rng(1).standard_normal((2, 4, OUT)).astype("float32")
    loss = trainer.step(IDS, y)

    emb = w0["table"][IDS]
    r = (emb @ w0["w"] + w0["b"]).reshape(2, 4, OUT) - y
    d_pred = (2 * r / r.size).reshape(len(IDS), OUT)  # d mean(r^2) / d pred
    d_table = np.zeros_like(w0["table"])
    np.add.at(d_table, IDS, d_pred @ w0["w"].T)
    np.testing.assert_allclose(loss, np.mean(r ** 2), rtol=1e-5)
    expected = {"table": w0["table"] - lr * d_table, "w": w0["w"] - lr * emb.T @ d_pred,
                "b": w0["b"] - lr * d_pred.sum(0)}
    for k, v in trainer.params.items():
        np.testing.assert_allclose(v, expected[k], rtol=1e-5, atol=1e-6)


# -- 2. a learning rate that is not positive ------------------------------------------------------------
@pytest.mark.parametrize("lr", ["-5", "0"])
def test_cli_refuses_a_learning_rate_that_is_not_positive(model_files, lr):
    line = one_line_error(cli(model_files[0], "--lr", lr), code=2)
    assert "--lr must be a positive number" in line


@pytest.mark.parametrize("lr", [-5, 0, float("inf"), "fast"])
def test_the_api_refuses_a_learning_rate_that_is_not_positive(lr):
    with pytest.raises(NimbleError, match="learning rate must be a positive number"):
        training_step(embedding_model([8]), lr=lr)


# -- 3. a diverging loss --------------------------------------------------------------------------------
def test_a_diverging_loss_raises_training_diverged(model_files):
    trainer = build_training(model_files[0], "llvm", lr=1e4)
    y = np.zeros((2, 4, OUT), "float32")
    losses = []
    with pytest.raises(TrainingDivergedError, match=r"the training diverged; lower the learning rate \(lr=10000\)"):
        for _ in range(50):
            losses.append(trainer.step(IDS, y))
    assert 0 < len(losses) < 50 and np.all(np.isfinite(losses))  # stopped at the first loss that is not finite
    assert issubclass(TrainingDivergedError, NimbleError)


def test_cli_train_stops_at_a_diverging_loss(model_files):
    r = cli(model_files[0], "--steps", "50", "--lr", "1e4")
    line = one_line_error(r)
    assert re.search(r"the loss is (nan|inf) at step \d+: the training diverged", line), line
    assert "50/50" not in r.stderr  # it stopped there


# -- 4. the progress bar advances per step -----------------------------------------------------------
def test_cli_train_progress_advances_every_step(model_files, tmp_path):
    r = cli(model_files[0], "--steps", "3", "-o", str(tmp_path / "trained.onnx"))
    assert r.returncode == 0, r.stderr[-2000:]
    states = [s for s in re.split(r"[\r\n]", r.stderr) if s.startswith("training:")]
    for k in (1, 2, 3):  # each step drawn as it ends, with its loss (it showed 0/3 until the end)
        assert any(f" {k}/3 " in s and "loss" in s for s in states), states
    assert "wrote" in r.stdout


# -- 5. mse is the mean, as PyTorch's ----------------------------------------------------------------------
def test_mse_is_the_mean_as_pytorchs():
    """The first step's loss (before any update) on zoo:inception is torch.nn.functional.mse_loss of
    the model's output (onnx's reference evaluator), its default mean reduction."""
    from onnx.reference import ReferenceEvaluator

    model = zoo.get_model("inception", blocks=1)
    x = zoo.random_inputs(model, seed=3)["input"]
    y = np.random.default_rng(4).standard_normal((1, zoo.NUM_CLASSES)).astype("float32")
    loss = build_training(model, "llvm", loss="mse").step(x, y)
    out = ReferenceEvaluator(model).run(None, {"input": x})[0]
    try:
        import torch
        from torch.nn.functional import mse_loss

        expected = float(mse_loss(torch.from_numpy(out), torch.from_numpy(y)))
    except ImportError:
        expected = float(np.mean((out - y) ** 2))
    np.testing.assert_allclose(loss, expected, rtol=1e-4)
