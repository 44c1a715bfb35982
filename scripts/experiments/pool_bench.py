"""Experiment: NimblePool on a GPU: throughput of 1, 2, 4 replicas under 8 client threads, and 10,000
pooled runs checked bit for bit.

Findings: benchmarks/findings.md, 'NimblePool on one H100'. Raw outputs: benchmarks/raw/2026-11-23-h100-s6/pool_googlenet.json,
pool_inception_v3.json and call10-session.log beside them.

    bash scripts/gpu_session.sh "experiment pool_bench 210 --models tv:googlenet,tv:inception_v3 --seconds 3"
    python3 scripts/experiments/pool_bench.py --models zoo:inception --target llvm --runs 80 --out DIR   # CPU dry run

For each model (built once, ``--kernels``, default vendor): the single-thread rate of one executor
(``ex(x)``, copies out, the same work a pool call does), then for each replica count the pool's rate
with 8 threads calling it for ``--seconds`` each. Then 8 threads x 1,250 pooled calls, each thread
with its own input, and every output compared with ``np.array_equal`` to the output of one
executor on that input (bit-identical, not within a tolerance). Writes DIR/pool_<model>.json and
prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time

import numpy as np

THREADS = 8


def rate(call, inputs: list, threads: int, seconds: float) -> tuple[float, float]:
    """(calls per second, median ms per call) of ``threads`` threads calling ``call(x)`` for ``seconds``."""
    counts, lat = [0] * threads, [[] for _ in range(threads)]
    stop = time.perf_counter() + seconds

    def worker(k):
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            call(inputs[k % len(inputs)])
            lat[k].append((time.perf_counter() - t0) * 1e3)
            counts[k] += 1

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    return sum(counts) / elapsed, float(np.median([x for l in lat for x in l]))


def bit_identical(pool, inputs: list, refs: list, total: int) -> int:
    """Mismatching outputs among ``total`` pooled calls spread over ``len(inputs)`` threads."""
    wrong = [0] * len(inputs)
    per = total // len(inputs)

    def worker(k):
        for _ in range(per):
            out = [o.numpy() for o in pool(inputs[k])]
            wrong[k] += sum(not np.array_equal(o, r) for o, r in zip(out, refs[k]))

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(len(inputs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(wrong)


def load_model(spec: str):
    """(name, ONNX model) for ``tv:NAME`` / ``timm:NAME`` (needs PyTorch) or ``zoo:NAME``."""
    if spec.startswith("zoo:"):
        from tvm_nimble import zoo

        return spec[4:], zoo.get_model(spec[4:])
    from tvm_nimble.cli.bench import model_builders

    name, onnx_builder, _ = model_builders(spec)
    return name, onnx_builder(batch=1)


def bench_model(spec: str, target: str, kernels: str, seconds: float, runs: int) -> dict:
    from tvm_nimble.compiler.build import build
    from tvm_nimble.runtime.loading import NimbleExecutor
    from tvm_nimble.runtime.pool import NimblePool

    name, model = load_model(spec)
    module = build(model, {"kind": target}, kernels=kernels if target == "cuda" else "tvm")
    shape = module.plan.tensors[module.plan.inputs[0]].shape
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype("float32") for _ in range(THREADS)]
    out = {"model": name, "kernels": kernels, "threads": THREADS, "seconds": seconds, "rows": []}
    with NimbleExecutor(module) as ex:
        refs = [[o.numpy() for o in ex(x, copy=True)] for x in inputs]
        assert not np.array_equal(refs[0][0], refs[1][0]), "output does not depend on the input"
        r, ms = rate(lambda x: ex(x, copy=True), inputs, 1, seconds)
        out["rows"].append({"replicas": "executor", "threads": 1, "calls_per_s": r, "median_ms": ms})
    for replicas in (1, 2, 4):
        with NimblePool(module, replicas=replicas) as pool:
            rate(pool, inputs, THREADS, 0.5)  # warm-up
            r, ms = rate(pool, inputs, THREADS, seconds)
            out["rows"].append({"replicas": replicas, "threads": THREADS, "calls_per_s": r, "median_ms": ms})
            if replicas == 4:
                t0 = time.perf_counter()
                out["bit_identical_runs"] = runs
                out["mismatches"] = bit_identical(pool, inputs, refs, runs)
                out["bit_identical_seconds"] = time.perf_counter() - t0
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tv:googlenet,tv:inception_v3")
    ap.add_argument("--kernels", default="vendor", choices=["tvm", "vendor", "best"])
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"], help="llvm: a CPU dry run")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    results = []
    for spec in args.models.split(","):
        res = bench_model(spec, args.target, args.kernels, args.seconds, args.runs)
        results.append(res)
        with open(os.path.join(args.out, f"pool_{res['model']}.json"), "w") as f:
            json.dump(res, f, indent=1)
    print(f"{'model':14s} {'replicas':>9s} {'threads':>7s} {'calls/s':>9s} {'median ms':>10s}")
    for res in results:
        for r in res["rows"]:
            print(f"{res['model']:14s} {str(r['replicas']):>9s} {r['threads']:>7d} {r['calls_per_s']:9.1f} "
                  f"{r['median_ms']:10.3f}")
        print(f"pool {res['model']}: {res['bit_identical_runs']} pooled runs, {res['mismatches']} not bit-identical "
              f"({res['bit_identical_seconds']:.1f} s)")


if __name__ == "__main__":
    main()
