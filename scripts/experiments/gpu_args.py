"""Not an experiment: what the GPU experiments beside it share (``import gpu_args``): the per-model command line,
--models, --target (cuda, or llvm for a CPU dry run), --out, and where an experiment measures several
batches and kernel kinds, --batch and --kernels; the command line and the timing of the experiments
that time vendor functions alone; the command line of the decoder A/B experiments (generation_ab_parser)."""
from __future__ import annotations

import argparse
import os


def parse(doc: str, argv, models: str, batches_and_kernels: bool = False, precision: bool = False, extend=None):
    """(the parsed arguments, the resolved target); the output directory exists afterwards. ``precision``: the
    experiment builds in the --precision given (fp32, tf32, fp16, bf16). ``extend``: called with the parser, to add
    the experiment's own arguments."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--models", default=models)
    if batches_and_kernels:
        ap.add_argument("--batch", default="1")
        ap.add_argument("--kernels", default="vendor", choices=["tvm", "vendor", "best"])
    if precision:
        from tvm_nimble.relay_passes.precision import PRECISIONS

        ap.add_argument("--precision", default="fp32", choices=list(PRECISIONS))
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    ap.add_argument("--out", required=True)
    add_small(ap)
    if extend is not None:
        extend(ap)
    args = ap.parse_args(argv)
    from tvm_nimble.compiler.target import resolve_target

    os.makedirs(args.out, exist_ok=True)
    return args, resolve_target(args.target)


def add_small(ap: argparse.ArgumentParser) -> None:
    """--small: zoo: nets at the zoo's own size, not the benchmark's (a CPU dry run checks the plumbing)."""
    ap.add_argument("--small", action="store_true",
                    help="zoo: models at the zoo's own small size (for a CPU dry run, which checks the plumbing)")


def models_and_batches(args):
    """(spec, batch, name, ONNX model) for every --models spec at every --batch, each loaded (built from code for
    tv:/timm:/hf: names) when its turn comes."""
    from tvm_nimble.cli.models import load_model

    for spec in args.models.split(","):
        for batch in [int(b) for b in args.batch.split(",")]:
            yield (spec, batch, *load_model(spec, batch=batch, small=args.small))


def parse_kernel_bench(doc: str, argv, out: str, add_arguments=None):
    """The command line of the experiments that time vendor functions alone (attention_check, gemm_algos):
    --out (created) and --reps, and what ``add_arguments(parser)`` adds. Then builds (cached) and loads the vendor
    extension for this machine's GPU and turns PyTorch's TF32 off, as those experiments compare fp32 exactly."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=out)
    ap.add_argument("--reps", type=int, default=50)
    if add_arguments is not None:
        add_arguments(ap)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import torch

    from tvm_nimble.codegen.vendor_build import build_vendor_library
    from tvm_nimble.runtime.vendor import load_vendor_library

    torch.backends.cuda.matmul.allow_tf32 = False
    major, minor = torch.cuda.get_device_capability(0)
    load_vendor_library(build_vendor_library(f"sm_{major}{minor}"))
    return args


def back_to_back_us(fn, reps: int, rounds: int = 5) -> float:
    """Median microseconds per call of ``fn`` over ``reps`` calls queued behind a GPU sleep (about 1.7 ms
    on an H100), so the host's enqueue rate does not bound what is timed."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        torch.cuda._sleep(3_000_000)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def cuda_events(fn, reps: int) -> list:
    """Every GPU kernel (or copy) of ``reps`` calls of ``fn`` as CUPTI records it (torch.profiler), in start order:
    each with ``name`` and ``time_range`` (microseconds). No launch gaps and no event brackets in it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                  key=lambda e: e.time_range.start)


def kernel_us(fn, reps: int = 30) -> tuple[float, dict]:
    """GPU time per call of ``fn``'s kernels alone (:func:`cuda_events`): (microseconds per call, {kernel name:
    microseconds per call}); what a kernel costs inside a CUDA graph, where its launch overhead is hidden."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    names: dict[str, float] = {}
    for e in cuda_events(fn, reps):
        names[e.name] = names.get(e.name, 0.0) + e.time_range.elapsed_us() / reps
    return sum(names.values()), names


def graph_us(fn, n: int = 20, reps: int = 30) -> float:
    """Median microseconds per call of ``fn`` (PyTorch work) replayed as a CUDA graph of ``n`` calls: its GPU
    time, with no host launch cost in it."""
    import torch

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000 / n)
    return sorted(times)[len(times) // 2]


def generation_ab_parser(doc: str, out: str, repeats: int, rounds: int) -> argparse.ArgumentParser:
    """The command line the decoder A/B experiments share (pdl_edges, generator_ab): the decoders, their build
    (precision, kernels, target), the request (prompt, new tokens) and the alternation (repeats a round, rounds);
    each adds what it varies."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--models", default="hf:gpt2", help="comma-separated hf:NAME decoders")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--kernels", default="best")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--target", default="cuda")
    p.add_argument("--out", default=out)
    return p
