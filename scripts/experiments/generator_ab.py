#!/usr/bin/env python3
"""Experiment: two builds of one decoder's generator that differ in their providers, A/B in one process.

Each decoder is built twice with ``--kernels`` (the second build finds the first's chain timings in the timing cache,
so both choose alike where their providers agree): A with the registry's default providers plus ``--with``, B with
A's less ``--without`` and with ``--b-option KEY=VALUE`` (build options of B's alone, e.g. ``max_streams=auto``). Then Generators of A and B alternate, ``--rounds`` times each, each round timing
``--repeats`` requests of ``--new-tokens`` tokens after a ``--prompt``-token prompt (ms per token as ``bench
--generate`` reports it); the GPU's drift between rounds (larger than many of the differences measured) falls on
both. A's and B's tokens must be equal.

Writes ``generator_ab.json`` into ``--out`` and prints a short table last; exits 1 when the tokens differ.

    bash scripts/gpu_session.sh "experiment generator_ab 300 --models hf:gpt2 --without attention_append"
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
    p = gpu_args.generation_ab_parser(__doc__, "generator_ab-out", repeats=2, rounds=4)
    p.add_argument("--with", dest="with_", default="", help="providers A names besides the default ones")
    p.add_argument("--without", default="", help="providers A has and B lacks")
    p.add_argument("--b-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a build option of B's alone (repeatable), e.g. max_streams=auto")
    return p.parse_args(argv)


def main(argv=None) -> int:
    import numpy as np

    import tvm_nimble
    from tvm_nimble.bench.generation import nimble_timing
    from tvm_nimble.bench.hf_models import past_onnx_model
    from tvm_nimble.compiler.generate import vocab_size
    from tvm_nimble.relay_passes import providers as registry

    args = parse_args(argv)
    names = lambda s: [n for n in s.split(",") if n]  # noqa: E731
    a = [p.name for p in registry.offloading("cuda")] + [n for n in names(args.with_)]
    b = [n for n in a if n not in names(args.without)]
    b_options = {}
    for item in args.b_option:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"generator_ab: --b-option {item!r} is not KEY=VALUE", file=sys.stderr)
            return 2
        b_options[key] = int(value) if value.lstrip("-").isdigit() else value
    if a == b and not b_options:
        print("generator_ab: A and B are the same build (--without names no provider A has, no --b-option)",
              file=sys.stderr)
        return 2
    results, ok = {}, True
    for spec in names(args.models):
        onnx_model = past_onnx_model(spec)
        prompt = np.random.default_rng(0).integers(0, vocab_size(onnx_model), size=args.prompt).tolist()
        modules = {side: tvm_nimble.build_generator(onnx_model, args.target, precision=args.precision,
                                                    kernels=args.kernels, max_length=args.prompt + args.new_tokens,
                                                    prefill_lengths=(args.prompt,), providers=tuple(chosen), **extra)
                   for side, chosen, extra in (("A", a, {}), ("B", b, b_options))}
        times: dict[str, list[float]] = {"A": [], "B": []}
        tokens = {}
        for _ in range(args.rounds):
            for side, module in modules.items():
                with tvm_nimble.Generator(module) as gen:
                    toks, _ttft, per_token = nimble_timing(gen, prompt, args.new_tokens, args.repeats)
                times[side].append(per_token)
                tokens.setdefault(side, toks)
        same = tokens["A"] == tokens["B"]
        ok &= same
        launches = {side: len(m.plan.launches) for side, m in modules.items()}
        results[spec] = {"providers_a": a, "providers_b": b, "options_b": b_options, "ms_per_token_a": times["A"],
                         "ms_per_token_b": times["B"], "decode_launches": launches, "tokens_equal": same}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "generator_ab.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"A: default providers{' + ' + args.with_ if args.with_ else ''}; B: A without {args.without or '-'}"
          f"{', ' + ', '.join(args.b_option) if args.b_option else ''}")
    print(f"{'model':<16} {'A ms/token':>11} {'B ms/token':>11} {'B/A':>6} {'launches A/B':>13}  tokens")
    for spec, r in results.items():
        ma, mb = statistics.median(r["ms_per_token_a"]), statistics.median(r["ms_per_token_b"])
        n = r["decode_launches"]
        print(f"{spec:<16} {ma:>11.4f} {mb:>11.4f} {mb / ma:>6.3f} {n['A']:>6}/{n['B']:<6}  "
              f"{'equal' if r['tokens_equal'] else 'DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
