"""Experiment (analysis, no GPU): calibrate the schedule simulator (codegen/schedule_sim.py) on measured
GPU replays, and score it.

    python3 scripts/experiments/calibrate_schedule_sim.py benchmarks/raw/2026-11-23-h100-s6/profiles_with_plans.tar.xz

Findings: benchmarks/findings.md, 'The schedule simulator, calibrated'; the fitted constants are
codegen/schedule_sim.py's defaults. Raw inputs:
benchmarks/raw/2026-11-23-h100-s6/profiles_with_plans.tar.xz; its output is printed, not kept.

Input: the per-kernel profiles of scripts/experiments/kernel_profile.py (a directory of profile_*.json, or a
tarball of one), each with the one-stream and the multi-stream plan, the one-stream plan's graph-mode
launch durations and both measured latencies. Every model gives two cases: its one-stream replay and
its multi-stream replay, simulated with the one-stream (solo) durations. Prints the fitted GPU model,
then per model the predicted and measured multi-stream latency, in-sample and leave-one-model-out
(the model's own cases left out of the fit): the second is the honest error.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import tarfile
import tempfile

from tvm_nimble.codegen.schedule_sim import Case, calibrate, predict
from tvm_nimble.contract.plan import Plan


def load_cases(path: str) -> list[Case]:
    if os.path.isfile(path):
        tmp = tempfile.mkdtemp()
        with tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
        path = tmp
    cases = []
    for f in sorted(glob.glob(os.path.join(path, "**", "profile_*.json"), recursive=True)):
        d = json.load(open(f))
        single, multi = d["single"], d["multi"]
        if "plan" not in single or single["kernels"] != multi["kernels"]:
            continue  # no plans recorded, or launch orders differ
        solo = [x * 1e3 for x in single["durations_ms"]]
        cases.append(Case(f"{d['model']}/1", Plan.from_dict(single["plan"]), solo, single["latency_ms"] * 1e3))
        cases.append(Case(f"{d['model']}/multi", Plan.from_dict(multi["plan"]), solo, multi["latency_ms"] * 1e3))
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", help="directory or tarball of profile_*.json with plans")
    args = ap.parse_args(argv)
    cases = load_cases(args.profiles)
    if not cases:
        raise SystemExit(f"no profiles with plans under {args.profiles}")
    gpu, bracket, errors, points = calibrate(cases)
    print(f"fitted: launch {gpu.launch_us:.2f} us, event wait {gpu.wait_us:.2f} us, contention {gpu.contention}, "
          f"fill {gpu.fill}, profiler bracket {bracket:.2f} us per launch")
    models = sorted({c.name.split("/")[0] for c in cases})
    print(f"{'model':22s} {'measured ms':>11s} {'predicted':>10s} {'error':>7s} {'leave-one-out':>14s} {'error':>7s}")
    abs_in, abs_loo = [], []
    for m in models:
        multi = next(c for c in cases if c.name == f"{m}/multi")
        others = [c.name for c in cases if not c.name.startswith(m + "/")]
        i = min(range(len(points)), key=lambda k: sum(errors[n][k] for n in others))
        p_in = predict(multi, gpu, bracket)
        p_loo = predict(multi, *points[i])
        e_in, e_loo = p_in / multi.measured_us - 1, p_loo / multi.measured_us - 1
        abs_in.append(abs(e_in))
        abs_loo.append(abs(e_loo))
        print(f"{m:22s} {multi.measured_us / 1e3:11.3f} {p_in / 1e3:10.3f} {e_in:+7.1%} {p_loo / 1e3:14.3f} {e_loo:+7.1%}")
    print(f"mean absolute error of the multi-stream prediction: {sum(abs_in) / len(abs_in):.1%} in-sample, "
          f"{sum(abs_loo) / len(abs_loo):.1%} leave-one-model-out")


if __name__ == "__main__":
    main()
