"""Adam and AdamW (tvm_nimble.compiler.optimizers): the update function against a NumPy Adam for five steps,
and whole training steps against PyTorch's torch.optim on the same model, data and initial weights."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_nimble.bench.training import make_case, max_rel_diff, nimble_losses, torch_losses
from tvm_nimble.compiler.build import build
from tvm_nimble.compiler.optimizers import make_optimizer
from tvm_nimble.compiler.training import NimbleTrainer, training_step
from tvm_nimble.errors import NimbleError
from tvm_nimble import zoo

STEPS = 5
SHAPES = [(3, 4), (5,)]


def numpy_adam(params, grads_per_step, lr, wd, decoupled, b1=0.9, b2=0.999, eps=1e-8):
    """Adam as the paper writes it (Kingma & Ba, Algorithm 1), in float64, with L2 (Adam) or decoupled
    (AdamW, Loshchilov & Hutter) weight decay."""
    params = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            g = g.astype(np.float64)
            if decoupled:
                params[i] = params[i] - lr * wd * params[i]
            else:
                g = g + wd * params[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat, v_hat = m[i] / (1 - b1 ** t), v[i] / (1 - b2 ** t)
            params[i] = params[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return params


@pytest.mark.parametrize("name,wd", [("adam", 0.0), ("adam", 0.1), ("adamw", 0.1), ("adamw", None)])
def test_the_update_matches_numpy_adam_for_five_steps(name, wd):
    rng = np.random.default_rng(0)
    lr = 0.01
    params = [rng.standard_normal(s).astype("float32") for s in SHAPES]
    grads = [[rng.standard_normal(s).astype("float32") for s in SHAPES] for _ in range(STEPS)]
    opt = make_optimizer(name, lr, wd).init([relax.Var(f"w{i}", relax.TensorType(s, "float32"))
                                            for i, s in enumerate(SHAPES)])
    vm = relax.VirtualMachine(tvm.compile(tvm.IRModule({"main": opt.get_function().with_attr("global_symbol", "main")}), "llvm"), tvm.cpu())
    state = opt.state
    current = [tvm.runtime.tensor(p) for p in params]
    for g in grads:
        current, state = vm["main"](current, [tvm.runtime.tensor(x) for x in g], state)
    expected = numpy_adam(params, grads, lr, 0.01 if wd is None else wd, decoupled=name == "adamw")
    for got, want in zip(current, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert int(state[0].numpy()) == STEPS
    moved = max(float(np.abs(c.numpy() - p).max()) for c, p in zip(current, params))
    assert moved > 4 * lr  # five steps of about lr each: the update did move the weights


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "momentum"])
def test_training_steps_match_pytorchs_optimizer(optimizer):
    """Twelve steps of cross-entropy training on the zoo's CIFAR-sized Inception-style net: the losses
    and the final weights against PyTorch's torch.optim with the same initial weights and data."""
    pytest.importorskip("torch")
    case = make_case("cifar_inception", batch=2, steps=12, optimizer=optimizer, lr=1e-3, small=True,
                     weight_decay=0.05)
    module = build(case.step.mod, "llvm", max_streams=None, kernels="tvm")
    trainer = NimbleTrainer(module, case.step)
    losses = nimble_losses(trainer, case)
    reference = torch_losses(case, "cpu")
    assert max_rel_diff(losses, reference) < 1e-4
    assert len(set(np.round(losses, 5))) > 8  # the steps moved the weights


def test_pytorchs_float64_losses_are_the_reference_both_fp32_trainings_approach():
    """The float64 trajectory the bench's loss check falls back to for Adam: PyTorch's fp32 and Nimble's fp32
    losses each lie near it, and it is a float64 run (not the fp32 one again)."""
    pytest.importorskip("torch")
    case = make_case("cifar_inception", batch=2, steps=8, optimizer="adam", lr=1e-3, small=True)
    exact = torch_losses(case, "cpu", float64=True)
    fp32 = torch_losses(case, "cpu")
    ours = nimble_losses(NimbleTrainer(build(case.step.mod, "llvm", max_streams=None, kernels="tvm"), case.step), case)
    assert 0 < max_rel_diff(fp32, exact) < 1e-4
    assert max_rel_diff(ours, exact) < 1e-4
    assert len(set(np.round(exact, 5))) > 5  # the steps moved the weights


def test_sgd_weight_decay_is_pytorchs():
    pytest.importorskip("torch")
    case = make_case("cifar_inception", batch=2, steps=8, optimizer="sgd", lr=1e-2, small=True, weight_decay=0.5)
    no_decay = make_case("cifar_inception", batch=2, steps=8, optimizer="sgd", lr=1e-2, small=True, weight_decay=0.0)
    trainers = [NimbleTrainer(build(c.step.mod, "llvm", max_streams=None, kernels="tvm"), c.step)
                for c in (case, no_decay)]
    losses = [nimble_losses(t, c) for t, c in zip(trainers, (case, no_decay))]
    assert max_rel_diff(losses[0], torch_losses(case, "cpu")) < 1e-4
    assert max_rel_diff(losses[0], losses[1]) > 1e-4  # the decay changed the training


@pytest.mark.parametrize("wd", [-0.1, float("nan"), "heavy"])
def test_a_bad_weight_decay_is_one_clear_error(wd):
    with pytest.raises(NimbleError, match="weight decay must be a number >= 0"):
        training_step(zoo.get_model("inception"), "mse", "adamw", lr=0.01, weight_decay=wd)


def test_cli_train_takes_adamw_and_refuses_a_negative_weight_decay():
    from cli_runner import run_cli

    cmd = ["train", "zoo:inception", "--steps", "2", "--optimizer", "adamw"]
    ok = run_cli(*cmd, "--weight-decay", "0.05")
    assert ok.returncode == 0, ok.stderr[-800:]
    bad = run_cli(*cmd, "--weight-decay", "-1")
    assert bad.returncode == 2 and "--weight-decay must be a number >= 0" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_bf16_training_keeps_float32_master_weights_and_tracks_fp32():
    """bf16: the convolutions and the GEMM compute in bfloat16 (the IR says so), the weights, their updates and the
    optimizer state stay float32, and five AdamW steps stay within bfloat16's error of the fp32 steps."""
    from tvm import relax as rx

    model = zoo.get_model("inception")
    steps = {p: training_step(model, "mse", "adamw", lr=0.01, precision=p) for p in ("fp32", "bf16")}
    convs = [b.value for blk in steps["bf16"].mod["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, rx.Call) and getattr(b.value.op, "name", "") in ("relax.nn.conv2d",
                                                                                    "relax.nn.conv2d_transpose")]
    assert convs and all(str(c.args[0].ty.dtype) == "bfloat16" for c in convs)
    assert all(str(w.dtype) == "float32" for w in steps["bf16"].params.values())
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 3, 16, 16)).astype("float32") for _ in range(STEPS)]
    ys = [rng.standard_normal((1, 10)).astype("float32") for _ in range(STEPS)]
    losses, params = {}, {}
    for p, step in steps.items():
        trainer = NimbleTrainer(build(step.mod, "llvm", max_streams=None), step)
        losses[p] = np.array([trainer.step(x, y) for x, y in zip(xs, ys)])
        params[p] = trainer.params
    assert all(v.dtype == np.float32 for v in params["bf16"].values())
    rel = np.abs(losses["bf16"] - losses["fp32"]) / np.abs(losses["fp32"])
    assert rel.max() < 5e-2 and rel.max() > 1e-6  # bfloat16's error, and not fp32 under another name
    moved = [np.abs(params["bf16"][k] - steps["bf16"].params[k]).max() for k in params["bf16"]]
    assert min(moved) > 0  # every weight was updated in float32 (a bf16 round trip would lose small steps)


def test_fp16_training_is_refused_with_the_reason():
    with pytest.raises(NimbleError, match="fp16 training needs loss scaling.*use bf16"):
        training_step(zoo.get_model("inception"), "mse", "adam", lr=0.01, precision="fp16")
    with pytest.raises(NimbleError, match="precision must be one of fp32, tf32, bf16"):
        training_step(zoo.get_model("inception"), "mse", "adam", lr=0.01, precision="int8")
