"""``tvm-nimble bench --generate``: time to first token and milliseconds per token of Nimble's generator against
Hugging Face transformers (eager, and a static cache under ``torch.compile``), side by side in one process.

    tvm-nimble bench --generate --models hf:gpt2,hf:llama-0.5b --precision fp16,bf16 --prompt 128 --new-tokens 256
    tvm-nimble bench --generate --models hf:gpt2 --batch 1,4,8

``--batch B`` times requests of B prompts at once (each ``--prompt`` random tokens; Nimble's generator built for B
sequences, the peers given the B prompts as one batch): ms per token is then a step of all B, and every row's
tokens are checked.

Each model is ``hf:NAME`` of :mod:`.hf_models` (random weights, config in code). Nimble builds the with-past ONNX
export (:func:`.hf_models.past_onnx_model`) into a generator (:func:`tvm_nimble.build_generator`) whose cache holds
the prompt and the new tokens. Before timing, the first greedy tokens (up to 32) of every system are compared with
HF eager's in the same precision; a system that differs is reported with the step where it diverged. Rows go to
``generation.csv`` in the output folder (one per system: TTFT, ms per token, tokens matched). ONNX Runtime GenAI
(``ort-genai``, :mod:`.ort_genai`) runs the same with-past export on its CUDA provider on a GPU, its CPU one
otherwise; where ``onnxruntime_genai`` does not import, its row says so. vLLM is not run here.

``--profile`` adds where a token's time goes on the GPU: each system generates 1 and then 1 + N tokens under
``torch.profiler`` (CUPTI: every kernel and copy as the device ran it, CUDA-graph replays included), and the
difference over N is the device time per token by kernel name (``generation-kernels.json``, top kernels printed).

What each of Nimble's builds chose goes to ``generation-builds.json``: per model and precision, each step's (the
decode step's, ``"1"``, and the prompt's) kernel choice as its build report has it -- every chain a provider offered,
its time and TVM's, who took it, and the whole-model check.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import time

from tvm_nimble.bench import generate_peers

COLUMNS = ["date", "device", "model", "batch", "dtype", "kernels", "system", "prompt_tokens", "new_tokens",
           "ttft_ms", "ms_per_token", "tokens_checked", "tokens_matched", "build_s", "note"]


def _args(argv):
    ap = argparse.ArgumentParser(prog="tvm-nimble bench --generate", description=__doc__.splitlines()[0])
    ap.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="hf:gpt2", help="comma-separated hf:NAME decoders")
    ap.add_argument("--precision", default="fp16", help="comma-separated: fp32, fp16, bf16")
    ap.add_argument("--kernels", choices=["tvm", "vendor", "best"],
                    help="default: best on a GPU (as build_generator's auto: each operator on the fastest kernel "
                         "measured), tvm on the CPU (vendor kernels are CUDA's)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (default %(default)s)")
    ap.add_argument("--batch", default="1", help="comma-separated prompts per request (default %(default)s)")
    ap.add_argument("--new-tokens", type=int, default=256, help="new tokens per request (default %(default)s)")
    ap.add_argument("--check-tokens", type=int, default=32, help="greedy tokens compared with HF eager's")
    ap.add_argument("--repeats", type=int, default=3, help="timed requests per system (median)")
    ap.add_argument("--skip", default="",
                    help="comma-separated systems to leave out: hf-eager, hf-static-compiled, ort-genai")
    ap.add_argument("--out", default="bench-results", help="output folder (generation.csv)")
    ap.add_argument("--target", choices=["cuda", "llvm"], help="default: cuda when a GPU is present")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="GPU: also profile N more tokens per system, device time per token by kernel (default off)")
    ap.add_argument("--providers", type=lambda text: tuple(n for n in text.split(",") if n), metavar="NAME,...",
                    help="the kernel providers besides TVM the builds may use (default: the registry's; the names: "
                         "tvm-nimble compile --help)")
    return ap.parse_args(argv)


def nimble_timing(gen, prompt, new_tokens: int, repeats: int):
    """(tokens, TTFT ms, ms per token) of an open :class:`~tvm_nimble.Generator`: each timed request stamps every
    new token as it streams out (a token reaches the host once its step is done); TTFT and the time per further
    token are :func:`~tvm_nimble.bench.generate_peers.per_token_times` of ``repeats`` requests. ``prompt``: one
    prompt (tokens: its new ids) or a batch of them (:meth:`~tvm_nimble.Generator.generate_batch`, stamped at the
    first row's tokens; tokens: each row's new ids)."""
    rows = generate_peers.prompt_rows(prompt)
    one = not isinstance(prompt[0], (list, tuple))
    tokens = gen.generate_batch(rows, new_tokens)  # warm-up (and the tokens)

    def stamped() -> list[float]:
        times: list[float] = []
        start = time.perf_counter()
        gen.generate_batch(rows, new_tokens,
                           on_token=lambda row, token: row == 0 and times.append(time.perf_counter() - start))
        return times

    return (tokens[0] if one else tokens, *generate_peers.per_token_times([stamped() for _ in range(repeats)]))


def kernels_per_token(run, tokens: int) -> dict[str, float]:
    """Device microseconds per token by kernel (or copy) name: ``run(1 + tokens)`` less ``run(1)`` under
    ``torch.profiler`` (CUPTI records the kernels of CUDA-graph replays too), over ``tokens``; the prompt's prefill
    cancels out. ``run(n)`` generates ``n`` tokens from the same prompt.

    Both runs are one profiling session, split at a marker kernel: a second session in a process that replays CUDA
    graphs re-initializes CUPTI, which aborted the process on an H100 (CUDA 13); for the same reason CUPTI is
    told not to tear down between sessions of one bench (PyTorch's own workaround for its CUDA graphs)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("TEARDOWN_CUPTI", "0")
    os.environ.setdefault("DISABLE_CUPTI_LAZY_REINIT", "1")
    run(1 + tokens)  # warm
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(1)
        torch.cuda.synchronize()
        torch.cuda._sleep(1000)  # the marker between the two runs
        torch.cuda.synchronize()
        run(1 + tokens)
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    marker = next(i for i, e in enumerate(events) if "spin_kernel" in e.name)
    times: dict[str, float] = {}
    for i, e in enumerate(events):
        if i != marker:
            times[e.name] = times.get(e.name, 0.0) + (e.time_range.elapsed_us() if i > marker
                                                       else -e.time_range.elapsed_us())
    return {k: v / tokens for k, v in times.items()}


def _print_profile(name: str, per_kernel: dict[str, float], top: int = 12) -> None:
    total = sum(per_kernel.values())
    print(f"  {name}: {total:.1f} us of device time per token")
    for k, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {us:8.2f} us {100 * us / (total or 1):5.1f}%  {k[:100]}")


def _batches(text: str) -> list[int]:
    """``--batch``'s sizes, or one line naming what is wrong."""
    from tvm_nimble.errors import NimbleError

    try:
        sizes = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise NimbleError(f"--batch {text!r}: give prompts per request as integers >= 1, e.g. --batch 1,4,8")
    return sizes


def _matched(tokens: list[int], want: list[int]) -> int:
    n = 0
    for a, b in zip(tokens, want):
        if a != b:
            break
        n += 1
    return n


def main(argv=None) -> int:
    import numpy as np
    import torch

    import tvm_nimble
    from tvm_nimble.bench.harness import device_name
    from tvm_nimble.bench.hf_models import hf_builders, past_onnx_model
    from tvm_nimble.bench.ort_genai import ort_genai
    from tvm_nimble.bench.report import append_rows
    from tvm_nimble.compiler.generate import vocab_size
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.errors import NimbleError
    from tvm_nimble.relay_passes.precision import PRECISIONS

    args = _args(argv)
    gpu = torch.cuda.is_available() if args.target is None else args.target == "cuda"
    target = "cuda" if gpu else "llvm"
    dev = "cuda" if gpu else "cpu"
    if args.kernels is None:
        args.kernels = "best" if gpu else "tvm"
    named = {"providers": args.providers} if args.providers else {}
    BuildOptions.create(target, kernels=args.kernels, **named)  # its one line (e.g. vendor kernels on the CPU) first
    skip = {s for s in args.skip.split(",") if s}
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "generation.csv")
    date = datetime.date.today().isoformat()
    device = device_name(gpu)
    table, profiles, builds = [], {}, {}
    batches = _batches(args.batch)
    for spec in [m for m in args.models.split(",") if m]:
        label, _, torch_builder = hf_builders(spec)
        onnx_model = past_onnx_model(spec)
        rng = np.random.default_rng(0)  # row 0: the prompt of every batch
        prompts = [rng.integers(0, vocab_size(onnx_model), size=args.prompt).tolist() for _ in range(max(batches))]
        for precision, batch in [(p, b) for p in args.precision.split(",") if p for b in batches]:
            prompt = prompts[:batch]
            rows = []
            dtype = getattr(torch, PRECISIONS[precision][0])
            model = torch_builder(1)  # (each peer runs its own copy on the device, in the precision)
            peers = {}
            if "hf-eager" not in skip:
                peers["hf-eager"] = generate_peers.hf_eager(model, prompt, args.new_tokens, dev, dtype, args.repeats)
            if "hf-static-compiled" not in skip:
                try:
                    peers["hf-static-compiled"] = generate_peers.hf_static_compiled(
                        model, prompt, args.new_tokens, dev, dtype, args.repeats)
                except Exception as err:  # noqa: BLE001 -- a peer that fails is reported, not fatal
                    rows.append({"system": "hf-static-compiled", "note": f"failed: {str(err).splitlines()[0][:200]}"})
            if "ort-genai" not in skip:
                try:
                    peers["ort-genai"] = ort_genai(onnx_model, model, prompt, args.new_tokens, "cuda" if gpu else "cpu",
                                                   precision, args.repeats)
                except NimbleError as err:  # not installed, or a precision it has no model for: said in its row
                    rows.append({"system": "ort-genai", "note": str(err)})
                except Exception as err:  # noqa: BLE001 -- a peer that fails is reported, not fatal
                    rows.append({"system": "ort-genai", "note": f"failed: {str(err).splitlines()[0][:200]}"})
            start = time.perf_counter()
            module = tvm_nimble.build_generator(onnx_model, target, precision=precision, kernels=args.kernels,
                                                max_length=args.prompt + args.new_tokens,
                                                prefill_lengths=(args.prompt,), batch=batch, **named)
            build_s = time.perf_counter() - start
            builds[f"{label}/{precision}" + (f"/batch{batch}" if batch > 1 else "")] = {
                step: {k: v for k, v in info.items() if k.startswith("kernel_choice")}
                for step, info in module.info.get("steps", {}).items()}
            with tvm_nimble.Generator(module) as gen:
                tokens, ttft, per_token = nimble_timing(gen, prompt, args.new_tokens, args.repeats)
                if args.profile and gpu:
                    profiles[f"{label}/{precision}/b{batch}/nimble"] = kernels_per_token(
                        lambda n: gen.generate_batch(prompt, n), args.profile)
            if args.profile and gpu:
                for name, t in peers.items():
                    if t.run is not None:
                        profiles[f"{label}/{precision}/b{batch}/{name}"] = kernels_per_token(t.run, args.profile)
            reference = peers["hf-eager"].rows if "hf-eager" in peers else None
            n = min(args.check_tokens, args.new_tokens)
            providers = f"providers {','.join(args.providers)}" if args.providers else ""
            systems = [("nimble", tokens, ttft, per_token, f"{build_s:.1f}", providers)]
            systems += [(name, t.rows, t.ttft_ms, t.ms_per_token, "", t.note) for name, t in peers.items()]
            for name, toks, t_ms, pt_ms, b_s, note in systems:
                matched = [_matched(got[:n], want[:n]) for got, want in zip(toks, reference)] if reference else []
                worst = matched.index(min(matched)) if matched else 0  # the row checked the least far
                left = generate_peers.divergence(model, prompt[worst], reference[worst][:n], toks[worst][:n], dev,
                                                 dtype) if reference else None
                if left is not None:  # where the tokens part, whether that step is a tie in this precision
                    where = f"row {worst} " if batch > 1 else ""
                    note = "; ".join(x for x in (where + left.describe(precision), note) if x)
                if reference is None:  # never a blank that reads as checked
                    note = "; ".join(x for x in ("tokens not checked: hf-eager, the reference, left out", note) if x)
                rows.append({"system": name, "ttft_ms": f"{t_ms:.3f}", "ms_per_token": f"{pt_ms:.4f}",
                             "tokens_checked": n if reference else "",
                             "tokens_matched": min(matched) if reference else "",
                             "build_s": b_s, "note": note})
            for r in rows:
                r.update({"date": date, "device": device, "model": label, "batch": batch, "dtype": precision,
                          "kernels": args.kernels, "prompt_tokens": args.prompt, "new_tokens": args.new_tokens})
            append_rows(csv_path, rows, COLUMNS, defaults={})
            table += rows
            del model
            if gpu:
                torch.cuda.empty_cache()
    print(f"{'model':<14} {'dtype':<5} {'batch':>5} {'system':<20} {'TTFT ms':>9} {'ms/token':>9} {'match':>6}  note")
    for r in table:
        match = f"{r.get('tokens_matched', '')}/{r.get('tokens_checked', '')}" if r.get("tokens_checked") else ""
        print(f"{r['model']:<14} {r['dtype']:<5} {r['batch']:>5} {r['system']:<20} {r.get('ttft_ms', ''):>9} "
              f"{r.get('ms_per_token', ''):>9} {match:>6}  {r.get('note', '')}")
    with open(os.path.join(args.out, "generation-builds.json"), "w") as f:
        json.dump(builds, f, indent=1, default=str)
    if profiles:
        with open(os.path.join(args.out, "generation-kernels.json"), "w") as f:
            json.dump(profiles, f, indent=1)
        print(f"device time per token by kernel ({args.profile} tokens profiled):")
        for name, per_kernel in profiles.items():
            _print_profile(name, per_kernel)
    return 0
