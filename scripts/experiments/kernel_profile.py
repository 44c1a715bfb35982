"""Experiment: per-kernel GPU profile of a torchvision/timm model built with Nimble: where the time goes,
and how far the multi-stream replay is from the critical-path bound.

Findings: benchmarks/findings.md, 'What made inception_v3 fast' (hence pools on cuDNN) and
'Critical-path bound'. Raw outputs: benchmarks/raw/2026-11-23-h100-s5/profile_inception_v3_b{1,8}.json,
benchmarks/raw/2026-11-23-h100-s6/profile_*_b1.json and profiles_with_plans.tar.xz (the input of
calibrate_schedule_sim.py).

    bash scripts/gpu_session.sh "experiment kernel_profile 200 --models tv:inception_v3,tv:googlenet --kernels best"

For each model: builds the one-stream and the multi-stream plans (same kernels), profiles one replay
of each as a CUDA graph with an event pair around every launch (``NimbleExecutor.profile``), and
reports per kernel family the count, total time and share of the one-stream run, the slowest
launches, the serial sum and the critical-path bound (the longest path through the data
dependencies, weighted with the one-stream durations), and what the gap between the multi-stream
latency and that bound is made of: the same path weighted with the durations the kernels had while
running concurrently (their slowdown), and the rest (event waits, launch gaps, the graph launch).
The event brackets add a little time per launch, so the bound is slightly pessimistic. Writes DIR/profile_<model>_b<batch>.json, prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time

import numpy as np

from tvm_nimble.codegen.critical_path import critical_path, serial_sum
from tvm_nimble.contract.vendor_abi import VENDOR_PREFIXES


def family(kernel: str) -> str:
    if kernel.startswith(VENDOR_PREFIXES):
        return kernel
    return "tvm:" + re.sub(r"\d+$", "", kernel)


def profile(ex, reps: int = 5) -> list[float]:
    runs = [ex.profile(graph=True) for _ in range(reps)]
    return [float(np.median([r[i][4] - r[i][3] for r in runs])) for i in range(len(runs[0]))]


def cupti_kernels(ex, reps: int = 10) -> list:
    """[kernel name, microseconds] of every GPU kernel of one replay in launch order, as CUPTI records them
    (torch.profiler; the median of ``reps`` replays): no event brackets, the names the GPU ran."""
    from gpu_args import cuda_events  # beside this script in scripts/experiments/

    def replay():
        ex.run()
        ex.sync()

    events = cuda_events(replay, reps)
    if not events or len(events) % reps:
        return [[e.name, e.time_range.elapsed_us()] for e in events]
    n = len(events) // reps
    return [[events[i].name, float(np.median([events[r * n + i].time_range.elapsed_us() for r in range(reps)]))]
            for i in range(n)]


def latency(ex, iters: int = 200) -> float:
    for _ in range(20):
        ex.run()
    ex.sync()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        ex.run()
        ex.sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(samples))


def profile_model(spec: str, kernels: str, batch: int, precision: str = "fp32", merge: str = "off") -> dict:
    from tvm_nimble.cli.bench import model_builders
    from tvm_nimble.compiler.build import build
    from tvm_nimble.runtime.loading import NimbleExecutor

    if spec.startswith("hf:"):
        from tvm_nimble.bench.hf_models import hf_builders

        name, onnx_builder, _ = hf_builders(spec)
    else:
        name, onnx_builder, _ = model_builders(spec)
    model = onnx_builder(batch=batch)
    from tvm_nimble.runtime.timing import random_inputs

    out = {"model": name, "batch": batch, "kernels": kernels, "precision": precision, "merge": merge}
    for label, streams in (("single", 1), ("multi", None)):
        result = build(model, {"kind": "cuda"}, max_streams=streams, kernels=kernels, precision=precision,
                       merge=merge)
        plan = result.plan
        ex = NimbleExecutor(result, mode="cuda-graph")
        for i, x in enumerate(random_inputs(plan, 0)):
            ex.set_input(i, x)
        ex.run()
        ex.sync()
        durations = profile(ex)
        kernels_cupti = cupti_kernels(ex)
        out[label] = {"latency_ms": latency(ex), "streams": plan.num_streams, "launches": len(plan.launches),
                      "durations_ms": durations, "kernels": [l.kernel for l in plan.launches],
                      "plan": plan.to_dict(), "cupti": kernels_cupti}
        if label == "multi":  # the same bound with the durations kernels had while running concurrently
            out[label]["critical_path_ms"] = critical_path(plan, durations)[0]
            out[label]["serial_sum_ms"] = serial_sum(durations)
        if label == "single":
            choice = result.report.kernel_choice.to_dict()  # as an artifact keeps it (JSON)
            out["kernel_choice"] = choice.get("kernel_choice", [])
            out["kernel_choice_check"] = choice.get("kernel_choice_check")
            cp, path = critical_path(plan, durations)
            fams: dict[str, list[float]] = {}
            for l, d in zip(plan.launches, durations):
                fams.setdefault(family(l.kernel), []).append(d)
            serial = serial_sum(durations)
            out["serial_sum_ms"], out["critical_path_ms"] = serial, cp
            out["critical_path_kernels"] = [plan.launches[p].kernel for p in path]
            out["families"] = sorted(([k, len(v), float(sum(v)), float(sum(v)) / serial] for k, v in fams.items()),
                                     key=lambda r: -r[2])
            out["slowest"] = sorted(([l.kernel, d] for l, d in zip(plan.launches, durations)), key=lambda r: -r[1])[:15]
        ex.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tv:inception_v3")
    ap.add_argument("--kernels", default="vendor", choices=["tvm", "vendor", "best"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--merge", default="off", choices=["off", "on", "auto"],
                    help="sibling GEMMs merged (build's merge)")
    ap.add_argument("--out", default="out/profile")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = []
    for spec in args.models.split(","):
        name = spec.split(":", 1)[-1]
        try:
            r = profile_model(spec if ":" in spec else f"tv:{spec}", args.kernels, args.batch, args.precision,
                              args.merge)
        except Exception as err:  # one line per model, then the next one
            print(f"{name}: failed: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
            continue
        with open(os.path.join(args.out, f"profile_{name}_b{args.batch}_{args.precision}.json"), "w") as f:
            json.dump(r, f, indent=1)
        results.append(r)
    for r in results:
        s, m = r["single"], r["multi"]
        print(f"\n{r['model']} batch {r['batch']} ({r['kernels']} kernels): 1-stream {s['latency_ms']:.3f} ms, "
              f"{m['streams']}-stream {m['latency_ms']:.3f} ms; serial sum {r['serial_sum_ms']:.3f}, critical path "
              f"{r['critical_path_ms']:.3f}; multi / bound {m['latency_ms'] / r['critical_path_ms']:.2f}, "
              f"multi / serial {m['latency_ms'] / r['serial_sum_ms']:.2f}")
        print(f"  gap: kernels ran {m['serial_sum_ms'] / r['serial_sum_ms']:.2f}x longer concurrently (summed); "
              f"the critical path with those durations {m['critical_path_ms']:.3f} ms; measured / that "
              f"{m['latency_ms'] / m['critical_path_ms']:.2f} (event waits, launch gaps, graph launch)")
        fams: dict[str, float] = {}
        for name, us in s.get("cupti", []):
            key = re.sub(r"<.*", "", name)[:60]
            fams[key] = fams.get(key, 0.0) + us
        total = sum(fams.values()) or 1.0
        print(f"  CUPTI (1-stream replay): {len(s.get('cupti', []))} kernels, {total:.1f} us of kernel time")
        for key, us in sorted(fams.items(), key=lambda kv: -kv[1])[:12]:
            print(f"    {us:8.1f} us {100 * us / total:5.1f}%  {key}")
        if r["kernel_choice"]:
            from tvm_nimble.compiler.report import KernelChoice

            print("  " + KernelChoice.from_dict(r).summary())  # r keeps the build info's two keys
            for c in r["kernel_choice"]:
                if c["tvm_ms"] < c["vendor_ms"]:
                    print(f"  tvm faster: {c['count']} x {c['signature'][:90]} {c['tvm_ms'] * 1e3:.1f} vs "
                          f"{c['vendor_ms'] * 1e3:.1f} us -> {c['kernel']}")
        for k, n, t, share in r["families"][:12]:
            print(f"  {k[:48]:48s} {n:4d} {t:8.3f} ms {share:6.1%}")
        print("  slowest: " + ", ".join(f"{k} {d * 1e3:.0f}us" for k, d in r["slowest"][:6]))


if __name__ == "__main__":
    main()
