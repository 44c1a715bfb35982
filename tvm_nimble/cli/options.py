"""Command-line options shared by the tvm-nimble subcommands: the target, and the build options.

The build options are spelled here once, for every command that builds (``compile``, ``explain``), and
become the keywords of :class:`tvm_nimble.compiler.options.BuildOptions` (:func:`build_options`), which
checks them.
"""
from __future__ import annotations

import argparse


def target_args(ap, default: str) -> None:
    """--target and --arch, as every command that builds or runs kernels spells them."""
    ap.add_argument("--target", choices=["cuda", "llvm"], default=default, help="build target (default %(default)s)")
    ap.add_argument("--arch", help="GPU arch for cuda, e.g. sm_90 (default: this machine's GPU)")


def max_streams_arg(text: str):
    if text in ("auto", "max"):
        return None if text == "max" else text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, 'max' or 'auto', got {text!r}")
    return value


def bytes_arg(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    try:
        value = int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a byte count such as 67108864, 64M or 2G, got {text!r}")
    return value


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.split(",") if n)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive batch sizes such as 1,2,4,8, got {text!r}")
    return sizes


def _bucket(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, sizes = text.partition("=")
    try:
        parsed = tuple(int(n) for n in sizes.split(",") if n.strip())
    except ValueError:
        parsed = ()
    if not sep or not name.strip() or not parsed or min(parsed) < 1:
        raise argparse.ArgumentTypeError(f"expected a dimension name and its sizes such as sequence_length=16,32,64, "
                                         f"got {text!r}")
    return name.strip(), parsed


def build_option_args(p) -> None:
    """The flags of every build option (see ``BuildOptions``)."""
    from tvm_nimble.compiler.options import KERNEL_CHOICES
    from tvm_nimble.relay_passes.precision import KEEP_FP32, PRECISIONS

    p.add_argument("--max-streams", type=max_streams_arg, default="auto",
                   help="cap the number of streams: N (1 = single stream), 'max' (Nimble's widest schedule) or "
                        "'auto' (default: the fastest cap measured on this GPU; the widest without one)")
    p.add_argument("--memory-budget", type=bytes_arg, metavar="BYTES",
                   help="largest concurrency-safe memory pool allowed, e.g. 64M or 2G (with auto: the fastest "
                        "schedule that fits)")
    p.add_argument("--kernels", choices=KERNEL_CHOICES, default="auto",
                   help="convolutions/GEMMs/average pools on the kernel providers, cuDNN/cuBLASLt (vendor), TVM's "
                        "kernels (tvm), each on whichever measured fastest on this machine's GPU (best), or auto "
                        "(the default): best on a CUDA machine, vendor when no GPU is here, tvm without the "
                        "cuDNN/cuBLAS wheels")
    providers_arg(p)
    merge_arg(p)
    layout_arg(p)
    p.add_argument("--precision", default="fp32", metavar="|".join(PRECISIONS),
                   help="fp32 (default), tf32 (fp32 with TF32 tensor cores), fp16 or bf16: convolutions and GEMMs "
                        f"in the reduced dtype, {', '.join(KEEP_FP32[:4])}, ... in float32, the rest following "
                        "its inputs; inputs and outputs keep the model's dtypes")
    p.add_argument("--keep-fp32", type=_names, default=(), metavar="OP,...",
                   help="more operators to keep in float32 under fp16/bf16, e.g. matmul")
    p.add_argument("--max-error", type=float, metavar="X",
                   help="fail the build when its relative L2 error against float32 (measured on seeded inputs) "
                        "is over X, e.g. 1e-2")
    p.add_argument("--allow-tf32", action="store_true",
                   help="let cuDNN/cuBLASLt use TF32 tensor cores for fp32 (faster, ~1e-3 relative error; off by default)")
    p.add_argument("--tuning-db", help="MetaSchedule database directory (from `tvm-nimble tune`)")
    p.add_argument("--rpc-tracker", metavar="HOST:PORT", help="time --kernels best and --max-streams auto on a GPU "
                   "behind this RPC tracker (servers started with `tvm-nimble rpc-server`), not on this machine")
    p.add_argument("--rpc-key", help="the key those servers registered under (e.g. h100)")
    timing_cache_arg(p)
    p.add_argument("--batch-sizes", type=_sizes, metavar="N,...",
                   help="one plan per batch size, e.g. 1,2,4,8, in one artifact with the weights once; its executor "
                        "takes any batch (the smallest bucket that holds it, padded; larger ones split)")
    p.add_argument("--buckets", type=_bucket, action="append", metavar="NAME=N,...",
                   help="one plan per size of the model's named (dim_param) dimension NAME, e.g. "
                        "sequence_length=16,32,64; repeat it for several dimensions (every combination is built), "
                        "e.g. --buckets batch=1,2; one artifact with the weights once, whose executor pads an input "
                        "to the smallest bucket that holds it")


def providers_arg(p) -> None:
    """--providers, for every command that builds (compile, explain, bench): the list read from the registry."""
    from tvm_nimble.relay_passes import providers

    every = [q for q in providers.registered() if q.name != providers.TVM]
    by_default = ", ".join(q.name for q in every if q.by_default)
    when_named = ", ".join(q.name for q in every if not q.by_default)
    p.add_argument("--providers", type=_names, metavar="NAME,...",
                   help=f"the kernel providers besides TVM that may take operators (default: {by_default}; "
                        f"used only when named: {when_named}; +NAME adds NAME to the default ones, e.g. +tf32x3)")


def merge_arg(p) -> None:
    """--merge, for every command that builds (compile, explain, bench)."""
    from tvm_nimble.compiler.options import MERGE_CHOICES

    p.add_argument("--merge", choices=MERGE_CHOICES, default="off",
                   help="sibling convolutions / GEMMs of one input (Inception's 1x1s, BERT's Q/K/V) as one operator "
                        "each: off (default), on, or auto (merged where that measured faster than separate and "
                        "concurrent on this GPU; separate without one)")


def layout_arg(p) -> None:
    """--layout, for every command that builds (compile, explain, bench)."""
    from tvm_nimble.relay_passes.layout import LAYOUTS

    p.add_argument("--layout", choices=LAYOUTS, default="auto",
                   help="the activations' layout inside the build: nchw (the model's), nhwc (convolutions and pools "
                        "channels-last, for cuDNN's tensor cores; inputs and outputs keep the model's layout), or "
                        "auto (default: nhwc for tf32/fp16/bf16 builds on a GPU with vendor kernels, else nchw)")


def timing_cache_arg(p) -> None:
    """--timing-cache, for every command that builds (compile, explain, bench)."""
    p.add_argument("--timing-cache", metavar="DIR|off", help="keep what --kernels best and --max-streams auto "
                   "measure on this GPU in DIR for later builds (default: ~/.cache/tvm-nimble/timings, or under "
                   "$XDG_CACHE_HOME), or 'off' to measure everything again")


def timing_cache_option(args) -> dict:
    """``{"timing_cache": ...}`` when --timing-cache was given, else {} (the option's default)."""
    value = getattr(args, "timing_cache", None)
    return {} if value is None else {"timing_cache": value}


def build_options(args) -> dict:
    """The build options of parsed ``args``, as ``build`` / ``explain_model`` take them."""
    return {"max_streams": args.max_streams, "memory_budget": args.memory_budget, "kernels": args.kernels,
            "providers": args.providers, "precision": args.precision, "allow_tf32": args.allow_tf32,
            "keep_fp32": args.keep_fp32, "max_error": args.max_error,
            "tuning_db": args.tuning_db, "rpc_tracker": args.rpc_tracker, "rpc_key": args.rpc_key,
            "batch_sizes": getattr(args, "batch_sizes", None), "buckets": getattr(args, "buckets", None), "merge": args.merge, "layout": args.layout,
            **timing_cache_option(args)}
