#!/usr/bin/env python3
"""Experiment: the CUDA graph's programmatic edges into TVM's kernels (codegen/dependent_launch.py), A/B on one build.

Each decoder is built once as a generator (``--kernels``, ``--providers``); then Generators captured with the edges
(NIMBLE_PDL=1) and without (NIMBLE_PDL=0, read when a graph is captured) alternate, ``--rounds`` times each, each
round timing ``--repeats`` requests of ``--new-tokens`` tokens (ms per token as ``bench --generate`` reports it).
Our vendor kernels' own launch attribute stays as the process started (the extension reads NIMBLE_PDL once), so the
difference is the edges into TVM's kernels alone. The two runs' tokens must be equal.

Writes ``pdl_edges.json`` into ``--out`` and prints a short table last; exits 1 when the tokens differ.

Findings: benchmarks/findings.md, 'The norm in the GEMV's prologue by default; programmatic edges into TVM's kernels
measured neutral'. Raw outputs: benchmarks/raw/2026-11-29-h200-s35/ (call17-f-*).

    bash scripts/gpu_session.sh "experiment pdl_edges 300 --models hf:gpt2 --precision fp16 --kernels best"
"""
from __future__ import annotations

import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for tvm_nimble
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import gpu_args  # noqa: E402  (the shared command line, beside this script in scripts/experiments/)


def parse_args(argv=None):
    p = gpu_args.generation_ab_parser(__doc__, "pdl_edges-out", repeats=3, rounds=3)
    p.add_argument("--providers", default="", help="comma-separated provider names (default: the registry's)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    import numpy as np

    import tvm_nimble
    from tvm_nimble.bench.generation import nimble_timing
    from tvm_nimble.bench.hf_models import past_onnx_model
    from tvm_nimble.compiler.generate import vocab_size

    args = parse_args(argv)
    providers = {"providers": tuple(n for n in args.providers.split(",") if n)} if args.providers else {}
    results, ok = {}, True
    for spec in [m for m in args.models.split(",") if m]:
        onnx_model = past_onnx_model(spec)
        prompt = np.random.default_rng(0).integers(0, vocab_size(onnx_model), size=args.prompt).tolist()
        module = tvm_nimble.build_generator(onnx_model, args.target, precision=args.precision, kernels=args.kernels,
                                            max_length=args.prompt + args.new_tokens, prefill_lengths=(args.prompt,),
                                            **providers)
        times: dict[str, list[float]] = {"1": [], "0": []}
        tokens = {}
        for _ in range(args.rounds):
            for pdl in ("1", "0"):
                os.environ["NIMBLE_PDL"] = pdl
                with tvm_nimble.Generator(module) as gen:
                    toks, _ttft, per_token = nimble_timing(gen, prompt, args.new_tokens, args.repeats)
                times[pdl].append(per_token)
                tokens.setdefault(pdl, toks)
                ok &= toks == tokens["1"]
        results[spec] = {"ms_per_token_edges": times["1"], "ms_per_token_no_edges": times["0"],
                         "tokens_equal": tokens["1"] == tokens["0"]}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pdl_edges.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"{'model':<16} {'edges ms/token':>15} {'none ms/token':>14} {'ratio':>6}  tokens")
    for spec, r in results.items():
        a, b = statistics.median(r["ms_per_token_edges"]), statistics.median(r["ms_per_token_no_edges"])
        print(f"{spec:<16} {a:>15.4f} {b:>14.4f} {b / a:>6.3f}  {'equal' if r['tokens_equal'] else 'DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
