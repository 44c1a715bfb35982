"""Compile the kernels (the PrimFuncs) of a stream-annotated module into one runtime library."""
from __future__ import annotations

import contextlib

import tvm
from tvm import relax

from .cuda_compile import fatbin_compilation
from .dependent_launch import tvm_kernels_wait


def kernel_module(mod: tvm.IRModule) -> tvm.IRModule:
    """The module's PrimFuncs with their global symbols: exactly what the plan launches."""
    mod = relax.transform.AttachGlobalSymbol()(mod)
    return tvm.IRModule({gv: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)})


def build_kernels(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Module:
    """Build every PrimFunc; on CUDA the device code is a fatbin for the target's arch, and on sm_90+ every kernel
    begins by waiting for the kernels it depends on (``dependent_launch``: the plan's ``dependent_launch``)."""
    cuda = target.kind.name == "cuda"
    with fatbin_compilation(target) if cuda else contextlib.nullcontext(), tvm_kernels_wait(target):
        return tvm.tirx.build(kernel_module(mod), target=target)
