"""Experiment: merged sibling operators (``merge="auto"``) on benchmark models: the per-model measurement
(the model with every sibling group merged against the one with none, one-stream and widest, CUDA-graph
replays side by side), then each of merge off and on built to the end with the stream choice, so the
latency each would ship with is measured too.

Findings: benchmarks/findings.md, 'Transformers in fp16 with every peer, training steps on cuDNN, merges, build
times, serving under load'; raw outputs in
benchmarks/raw/2026-11-26-h200-s15/merge_choice_*.json.

    bash scripts/gpu_session.sh "experiment merge_choice 500 --models zoo:incept6,zoo:nasnet,tv:inception_v3,tv:squeezenet1_1,hf:bert-base --kernels best"
    python3 scripts/experiments/merge_choice.py --models zoo:inception --target llvm --kernels tvm --out DIR

Writes DIR/merge_choice.json (each model's groups, the auto measurement, and the stream choice's measured
latency with merge off and on) and prints a table.
"""
from __future__ import annotations

import json
import os

import gpu_args  # the shared command line, beside this script in scripts/experiments/


def _chosen_ms(result):
    record = result.report.stream_choice
    return record.chosen_ms if record is not None else None


def main(argv=None):
    args, target = gpu_args.parse(__doc__, argv, "zoo:incept6", batches_and_kernels=True)
    from tvm_nimble.compiler.build import build

    rows = []
    for _, batch, name, model in gpu_args.models_and_batches(args):
        auto = build(model, target, kernels=args.kernels, merge="auto", max_streams=1)
        merge = auto.report.merge_choice
        print(f"{name} batch {batch}:", *(merge.lines() if merge else []), sep="\n  ", flush=True)
        row = {"model": name, "batch": batch, "kernels": args.kernels,
               "merge_choice": merge.to_dict() if merge else None}
        for mode in ("off", "on"):
            built = build(model, target, kernels=args.kernels, merge=mode)
            row[f"{mode}_ms"] = _chosen_ms(built)
            row[f"{mode}_launches"] = len(built.plan.launches)
            row[f"{mode}_streams"] = built.plan.num_streams
        rows.append(row)
        with open(os.path.join(args.out, "merge_choice.json"), "w") as f:  # after each row: a cut-off call keeps them
            json.dump(rows, f, indent=1)
    ms = lambda v: f"{v:9.3f}" if v is not None else f"{'-':>9s}"  # noqa: E731
    print(f"{'model':16s} {'batch':>5s} {'off ms':>9s} {'on ms':>9s} {'launches':>9s}  auto kept")
    for r in rows:
        measured = (r["merge_choice"] or {}).get("measured") or {}
        print(f"{r['model']:16s} {r['batch']:>5} {ms(r['off_ms'])} {ms(r['on_ms'])} "
              f"{r['off_launches']:>4}/{r['on_launches']:<4}  {measured.get('kept', 'nothing measured')}")


if __name__ == "__main__":
    main()
