#!/usr/bin/env python3
"""Experiment: where a decode step's time goes, kernel by kernel, on the device's own clock.

Builds one decoder's generator (``--kernels``, the registry's default providers plus ``--with``; ``--batch`` prompts
at once, the same prompt in each row), generates ``--tokens`` tokens after a ``--prompt``-token prompt under
``torch.profiler`` (CUPTI records the kernels of the CUDA-graph replays), and takes the last ``--steps`` decode
steps apart: a step is the device work between two copies of a token to the host (the host's part between them a
row of its own). For each kernel of a step: when it started and ended after the token before reached the host, its
duration as CUPTI reports it (under programmatic dependent launch that includes the time it waited for the kernel
before it), and its *increment*: how far it moved the step's last end forward -- the increments sum to the step's
span, so they say which kernels the step waits on. The per-kernel table groups the increments by kernel name over
the steps.

``--no-pdl`` sets ``NIMBLE_PDL=0`` before anything loads: every edge full, durations the kernels' own.

Writes ``decode_timeline.json`` (every event of the steps, the groups) into ``--out`` and prints the groups last.

    bash scripts/gpu_session.sh "experiment decode_timeline 200 --models hf:gpt2 --precision fp16 --kernels best"
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for tvm_nimble
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="hf:gpt2", help="comma-separated hf:NAME decoders")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--kernels", default="best")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=32, help="new tokens generated under the profiler")
    p.add_argument("--steps", type=int, default=4, help="decode steps taken apart (the last ones)")
    p.add_argument("--batch", type=int, default=1, help="prompts decoded together (the generator's batch)")
    p.add_argument("--with", dest="with_", default="", help="providers besides the default ones")
    p.add_argument("--no-pdl", action="store_true", help="NIMBLE_PDL=0: no programmatic dependent launch")
    p.add_argument("--out", default="decode_timeline-out")
    return p.parse_args(argv)


HOST_GAP = "(host: the token before copied out -> the step's first device work)"


def steps_of(events: list[dict], steps: int) -> list[list[dict]]:
    """The last ``steps`` decode steps of ``events`` (dicts with name, start, end in us, sorted by start): the
    events after a device-to-host copy up to the next one, times relative to the end of the copy before (the host's
    part until the step's first device work is a row of its own, ``HOST_GAP``), with each event's increment (how far
    it moved the step's last end so far): a step's increments sum to its span."""
    copies = [i for i, e in enumerate(events) if "DtoH" in e["name"]]
    out = []
    for lo, hi in list(zip(copies, copies[1:]))[-steps:]:
        step = events[lo + 1: hi + 1]
        if not step:
            continue
        t0 = events[lo]["end"]  # the token before reached the host: the step's clock starts
        rows = [{"name": HOST_GAP, "start": 0.0, "end": step[0]["start"] - t0, "duration": step[0]["start"] - t0,
                 "increment": step[0]["start"] - t0}]
        last = step[0]["start"]
        for e in step:
            inc = max(0.0, e["end"] - last)
            last = max(last, e["end"])
            rows.append({"name": e["name"], "start": e["start"] - t0, "end": e["end"] - t0,
                         "duration": e["end"] - e["start"], "increment": inc})
        out.append(rows)
    return out


def groups(steps: list[list[dict]]) -> list[dict]:
    """Per kernel name, over the steps: launches a step, increment and duration a step (us), largest first."""
    by: dict[str, dict] = {}
    for step in steps:
        for r in step:
            g = by.setdefault(r["name"], {"name": r["name"], "launches": 0, "increment": 0.0, "duration": 0.0})
            g["launches"] += 1
            g["increment"] += r["increment"]
            g["duration"] += r["duration"]
    n = max(1, len(steps))
    rows = [{**g, "launches": g["launches"] / n, "increment": g["increment"] / n, "duration": g["duration"] / n}
            for g in by.values()]
    return sorted(rows, key=lambda g: -g["increment"])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.no_pdl:
        os.environ["NIMBLE_PDL"] = "0"
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    import tvm_nimble
    from tvm_nimble.bench.hf_models import past_onnx_model
    from tvm_nimble.compiler.generate import vocab_size
    from tvm_nimble.relay_passes import providers as registry

    if not torch.cuda.is_available():
        print("decode_timeline: needs a CUDA GPU (it reads the device's own kernel times)", file=sys.stderr)
        return 2
    os.environ.setdefault("TEARDOWN_CUPTI", "0")
    os.environ.setdefault("DISABLE_CUPTI_LAZY_REINIT", "1")
    chosen = [p.name for p in registry.offloading("cuda")] + [n for n in args.with_.split(",") if n]
    results = {}
    for spec in [m for m in args.models.split(",") if m]:
        model = past_onnx_model(spec)
        prompt = np.random.default_rng(0).integers(0, vocab_size(model), size=args.prompt).tolist()
        module = tvm_nimble.build_generator(model, "cuda", precision=args.precision, kernels=args.kernels,
                                            max_length=args.prompt + args.tokens + 1, prefill_lengths=(args.prompt,),
                                            providers=tuple(chosen), batch=args.batch)
        with tvm_nimble.Generator(module) as gen:
            gen.generate_batch([prompt] * args.batch, args.tokens)  # warm
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                gen.generate_batch([prompt] * args.batch, args.tokens)
                torch.cuda.synchronize()
        events = sorted(({"name": e.name, "start": float(e.time_range.start), "end": float(e.time_range.end)}
                         for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                        key=lambda e: e["start"])
        steps = steps_of(events, args.steps)
        spans = [max(r["end"] for r in s) for s in steps]
        results[spec] = {"precision": args.precision, "kernels": args.kernels, "pdl": not args.no_pdl,
                         "batch": args.batch,
                         "plan_launches": len(module.plan.launches), "step_spans_us": spans,
                         "groups": groups(steps), "steps": steps}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_timeline.json"), "w") as f:
        json.dump(results, f, indent=1)
    for spec, r in results.items():
        spans = r["step_spans_us"]
        print(f"{spec} {r['precision']} batch {r['batch']} pdl={'on' if r['pdl'] else 'off'}: "
              f"{r['plan_launches']} launches a step, "
              f"span {min(spans):.1f}-{max(spans):.1f} us")
        print(f"  {'increment us':>12} {'duration us':>11} {'launches':>8}  kernel")
        for g in r["groups"][:25]:
            print(f"  {g['increment']:>12.2f} {g['duration']:>11.2f} {g['launches']:>8.1f}  {g['name'][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
