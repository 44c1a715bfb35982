"""Not an experiment: the command line the per-model GPU experiments beside it share (``import gpu_args``):
--models, --target (cuda, or llvm for a CPU dry run), --out, and where an experiment measures several
batches and kernel kinds, --batch and --kernels."""
from __future__ import annotations

import argparse
import os


def parse(doc: str, argv, models: str, batches_and_kernels: bool = False):
    """(the parsed arguments, the resolved target); the output directory exists afterwards."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--models", default=models)
    if batches_and_kernels:
        ap.add_argument("--batch", default="1")
        ap.add_argument("--kernels", default="vendor", choices=["tvm", "vendor", "best"])
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from tvm_nimble.compiler.target import resolve_target

    os.makedirs(args.out, exist_ok=True)
    return args, resolve_target(args.target)
