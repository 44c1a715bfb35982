"""Experiment: the stream choice (``max_streams="auto"``) on benchmark models: every cap (program order
and least slack first), then critical-path stream priorities, measured on this GPU with one compiled
library per model and batch.

Findings: benchmarks/findings.md, 'Stream priorities', 'Stream cap at batch 32' and 'Cost-aware caps'.
Raw outputs: benchmarks/raw/2026-11-24-h100-s7/stream_choice.json,
benchmarks/raw/2026-11-24-h100-s8/stream_choice.json,
benchmarks/raw/2026-11-24-h100-s9/stream_choice_nasnetalarge_b8.json and the session logs beside them.

    bash scripts/gpu_session.sh "experiment stream_choice 400 --models tv:googlenet,tv:inception_v3 --batch 1,8"
    python3 scripts/experiments/stream_choice.py --models zoo:inception --target llvm --kernels tvm --out DIR

Writes DIR/stream_choice.json (every candidate's time, the priority trial) and prints a table:
auto (what the choice keeps) against the widest schedule, the one-stream graph and the best capped
schedule in program order and least slack first (cost-aware).
"""
from __future__ import annotations

import json
import os

import gpu_args  # the shared command line, beside this script in scripts/experiments/


def main(argv=None):
    args, target = gpu_args.parse(__doc__, argv, "tv:googlenet", batches_and_kernels=True)
    from tvm_nimble.compiler.build import build
    from tvm_nimble.compiler.session import BuildSession
    from tvm_nimble.compiler.stream_choice import choose_streams

    rows = []
    for _, batch, name, model in gpu_args.models_and_batches(args):
        widest = build(model, target, max_streams=None, kernels=args.kernels)
        chosen, record = choose_streams(widest, BuildSession(widest.options))
        print(f"{name} batch {batch}: {record.summary()}", flush=True)
        times = {(c.max_streams, c.order): c.measured_ms for c in record.candidates}
        auto_ms = record.chosen_ms
        capped = {k: t for k, t in times.items() if 1 < k[0] < widest.plan.num_streams and t is not None}
        best_of = {o: min((t for (_, order), t in capped.items() if order == o), default=None)
                   for o in ("program", "slack")}
        rows.append({"model": name, "batch": batch, "kernels": args.kernels, "record": record.to_dict(),
                     "one_stream_ms": times.get((1, "program")),
                     "widest_ms": times.get((widest.plan.num_streams, "program")),
                     "best_cap_program_order_ms": best_of["program"], "best_cap_slack_order_ms": best_of["slack"],
                     "auto_ms": auto_ms, "auto_streams": chosen.plan.num_streams,
                     "auto_order": record.chosen_order, "auto_priority": bool(sum(chosen.plan.stream_priority))})
        with open(os.path.join(args.out, "stream_choice.json"), "w") as f:  # after each row: a cut-off call keeps them
            json.dump(rows, f, indent=1)
    print(f"{'model':16s} {'batch':>5s} {'1-stream':>9s} {'widest':>9s} {'cap,prog':>9s} {'cap,slack':>9s} "
          f"{'auto':>9s} {'widest/auto':>11s}  chosen")
    ms = lambda v: f"{v:9.3f}" if v is not None else f"{'-':>9s}"
    for r in rows:
        if r["auto_ms"] is None:
            print(f"{r['model']:16s} {r['batch']:>5} (nothing measured: no GPU of the target here)")
            continue
        print(f"{r['model']:16s} {r['batch']:>5} {ms(r['one_stream_ms'])} {ms(r['widest_ms'])} "
              f"{ms(r['best_cap_program_order_ms'])} {ms(r['best_cap_slack_order_ms'])} {ms(r['auto_ms'])} "
              f"{r['widest_ms'] / r['auto_ms']:10.3f}x  {r['auto_streams']} streams"
              f"{', least slack first' if r['auto_order'] == 'slack' else ''}{', priorities' if r['auto_priority'] else ''}")


if __name__ == "__main__":
    main()
