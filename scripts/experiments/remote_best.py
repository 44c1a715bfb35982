"""Experiment: kernels='best' measured through TVM's RPC tracker against measured here, on one GPU machine: a
tracker and one `tvm-nimble rpc-server` on the loopback; each model built twice with kernels='best' and
max_streams='auto' (once timing on this GPU, once through the tracker), then both artifacts checked
against each other and replayed side by side here.

Findings: benchmarks/findings.md, '`kernels="best"` through an RPC tracker'. Raw outputs:
benchmarks/raw/2026-11-24-h100-s8/remote_best.json and session_call2.log beside it.

    bash scripts/gpu_session.sh "experiment remote_best 300 --models zoo:incept6,tv:googlenet"
    python3 scripts/experiments/remote_best.py --models zoo:inception --target llvm --out DIR   # CPU dry run

Writes DIR/remote_best.json and prints a table: the build time each way, how many chains got the same
kernel, the stream cap each chose, and the two artifacts' replay times. On llvm (a CPU dry run) the
kernel choice does not exist: both builds are plain, and only the path is exercised.
"""
from __future__ import annotations

import json
import os
import time

KEY = "nimble-remote-best"

import gpu_args  # the shared command line, beside this script in scripts/experiments/


def main(argv=None):
    args, target = gpu_args.parse(__doc__, argv, "zoo:incept6")
    import numpy as np

    from tvm_nimble import NimbleExecutor
    from tvm_nimble.cli.models import load_model
    from tvm_nimble.compiler.build import build
    from tvm_nimble.compiler.tuning.remote import loopback_fleet
    from tvm_nimble.runtime.timing import replay_ms

    gpu = target.kind.name == "cuda"
    kernels = "best" if gpu else "tvm"
    rows = []
    with loopback_fleet(1, KEY, args.out) as (tracker, _):
        for spec in args.models.split(","):
            name, model = load_model(spec, small=args.small)
            built, seconds = {}, {}
            for where, rpc in (("here", {}), ("tracker", {"rpc_tracker": tracker, "rpc_key": KEY})):
                t0 = time.time()
                built[where] = build(model, target, kernels=kernels, **rpc)
                seconds[where] = time.time() - t0
            choice = {w: {t.signature: t.kernel for t in b.report.kernel_choice.timings} for w, b in built.items()}
            same = sum(choice["here"][s] == choice["tracker"].get(s) for s in choice["here"])
            shape = built["here"].plan.tensors[built["here"].plan.inputs[0]].shape
            x = np.random.default_rng(0).standard_normal(shape).astype("float32")
            outs = {w: NimbleExecutor(b)(x)[0].numpy() for w, b in built.items()}
            err = float(np.linalg.norm(outs["tracker"] - outs["here"]) / np.linalg.norm(outs["here"]))
            if not err < 1e-3:
                raise SystemExit(f"{name}: the two builds disagree (rel err {err:.1e}); not timing")
            ms = dict(zip(built, replay_ms(list(built.values())).median()))
            row = {"model": name, "kernels": kernels, "build_s": seconds, "chains": len(choice["here"]),
                   "same_choice": same, "rel_err": err, "ms": ms,
                   "streams": {w: b.plan.num_streams for w, b in built.items()},
                   "stream_choice": {w: b.report.stream_choice.how if b.report.stream_choice else None
                                    for w, b in built.items()},
                   "vendor_chains": {w: sum(k == "vendor" for k in c.values()) for w, c in choice.items()}}
            rows.append(row)
            print(f"remote-best {name}: choices {same}/{row['chains']} chains alike, streams {row['streams']}, "
                  f"rel err {err:.1e}; {row['stream_choice']['tracker']}", flush=True)
            with open(os.path.join(args.out, "remote_best.json"), "w") as f:
                json.dump(rows, f, indent=1)
    print(f"{'model':14s} {'build here s':>12s} {'via tracker s':>13s} {'same choice':>11s} {'streams':>8s} "
          f"{'here ms':>8s} {'tracker ms':>10s}")
    for r in rows:
        print(f"remote-best {r['model']:14s} {r['build_s']['here']:12.1f} {r['build_s']['tracker']:13.1f} "
              f"{r['same_choice']:>5d}/{r['chains']:<5d} {r['streams']['here']:>3d}/{r['streams']['tracker']:<3d} "
              f"{r['ms']['here']:8.3f} {r['ms']['tracker']:10.3f}")


if __name__ == "__main__":
    main()
