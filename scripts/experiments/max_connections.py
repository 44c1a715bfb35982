"""Experiment: do the GPU's hardware work queues limit a wide multi-stream graph?

CUDA maps streams, and the concurrent branches of a CUDA graph, onto ``CUDA_DEVICE_MAX_CONNECTIONS``
hardware queues (8 by default, at most 32); a plan with more streams than that shares them, and two
independent kernels that land in one queue run one after the other. The setting is read when the
process creates its CUDA context, so it cannot be compared inside one process: each model is built
once (the widest schedule and its one-stream twin), exported, and both artifacts are timed in fresh
processes, one per setting, alternating the settings round by round so that drift hits all alike.

Findings: benchmarks/findings.md, 'Hardware queues do not limit wide graphs'.
Raw outputs: the ``max_connections`` lines of benchmarks/raw/2026-11-24-h100-s9/session_call4.log (the JSON
was not kept).

    bash scripts/gpu_session.sh "experiment max_connections 400 --models timm:nasnetalarge --connections 8,32"
    python3 scripts/experiments/max_connections.py --models zoo:inception --target llvm --kernels tvm --out DIR

Writes DIR/max_connections.json and prints a table: per setting, the multi- and one-stream medians.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

import gpu_args  # the shared command line, beside this script in scripts/experiments/

ROUNDS = 3


def _time_artifacts(paths: list[str]) -> list[float]:
    """In this process (a child): median ms of each artifact's replay, side by side."""
    from tvm_nimble.runtime.module import load
    from tvm_nimble.runtime.timing import replay_ms

    return replay_ms([load(p) for p in paths]).median()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--time"]:
        print(json.dumps(_time_artifacts(argv[1:])))
        return
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--connections", default="8,32")
    known, rest = extra.parse_known_args(argv)
    args, target = gpu_args.parse(__doc__, rest, "timm:nasnetalarge", batches_and_kernels=True)
    settings = [int(c) for c in known.connections.split(",")]
    from tvm_nimble.compiler.build import build
    from tvm_nimble.compiler.stream_choice import rescheduled

    rows = []
    for _, batch, name, model in gpu_args.models_and_batches(args):
        widest = build(model, target, max_streams=None, kernels=args.kernels)
        single = rescheduled(widest, 1)
        art = tempfile.mkdtemp(prefix=f"{name}-b{batch}-")  # not under --out: large, and rebuilt at will
        paths = [b.export(os.path.join(art, kind, "model.nimble")) for kind, b in (("multi", widest), ("single", single))]
        samples: dict[int, list[list[float]]] = {c: [] for c in settings}
        for _ in range(ROUNDS):
            for c in settings:
                env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": str(c)}
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--time", *paths], env=env,
                                     capture_output=True, text=True, check=True)
                samples[c].append(json.loads(out.stdout.strip().splitlines()[-1]))
        row = {"model": name, "batch": batch, "kernels": args.kernels, "streams": widest.plan.num_streams,
               "by_connections": {str(c): {"multi_ms": statistics.median(s[0] for s in samples[c]),
                                           "single_ms": statistics.median(s[1] for s in samples[c]),
                                           "rounds": samples[c]} for c in settings}}
        rows.append(row)
        with open(os.path.join(args.out, "max_connections.json"), "w") as f:
            json.dump(rows, f, indent=1)
        print(f"{name} batch {batch}: " + ", ".join(
            f"{c} queues {v['multi_ms']:.3f} / {v['single_ms']:.3f} ms" for c, v in row["by_connections"].items()),
            flush=True)
    print(f"{'model':16s} {'batch':>5s} {'streams':>7s} " + " ".join(f"{f'multi@{c}':>10s} {f'1-str@{c}':>10s}" for c in settings))
    for r in rows:
        cells = " ".join(f"{r['by_connections'][str(c)]['multi_ms']:10.3f} {r['by_connections'][str(c)]['single_ms']:10.3f}"
                         for c in settings)
        print(f"{r['model']:16s} {r['batch']:>5} {r['streams']:>7} {cells}")


if __name__ == "__main__":
    main()
