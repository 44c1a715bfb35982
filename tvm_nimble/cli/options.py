"""Command-line options shared by the tvm-nimble subcommands that parse their own arguments."""
from __future__ import annotations


def target_args(ap, default: str) -> None:
    """--target and --arch, as every command that builds or runs kernels spells them."""
    ap.add_argument("--target", choices=["cuda", "llvm"], default=default, help="build target (default %(default)s)")
    ap.add_argument("--arch", help="GPU arch for cuda, e.g. sm_90 (default: this machine's GPU)")
