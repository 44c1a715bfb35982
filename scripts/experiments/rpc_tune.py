"""Experiment: tuning throughput through TVM's RPC tracker on this machine: trials per minute measured
here (local runner) and through a tracker with 1 and 2 RPC servers on the loopback, same model, same
trial count, fresh databases.

Findings: benchmarks/findings.md, 'Tuning throughput through the tracker'; figure
benchmarks/rpc_tune_h100.png (plot_rpc_tune.py). Raw outputs: benchmarks/raw/2026-11-24-h100-s8/rpc_tune.json
(forked sessions), rpc_tune_spawned_sessions.json, rpc_tune_forkserver_failed.json and the session logs.

    bash scripts/gpu_session.sh "experiment rpc_tune 400 --model zoo:incept6 --trials 16"
    python3 scripts/experiments/rpc_tune.py --model zoo:incept6 --target llvm --trials 4 --out DIR   # CPU dry run

Writes DIR/rpc_tune.json and prints a table. The tracker needs the tornado package (on the GPU machine:
`make .device-extra` here and carry it; gpu_session.sh installs it).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import gpu_args  # the shared command line, beside this script in scripts/experiments/

KEY = "nimble-local"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:incept6")
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    ap.add_argument("--trials", type=int, default=64, help="trials of each run, all tasks together")
    ap.add_argument("--out", required=True)
    ap.add_argument("--servers", default="0,1,2", help="the runs: how many loopback RPC servers each measures on")
    gpu_args.add_small(ap)
    ap.add_argument("--cheap-search", action="store_true",
                    help="MetaSchedule's replay-trace search with a random cost model instead of the evolutionary "
                         "search and XGBoost (a CPU dry run: the plumbing, not the tuning, is checked)")
    args = ap.parse_args(argv)
    import logging

    # each round's start (and so where a slow run spends its time) goes to the log with a timestamp
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("tvm_nimble").setLevel(logging.INFO)
    from tvm_nimble.cli.models import load_model
    from tvm_nimble.compiler.target import resolve_target, target_dict
    from tvm_nimble.compiler.tuning.remote import loopback_fleet
    from tvm_nimble.compiler.tuning.tune import tune

    os.makedirs(args.out, exist_ok=True)
    _, model = load_model(args.model, small=args.small)
    target = target_dict(resolve_target(args.target))
    rows = []
    for servers in (int(n) for n in args.servers.split(",")):
        logs = os.path.join(args.out, f"servers{servers}")
        os.makedirs(logs, exist_ok=True)
        with loopback_fleet(servers, KEY, logs) if servers else contextlib.nullcontext((None, [])) as (tracker, _):
            t0 = time.time()
            print(f"rpctune: {servers} server(s), start", flush=True)
            report = tune(model, target, os.path.join(args.out, f"db{servers}"), trials_per_task=args.trials,
                          total_trials=args.trials, trials_per_iter=16, progress=False,
                          **({"strategy": "replay-trace", "cost_model": "random"} if args.cheap_search else {}),
                          rpc_tracker=tracker, rpc_key=KEY if servers else None)
            secs = time.time() - t0
        rows.append({"servers": servers, "trials": report.trials_this_run, "failed": report.failed_trials,
                     "seconds": secs, "trials_per_min": 60 * report.trials_this_run / secs,
                     "first_failure": report.first_failure})
    with open(os.path.join(args.out, "rpc_tune.json"), "w") as f:
        json.dump({"model": args.model, "target": args.target, "rows": rows}, f, indent=1)
    print(f"{'measured on':>14s} {'trials':>7s} {'failed':>7s} {'seconds':>8s} {'trials/min':>11s}")
    for r in rows:
        where = "this process" if r["servers"] == 0 else f"{r['servers']} RPC server(s)"
        print(f"rpctune {where:>14s} {r['trials']:7d} {r['failed']:7d} {r['seconds']:8.1f} {r['trials_per_min']:11.1f}")
        if r["failed"]:
            print(f"rpctune   first failure: {r['first_failure']}")


if __name__ == "__main__":
    main()
