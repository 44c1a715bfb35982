"""Programmatic dependent launch for TVM's kernels: each begins by waiting for the kernels before it.

On Hopper (sm_90) and later a kernel may be launched while the kernel it depends on still runs, if it waits for it
itself (``griddepcontrol.wait``, PTX ISA 9.7.15.14) before it touches memory; and a running kernel lets its
dependents in early with ``griddepcontrol.launch_dependents``. Launched so, a chain of small kernels overlaps each
launch's latency with the kernel before it: a decode step is hundreds of them. Our vendor kernels are written so
(``codegen/vendor/common.h``, ``KernelLaunch::Pdl``). TVM's CUDA code generator emits neither instruction, and its
runtime launches without the launch attribute; so here (1) every kernel of TVM's CUDA source gets both
instructions at its start (``tvm_callback_cuda_postproc``, TVM's hook for the generated source: the wait first, so
nothing is read or written before the kernels it depends on are complete and their writes visible), and (2) the
plan says so (``Plan.dependent_launch``), and the runtime, capturing the plan into a CUDA graph, makes the edges
into those kernels programmatic (``tvm_nimble.runtime.cuda_graph``). Launched without such an edge, the two
instructions do nothing.
"""
from __future__ import annotations

import contextlib
import re

import tvm
import tvm_ffi

#: what every kernel of TVM's source begins with (a no-op below sm_90, where the instructions do not exist)
PROLOGUE = ('\n#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)\n'
            '  asm volatile("griddepcontrol.wait;" ::: "memory");\n'
            '  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");\n'
            '#endif\n')

#: a kernel definition's head up to its body's opening brace (a declaration ends in ';' and does not match)
_KERNEL_HEAD = re.compile(r'extern\s+"C"\s+__global__\s[^;{]*\)\s*\{')


def supported(target) -> bool:
    """Whether ``target`` (a TVM target or a target dict) is a CUDA target of sm_90 or later."""
    if isinstance(target, dict):
        kind, arch = target.get("kind"), target.get("arch")
    else:
        kind, arch = target.kind.name, target.attrs.get("arch")
    digits = "".join(ch for ch in str(arch or "") if ch.isdigit())
    return kind == "cuda" and bool(digits) and int(digits) >= 90


def waiting_first(code: str) -> str:
    """``code`` (CUDA source) with :data:`PROLOGUE` at the start of every ``extern "C" __global__`` kernel."""
    return _KERNEL_HEAD.sub(lambda m: m.group(0) + PROLOGUE, code)


@contextlib.contextmanager
def tvm_kernels_wait(target: tvm.target.Target):
    """Within this context, the CUDA source TVM generates for ``target`` has :func:`waiting_first` applied (when
    :func:`supported`); TVM's own post-processing callback, if one was registered, runs first."""
    if not supported(target):
        yield
        return
    name = "tvm_callback_cuda_postproc"
    previous = tvm_ffi.get_global_func(name, allow_missing=True)

    def postproc(code, *rest):
        return waiting_first(str(previous(code, *rest)) if previous is not None else str(code))

    tvm_ffi.register_global_func(name, postproc, override=True)
    try:
        yield
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(name, previous, override=True)
        else:
            tvm_ffi.registry.remove_global_func(name)
