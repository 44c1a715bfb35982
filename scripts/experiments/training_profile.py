"""Experiment: per-kernel GPU profile of a training step (issue #34): where a step's time goes, one stream
and the widest schedule, with the kernels ``--kernels`` chooses (the bench's ``--training`` build).

    bash scripts/gpu_session.sh "experiment training_profile 200 --models cifar_inception --batch 32 --kernels best"
    python3 scripts/experiments/training_profile.py --models cifar_inception --target llvm --out DIR   # CPU dry run

For each model: the step built as the bench builds it (``build_step``, same case, same learning rate), one
step run, then one replay profiled as a CUDA graph with an event pair around every launch (as
kernel_profile.py does for inference), the one-stream and multi-stream step latencies, and per kernel
family the count, total time and share of the one-stream step; the slowest launches. On llvm it only
builds and runs one step of each (no profile). Writes DIR/training_profile_<model>_b<batch>.json.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from kernel_profile import family, latency, profile  # beside this script in scripts/experiments/


def profile_step(label: str, batch: int, optimizer: str, kernels: str, target: str) -> dict:
    from tvm_nimble.bench.training import make_case
    from tvm_nimble.codegen.critical_path import critical_path, serial_sum
    from tvm_nimble.compiler.training import NimbleTrainer, build_step

    case = make_case(label, batch, steps=2, optimizer=optimizer, small=target == "llvm")
    out = {"model": label, "batch": batch, "optimizer": optimizer, "kernels": kernels}
    for name, streams in (("single", 1), ("multi", None)):
        module = build_step(case.step, {"kind": target}, max_streams=streams, kernels=kernels)
        plan = module.plan
        trainer = NimbleTrainer(module, case.step)
        loss = trainer.step(case.xs[0], case.ys[0])
        row = {"streams": plan.num_streams, "launches": len(plan.launches), "first_loss": loss}
        if target == "cuda":
            durations = profile(trainer.executor)
            row.update(latency_ms=latency(trainer.executor), durations_ms=durations,
                       kernels=[l.kernel for l in plan.launches], serial_sum_ms=serial_sum(durations),
                       critical_path_ms=critical_path(plan, durations)[0])
            if name == "single":
                fams: dict[str, list[float]] = {}
                for l, d in zip(plan.launches, durations):
                    fams.setdefault(family(l.kernel), []).append(d)
                total = sum(durations)
                out["families"] = sorted(([k, len(v), float(sum(v)), float(sum(v)) / total] for k, v in fams.items()),
                                         key=lambda r: -r[2])
                out["slowest"] = sorted(([l.kernel, d] for l, d in zip(plan.launches, durations)),
                                        key=lambda r: -r[1])[:20]
        out[name] = row
        trainer.executor.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cifar_inception")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--optimizer", default="momentum")
    ap.add_argument("--kernels", default="best", choices=["tvm", "vendor", "best"])
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    ap.add_argument("--out", default="out/training_profile")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for label in args.models.split(","):
        r = profile_step(label, args.batch, args.optimizer, args.kernels, args.target)
        with open(os.path.join(args.out, f"training_profile_{label}_b{args.batch}.json"), "w") as f:
            json.dump(r, f, indent=1)
        s, m = r["single"], r["multi"]
        if "latency_ms" not in s:
            print(f"{label} batch {args.batch}: built and ran one step ({s['launches']} launches; "
                  f"{m['streams']} streams), loss {s['first_loss']:.4g} / {m['first_loss']:.4g}")
            continue
        print(f"\n{label} batch {args.batch} {args.optimizer} ({args.kernels}): 1-stream {s['latency_ms']:.3f} ms, "
              f"{m['streams']}-stream {m['latency_ms']:.3f} ms; serial sum {s['serial_sum_ms']:.3f}, "
              f"critical path {s['critical_path_ms']:.3f}")
        for fam, n, ms, share in r["families"][:15]:
            print(f"  {fam:50s} {n:4d} {ms:8.3f} ms {100 * share:5.1f}%")
        print("  slowest:", ", ".join(f"{k} {d * 1e3:.0f} us" for k, d in r["slowest"][:10]))


if __name__ == "__main__":
    main()
