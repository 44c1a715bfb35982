"""``tvm-nimble prepare``: what a machine compiles once for every later CUDA build, done ahead of the first one.

A first ``kernels="vendor"`` or ``"best"`` build on a fresh machine compiles the vendor extension's units (cuDNN,
cuBLASLt and our kernels: about a minute of nvcc on an H100 host, minutes on a small CPU), and a first fp16 or
bf16 build parses TVM's tensor-core intrinsics. Both are kept per machine (``~/.cache/tvm-nimble/vendor``,
``.../tvmscript``); this command makes them now, with a progress bar, so that no build waits on them.
``make install`` runs it on a machine with a GPU.
"""
from __future__ import annotations

import os
import time


def add_arguments(p) -> None:
    p.add_argument("--arch", help="GPU arch to compile for, e.g. sm_90 (default: this machine's GPU)")
    p.add_argument("--kernels", metavar="PREFIX,...",
                   help="only the vendor units defining these functions (e.g. nimble.cublas,nimble.cudnn_graph; "
                        "default: every unit)")


def run(args) -> None:
    from tqdm import tqdm

    from tvm_nimble.codegen.vendor_build import Toolchain, build_vendor_library, units_for, vendor_available
    from tvm_nimble.compiler.target import local_gpu_arch
    from tvm_nimble.errors import NimbleError
    from tvm_nimble.relay_passes.tvm_compat import import_tensor_intrinsics, tvmscript_cache_path

    arch = args.arch or local_gpu_arch()
    if not arch:
        raise NimbleError("no GPU here to read the arch from: give --arch (sm_90 for H100 and H200, sm_80 for A100)")
    available, why = vendor_available()
    if not available:
        raise NimbleError(f"the vendor extension cannot be built here: {why}")
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()] if args.kernels else None
    units = units_for(kernels)  # (an unknown name: its one line, listing the functions)

    t0 = time.perf_counter()
    import_tensor_intrinsics()
    print(f"TVM's tensor intrinsics: parsed and kept in {tvmscript_cache_path()} ({time.perf_counter() - t0:.1f} s)")

    tools = Toolchain.find(arch)
    missing = [u for u in units if not os.path.exists(tools.object_path(u))]
    t0 = time.perf_counter()
    with tqdm(total=len(missing), desc=f"vendor extension for {tools.arch}", unit="unit", disable=not missing) as bar:
        def compiled(unit) -> None:
            bar.set_postfix_str(unit.name)
            bar.update(1)

        path = build_vendor_library(arch, kernels=kernels, on_compiled=compiled)
    print(f"vendor extension for {tools.arch}: {len(missing)} of {len(units)} units compiled "
          f"({time.perf_counter() - t0:.1f} s): {path}")
