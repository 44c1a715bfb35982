"""Experiment: what building concatenations in place gains over concat kernels, on this GPU.

Each model is built twice (``concat_in_place`` on and off, same kernels otherwise); Nimble's widest
schedule and the one-stream schedule of each are replayed as CUDA graphs, interleaved in one process.
Every build's output is checked first: against PyTorch for tv:/timm: models, against the other build
always.

Findings: benchmarks/findings.md, 'Concatenation in place' (vendor kernels) and 'Concat in place with
`kernels="best"`' (after 'The wrong output of concat in place with mixed kernels, found and fixed.'). Raw
outputs: benchmarks/raw/2026-11-24-h100-s7/concat_in_place.json,
benchmarks/raw/2026-11-24-h100-s8/concat_in_place.json, and the session logs beside them.

    bash scripts/gpu_session.sh "experiment concat_in_place 300 --models tv:googlenet,tv:inception_v3 --kernels vendor"
    python3 scripts/experiments/concat_in_place.py --models zoo:inception --target llvm --out DIR   # CPU dry run

Writes DIR/concat_in_place.json and prints a table (``concat`` lines).
"""
from __future__ import annotations

import json
import os

import numpy as np

import gpu_args  # the shared command line, beside this script in scripts/experiments/


def _outputs(result, x, device, mode: str):
    from tvm_nimble.runtime.loading import NimbleExecutor

    with NimbleExecutor(result, device, mode=mode) as ex:
        return [o.numpy() for o in ex(x)]


HEADER = (f"concat {'model':16s} {'batch':>5s} {'copies ms':>10s} {'in place':>9s} {'gain':>6s} "
          f"{'1-str copies':>12s} {'1-str in place':>14s} {'gain':>6s}")


def _table_line(r: dict) -> str:
    t = r["ms"]
    if not t:
        return f"concat {r['model']:16s} {r['batch']:>5} (built and checked; no GPU to time on)"
    return (f"concat {r['model']:16s} {r['batch']:>5} {t['concat-kernels']:10.3f} {t['in-place']:9.3f} "
            f"{t['concat-kernels'] / t['in-place']:5.3f}x {t['concat-kernels 1-stream']:12.3f} "
            f"{t['in-place 1-stream']:14.3f} {t['concat-kernels 1-stream'] / t['in-place 1-stream']:5.3f}x")


def main(argv=None):
    args, target = gpu_args.parse(__doc__, argv, "tv:googlenet", batches_and_kernels=True)
    import tvm

    from tvm_nimble.bench.harness import rel_l2, torch_reference
    from tvm_nimble.compiler.build import build
    from tvm_nimble.compiler.stream_choice import rescheduled
    from tvm_nimble.runtime.timing import replay_ms

    gpu = target.kind.name == "cuda"
    device = tvm.cuda(0) if gpu else tvm.cpu(0)
    rows = []
    for spec, batch, name, model in gpu_args.models_and_batches(args):
        kernels = args.kernels if gpu else "tvm"
        builds = {"in-place": build(model, target, max_streams=None, kernels=kernels),
                  "concat-kernels": build(model, target, max_streams=None, kernels=kernels, concat_in_place=False)}
        for key in list(builds):
            builds[f"{key} 1-stream"] = rescheduled(builds[key], 1)
        shape = builds["in-place"].plan.tensors[builds["in-place"].plan.inputs[0]].shape
        x = np.random.default_rng(0).standard_normal(shape).astype("float32")
        outs = {k: _outputs(b, x, device, "cuda-graph" if gpu else "sequential") for k, b in builds.items()}
        errs = {k: rel_l2(o, outs["concat-kernels"]) for k, o in outs.items()}
        if spec.startswith(("tv:", "timm:")) and gpu:
            from tvm_nimble.cli.bench import model_builders

            ref = torch_reference(model_builders(spec)[2](batch=batch), [[x]])[0]
            errs = {k: rel_l2(o, ref) for k, o in outs.items()}
        bad = {k: e for k, e in errs.items() if not e < 1e-3}
        if bad:
            raise SystemExit(f"{name} batch {batch}: outputs disagree ({bad}); not timing")
        times = dict(zip(builds, replay_ms(list(builds.values())).median())) if gpu else {}
        row = {"model": name, "batch": batch, "kernels": kernels, "rel_err": errs, "ms": times,
               "concats_in_place": builds["in-place"].report.concats_in_place,
               "launches": {k: len(b.plan.launches) for k, b in builds.items()},
               "streams": {k: b.plan.num_streams for k, b in builds.items()}}
        rows.append(row)
        print(f"concat {name} batch {batch}: {row['concats_in_place']} concats in place, launches "
              f"{row['launches']['concat-kernels']} -> {row['launches']['in-place']}, max rel err "
              f"{max(errs.values()):.1e}", flush=True)
        print(HEADER + "\n" + _table_line(row), flush=True)  # now, in case a later model runs out of time
        with open(os.path.join(args.out, "concat_in_place.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(HEADER)
    for r in rows:
        print(_table_line(r))


if __name__ == "__main__":
    main()
