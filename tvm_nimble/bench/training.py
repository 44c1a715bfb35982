"""Training steps side by side: Nimble's multi-stream and single-stream graphs, stock TVM's VM (and
its CUDA graph), PyTorch eager and PyTorch's CUDA graph. One model, one optimizer, one data set.

Every system trains the same zoo network from the same initial weights (PyTorch's copy is read
from the ONNX graph, :mod:`tvm_nimble.bench.torch_onnx`). Before any timing, the first ``steps``
losses of Nimble and of PyTorch are compared on the same batches: the training is checked, not
only the speed. A step is timed from launch to synchronize with the batch already on the device;
every system runs the same kernels of its own kind (TVM's for the TVM/Nimble rows, cuDNN/cuBLAS
for PyTorch), fp32 with TF32 off.
"""
from __future__ import annotations

import datetime
import itertools
import os
from dataclasses import dataclass

import numpy as np

from .report import append_rows
from .system import System

#: name -> (zoo builder, keyword arguments): a CIFAR-10-sized multi-branch net and a ResNet-18-style
#: chain (a stem and 8 basic blocks: 17 convolutions and the classifier), 32x32 RGB in, 10 classes out
TRAINING_MODELS = {
    "cifar_inception": ("inception", {"blocks": 3, "hw": 32, "channels": 64}),
    "resnet18_chain": ("resnet", {"blocks": 8, "hw": 32, "channels": 64}),
}
CSV_COLUMNS = ["date", "device", "model", "batch", "dtype", "system", "median_ms", "p90_ms", "kernels", "optimizer",
               "loss_max_rel_diff", "versions"]
#: Nimble and PyTorch losses must agree this closely over the first steps (fp32, TF32 off; kernels and
#: reduction orders differ, and each step feeds the next)
LOSS_RTOL = 1e-3
#: the same for bf16 steps, against PyTorch under autocast(bfloat16): two different roundings of every convolution
LOSS_RTOL_BF16 = 5e-2
#: an fp32 step further than LOSS_RTOL from PyTorch's still passes when its distance from PyTorch's float64
#: losses is at most this many times PyTorch's own fp32 distance from them: Adam divides each gradient by its
#: running RMS, so rounding noise in near-zero gradients becomes whole-size updates, in PyTorch's fp32 as in ours
FP64_SLACK = 2.0


@dataclass
class TrainingCase:
    """One model at one batch: its composed step and the batches every system trains on."""

    label: str
    onnx_model: object
    step: object  # tvm_nimble.compiler.training.TrainingStep
    xs: list  # one input array per step
    ys: list  # one label array per step
    loss: str
    optimizer: str
    lr: float
    weight_decay: float | None = None  # None: PyTorch's default for the optimizer
    precision: str = "fp32"  # fp32 or bf16 (PyTorch's peers under autocast(bfloat16))


def make_case(label: str, batch: int, steps: int, loss: str = "cross_entropy", optimizer: str = "momentum",
              lr: float | None = None, small: bool = False, seed: int = 0,
              weight_decay: float | None = None, precision: str = "fp32") -> TrainingCase:
    """``lr`` defaults to 1e-3 / batch: cross-entropy is a sum over the batch, so that is a mean's 1e-3."""
    from tvm_nimble import zoo
    from tvm_nimble.compiler.training import training_step

    builder, kw = TRAINING_MODELS[label]
    model = zoo.get_model(builder, batch=batch, **({} if small else kw))
    lr = 1e-3 / batch if lr is None else lr
    step = training_step(model, loss, optimizer, lr, weight_decay=weight_decay, precision=precision)
    shape = tuple(zoo.input_shape(model).values())[0]
    rng = np.random.default_rng(seed)
    (label_shape, label_dtype), = step.labels
    xs = [rng.standard_normal(shape).astype("float32") for _ in range(steps)]
    if label_dtype == "int64":
        ys = [rng.integers(0, zoo.NUM_CLASSES, size=label_shape).astype("int64") for _ in range(steps)]
    else:
        ys = [rng.standard_normal(label_shape).astype(label_dtype) for _ in range(steps)]
    return TrainingCase(label, model, step, xs, ys, loss, optimizer, lr, weight_decay, step.precision)


# ---- PyTorch -------------------------------------------------------------------------------------
def _torch_loss(name: str):
    import torch.nn.functional as F

    if name == "cross_entropy":  # Nimble's cross_entropy is the sum over the batch, its mse the mean
        return lambda out, y: F.cross_entropy(out, y, reduction="sum")
    return lambda out, y: F.mse_loss(out, y, reduction="mean")


def torch_trainer(case: TrainingCase, device: str):
    """(module, optimizer, loss function) of PyTorch training the case's model from its initial weights."""
    import torch

    from .torch_onnx import torch_module

    module = torch_module(case.onnx_model, trainable=case.step.params).to(device)
    return module, torch_optimizer(case, module.parameters(), capturable=device == "cuda"), _torch_loss(case.loss)


def torch_optimizer(case: TrainingCase, params, capturable: bool = False):
    """PyTorch's optimizer of the case's name, learning rate and weight decay (``capturable``: Adam's step
    count on the device, so that a CUDA graph can capture its update)."""
    import torch

    from tvm_nimble.compiler.optimizers import DEFAULT_WEIGHT_DECAY

    wd = DEFAULT_WEIGHT_DECAY[case.optimizer] if case.weight_decay is None else case.weight_decay
    if case.optimizer in ("sgd", "momentum"):
        return torch.optim.SGD(params, lr=case.lr, momentum=0.9 if case.optimizer == "momentum" else 0.0,
                               weight_decay=wd)
    adam = torch.optim.AdamW if case.optimizer == "adamw" else torch.optim.Adam
    return adam(params, lr=case.lr, weight_decay=wd, capturable=capturable)


def torch_losses(case: TrainingCase, device: str, float64: bool = False) -> list[float]:
    """The loss of each of the case's steps, trained eagerly in PyTorch (``float64``: weights, data, gradients
    and optimizer state in float64, the reference both fp32 trainings are measured against)."""
    import torch

    module, opt, loss_fn = torch_trainer(case, device)
    if float64:  # before the first step: the optimizer's state is created from the parameters' dtype
        module.double()
    losses = []
    for x, y in zip(case.xs, case.ys):
        opt.zero_grad(set_to_none=True)
        xt = torch.from_numpy(x).to(device)
        with torch_precision(case, device):
            out = module(xt.double() if float64 else xt)
        loss = loss_fn(out if float64 else out.float(), torch.from_numpy(y).to(device))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().cpu()))
    return losses


def torch_precision(case: TrainingCase, device: str):
    """PyTorch's counterpart of the case's precision: autocast(bfloat16) for bf16, nothing for fp32."""
    import contextlib

    import torch

    if case.precision == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16, cache_enabled=False)  # (CUDA-graph safe)
    return contextlib.nullcontext()


def torch_step_systems(case: TrainingCase) -> list[System]:
    """PyTorch eager and PyTorch CUDA-graph training steps (whole step captured: forward, backward, SGD)."""
    import torch

    dev = "cuda"
    x, y = torch.from_numpy(case.xs[0]).to(dev), torch.from_numpy(case.ys[0]).to(dev)
    module, opt, loss_fn = torch_trainer(case, dev)

    def forward(m):
        with torch_precision(case, dev):
            return m(x).float()

    def eager():
        opt.zero_grad(set_to_none=True)
        loss_fn(forward(module), y).backward()
        opt.step()

    gmod, gopt, gloss = torch_trainer(case, dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream (PyTorch's whole-network recipe)
        for _ in range(3):
            gopt.zero_grad(set_to_none=True)
            gloss(forward(gmod), y).backward()
            gopt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    gopt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        gloss(forward(gmod), y).backward()
        gopt.step()
    sync = torch.cuda.synchronize
    return [System("pytorch-eager", eager, sync, lambda: []), System("pytorch-cudagraph", graph.replay, sync, lambda: [])]


# ---- TVM and Nimble ------------------------------------------------------------------------------
def step_inputs(case: TrainingCase, i: int = 0) -> list[np.ndarray]:
    """The step function's inputs in order: data, parameters, label, optimizer state."""
    s = case.step
    return [case.xs[i], *s.params.values(), case.ys[i], *s.state]


def nimble_losses(trainer, case: TrainingCase) -> list[float]:
    return [trainer.step(x, y) for x, y in zip(case.xs, case.ys)]


def nimble_step_systems(module, case: TrainingCase, device, modes: tuple[str, ...]) -> list[System]:
    """One NimbleTrainer per executor mode on the same build, each a ``System`` whose run is one step."""
    from tvm_nimble.compiler.training import NimbleTrainer

    from .report import NIMBLE_SYSTEMS

    systems = []
    for mode in modes:
        trainer = NimbleTrainer(module, case.step, device, mode=mode)
        x, y = case.xs[0], case.ys[0]
        trainer.step(x, y)  # the batch is in the device buffers; later runs reuse it, like PyTorch's graph
        systems.append(System(NIMBLE_SYSTEMS[mode], trainer.executor.run, trainer.executor.sync, lambda: []))
    return systems


def stock_step_systems(case: TrainingCase, target, device, use_gpu: bool) -> list[System]:
    """Stock TVM's VM on the same step module (and its CUDA graph on a GPU), parameters passed each call."""
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm

    inputs = step_inputs(case)
    systems = []
    for name, graph in [("tvm-vm", False)] + ([("tvm-vm-cudagraph", True)] if use_gpu else []):
        try:
            vm = StockVM(build_stock_vm(case.step.mod, target, cuda_graph=graph), device, inputs)
            vm()
        except Exception as err:  # noqa: BLE001  (TVM's graph rewriting may not capture a step: no row then)
            if not graph:
                raise
            print(f"[train] note: no {name} row, stock TVM could not capture the step: {str(err).splitlines()[0]}")
            continue
        systems.append(System(name, vm, vm.sync, vm.outputs))
    return systems


def max_rel_diff(a: list[float], b: list[float]) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def run_case(case: TrainingCase, target, device, use_gpu: bool, device_name: str, rounds: int = 5,
             iters: int = 20, torch_device: str | None = None, log=print,
             kernels: str = "tvm") -> tuple[list[dict], dict]:
    """Check the case's losses against PyTorch, then time every system. Returns (csv rows, loss record)."""
    from tvm_nimble.compiler.training import NimbleTrainer, build_step
    from tvm_nimble.errors import NimbleError

    from .harness import interleaved_timing
    from .machine import describe

    batch = int(case.xs[0].shape[0])
    module = build_step(case.step, target, max_streams=None, kernels=kernels)
    plan = module.plan
    log(f"[train] {case.label} batch {batch} {case.optimizer}: {len(plan.launches)} kernels on {plan.num_streams} streams")
    losses = nimble_losses(NimbleTrainer(module, case.step, device), case)
    record = {"model": case.label, "batch": batch, "optimizer": case.optimizer, "nimble": losses}
    diff = ""
    if torch_device is not None:
        record["pytorch"] = reference = torch_losses(case, torch_device)
        diff = max_rel_diff(losses, reference)
        record["max_rel_diff"] = diff
        log(f"[train] {case.label} batch {batch}: {len(losses)} losses, Nimble vs PyTorch max rel diff {diff:.2e} "
            f"(first {losses[0]:.4g} / {reference[0]:.4g}, last {losses[-1]:.4g} / {reference[-1]:.4g})")
        rtol = LOSS_RTOL_BF16 if case.precision == "bf16" else LOSS_RTOL
        why = f"Nimble's losses differ from PyTorch's by {diff:.2e} (> {rtol})"
        ok = diff <= rtol
        if not ok and case.precision != "bf16":
            exact = torch_losses(case, torch_device, float64=True)
            ours, theirs = max_rel_diff(losses, exact), max_rel_diff(reference, exact)
            record["pytorch_fp64"], record["vs_fp64"] = exact, {"nimble": ours, "pytorch": theirs}
            ok = ours <= max(rtol, FP64_SLACK * theirs)
            log(f"[train] {case.label} batch {batch}: against PyTorch's float64 losses, Nimble {ours:.2e}, PyTorch "
                f"fp32 {theirs:.2e}: {'within' if ok else 'beyond'} {FP64_SLACK:g}x PyTorch's own")
            why += f", and {ours:.2e} from PyTorch's float64 losses (PyTorch fp32: {theirs:.2e})"
        if not ok:
            raise NimbleError(f"{case.label} batch {batch}: {why}; not timing a step that trains differently")
    if not np.all(np.isfinite(losses)):
        raise NimbleError(f"{case.label} batch {batch}: the training diverged (loss {losses[-1]}); lower the lr")
    if len(set(np.round(losses, 6))) < 2:
        raise NimbleError(f"{case.label}: every step gave the same loss; the training check proves nothing")
    modes = ("cuda-graph", "single-stream") if use_gpu else ("sequential",)
    systems = nimble_step_systems(module, case, device, modes) + stock_step_systems(case, target, device, use_gpu)
    if use_gpu and torch_device is not None:
        systems += torch_step_systems(case)
    times = interleaved_timing(systems, rounds=rounds, iters=iters)
    machine = describe(device_name, use_gpu)
    versions = ";".join(f"{k}={machine[k]}" for k in ("tvm", "torch") if k in machine)
    rows = [{"date": datetime.date.today().isoformat(), "device": device_name, "model": case.label, "batch": batch,
             "dtype": "bfloat16" if case.precision == "bf16" else "float32", "system": name,
             "median_ms": f"{med:.4f}", "p90_ms": f"{p90:.4f}",
             "kernels": "pytorch" if name.startswith("pytorch") else
             "tvm-default" if name.startswith("tvm") or kernels == "tvm" else kernels, "optimizer":
             f"{case.optimizer} lr={case.lr:.3g}", "loss_max_rel_diff": f"{diff:.2e}" if diff != "" else "",
             "versions": versions} for name, (med, p90) in times.items()]
    return rows, record


def _torch_device(use_gpu: bool) -> str | None:
    """Where PyTorch's reference losses are computed, or None without PyTorch (no PyTorch rows then)."""
    try:
        import torch
    except ImportError:
        return None
    if use_gpu:
        from .harness import torch_tf32_off

        torch_tf32_off()
        return "cuda"
    return "cpu"


def run_training_benchmark(models: list[str], batches: list[int], target=None, steps: int = 20, rounds: int = 5,
                           iters: int = 20, out_dir: str = "bench-results", small: bool = False,
                           optimizers: tuple[str, ...] = ("momentum",), kernels: str = "tvm",
                           precisions: tuple[str, ...] = ("fp32",)) -> list[dict]:
    """Every model x batch x optimizer of :data:`TRAINING_MODELS`: check, time, append to
    ``out_dir/training.csv``; the loss trajectories go to ``out_dir/training_losses.json``."""
    import json

    import tvm

    from tvm_nimble.compiler.target import default_kind, resolve_target
    from tvm_nimble.errors import NimbleError

    from .harness import device_name

    unknown = [m for m in models if m not in TRAINING_MODELS]
    if unknown:
        raise NimbleError(f"unknown training model(s) {unknown}: choose from {', '.join(TRAINING_MODELS)}")
    t = resolve_target(target if target is not None else default_kind())
    use_gpu = t.kind.name == "cuda"
    dev = tvm.cuda(0) if use_gpu else tvm.cpu(0)
    torch_device = _torch_device(use_gpu)
    if torch_device is None:
        print("[train] note: PyTorch is not installed: no PyTorch rows and no loss check against it", flush=True)
    rows, records, failed = [], [], []
    for label, batch, optimizer, precision in itertools.product(models, batches, optimizers, precisions):
        case = make_case(label, batch, steps, optimizer=optimizer, small=small, precision=precision)
        try:
            r, record = run_case(case, t, dev, use_gpu, device_name(use_gpu), rounds, iters, torch_device,
                                 log=lambda m: print(m, flush=True), kernels=kernels)
        except NimbleError as err:  # this case is not timed; the others still are, and the run fails at the end
            print(f"[train] {err}", flush=True)
            failed.append(str(err))
            continue
        append_rows(os.path.join(out_dir, "training.csv"), r, CSV_COLUMNS, defaults={})
        rows += r
        records.append(record)
    path = os.path.join(out_dir, "training_losses.json")
    old = json.load(open(path)) if os.path.exists(path) else []
    with open(path, "w") as f:
        json.dump(old + [{"date": datetime.date.today().isoformat(), **rec} for rec in records], f, indent=1)
    if failed:
        raise NimbleError(f"{len(failed)} training case(s) not timed (their rows are missing): {failed[0]}"
                          + (f" (and {len(failed) - 1} more above)" if len(failed) > 1 else ""))
    return rows
