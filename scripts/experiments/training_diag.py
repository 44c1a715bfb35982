"""Experiment (diagnosis): one training step of a training-benchmark model on every GPU system against
the CPU build: which outputs (loss, new parameters, optimizer state) differ, and on which systems.

Findings: it found the wrong CUDA training step at batch 1 (DLight's Fallback folded the momentum update into
a weight gradient's reduction twice; fixed in relay_passes/tvm_compat.py, commit 14eba05). Raw outputs: that
run's log was not kept; the training check after the fix (benchmarks/findings.md, 'Training steps') is
benchmarks/raw/2026-11-24-h100-s7/training_losses.json (and benchmarks/training.csv).

    bash scripts/gpu_session.sh "experiment training_diag 200 --model cifar_inception --batch 1 --steps 5"
    python3 scripts/experiments/training_diag.py --model cifar_inception --batch 1 --small --target llvm

Prints one line per system (worst relative error over the outputs) and the worst outputs by name;
with --out DIR also writes them to DIR/training_diag.json.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cifar_inception")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    ap.add_argument("--random-state", action="store_true",
                    help="the single step starts from random optimizer state (momenta) instead of zeros")
    ap.add_argument("--steps", type=int, default=1, help="also train this many steps: carried vs fed back, per mode")
    ap.add_argument("--out", help="folder for training_diag.json (default: print only)")
    args = ap.parse_args(argv)
    import tvm

    from tvm_nimble.bench.training import make_case, step_inputs
    from tvm_nimble.compiler.build import build
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm
    from tvm_nimble.compiler.target import resolve_target
    from tvm_nimble.runtime.loading import NimbleExecutor

    case = make_case(args.model, args.batch, steps=max(args.steps, 1), small=args.small)
    inputs = step_inputs(case)
    if args.random_state:
        rng = np.random.default_rng(1)
        k = len(inputs) - len(case.step.state)
        inputs[k:] = [rng.standard_normal(s.shape).astype(s.dtype) if s.dtype.kind == "f" else s for s in inputs[k:]]
    names = ["loss"] + [f"param {n}" for n in case.step.params] + [f"state {i}" for i in range(len(case.step.state))]
    cpu = build(case.step.mod, "llvm")
    with NimbleExecutor(cpu) as ex:
        reference = [o.numpy() for o in ex(*inputs)]
    target = resolve_target(args.target)
    dev = tvm.cuda(0) if args.target == "cuda" else tvm.cpu(0)
    systems = {"stock-vm": StockVM(build_stock_vm(case.step.mod, target), dev, inputs).outputs}
    gpu = build(case.step.mod, target, max_streams=None, kernels="tvm")
    modes = ("single-stream", "streams", "cuda-graph") if args.target == "cuda" else ("sequential",)
    for mode in modes:
        def run(mode=mode):
            with NimbleExecutor(gpu, dev, mode=mode) as ex:
                return [o.numpy() for o in ex(*inputs)]
        systems[f"nimble {mode}"] = run
    record = {"model": args.model, "batch": args.batch, "target": args.target, "systems": {}}
    for name, fn in systems.items():
        outs = fn()
        # worst element against the tensor's scale: a gradient routed to another element shows here, not in L2
        errs = [float(np.max(np.abs(o - r)) / max(float(np.max(np.abs(r))), 1e-12)) for o, r in zip(outs, reference)]
        worst = sorted(range(len(errs)), key=lambda i: -errs[i])[:4]
        record["systems"][name] = {"worst_element_err": max(errs), "worst": {names[i]: errs[i] for i in worst}}
        print(f"diag {name:22s} worst element err {max(errs):.2e}: " +
              ", ".join(f"{names[i]} {errs[i]:.1e}" for i in worst), flush=True)
    if args.steps > 1:
        record["losses"] = _steps(case, cpu, gpu, dev, modes)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "training_diag.json"), "w") as f:
            json.dump(record, f, indent=1)


def _steps(case, cpu, gpu, dev, modes) -> dict:
    """Losses of ``case.steps`` steps: the CPU trainer, and per GPU mode the trainer (state carried in
    place) and an executor whose outputs are copied back to its inputs through the host."""
    import numpy as np

    from tvm_nimble.bench.training import nimble_losses
    from tvm_nimble.compiler.training import NimbleTrainer
    from tvm_nimble.runtime.loading import NimbleExecutor

    reference = nimble_losses(NimbleTrainer(cpu, case.step), case)
    print(f"diag cpu trainer losses {np.round(reference, 5).tolist()}")
    losses = {"cpu trainer": [float(v) for v in reference]}
    n_p = len(case.step.params)
    for mode in modes:
        carried = nimble_losses(NimbleTrainer(gpu, case.step, dev, mode=mode), case)
        fed = []
        params, state = list(case.step.params.values()), list(case.step.state)
        with NimbleExecutor(gpu, dev, mode=mode) as ex:
            for x, y in zip(case.xs, case.ys):
                outs = [o.numpy() for o in ex(x, *params, y, *state)]
                fed.append(float(outs[0]))
                params, state = outs[1:1 + n_p], outs[1 + n_p:]
        print(f"diag {mode:14s} carried {np.round(carried, 5).tolist()}")
        print(f"diag {mode:14s} fed     {np.round(fed, 5).tolist()}", flush=True)
        losses[f"{mode} carried"], losses[f"{mode} fed"] = [float(v) for v in carried], fed
    return losses


if __name__ == "__main__":
    main()
