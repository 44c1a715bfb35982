"""The one place a build target is resolved: kind, and for CUDA the GPU arch.

The arch comes from the caller (``{"kind": "cuda", "arch": "sm_90"}``, ``--arch sm_90``),
else from the GPU of this machine; without either, a one-line error asks for it. There is no
silent default: kernels built for the wrong arch fail only where they are loaded.
"""
from __future__ import annotations

import tvm

from tvm_nimble import env
from tvm_nimble.errors import NimbleError

#: Limits MetaSchedule needs in a CUDA target; the same for every sm_50+ GPU.
CUDA_LIMITS = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 49152, "thread_warp_size": 32,
               "registers_per_block": 65536}

_NEEDS_ARCH = ("a CUDA target needs the GPU arch and this machine has no GPU to read it from: pass "
               "{'kind': 'cuda', 'arch': 'sm_90'} (--arch sm_90 on the command line)")
#: what TVM puts in a CUDA Target made without an arch where it detects no GPU ("Unable to detect CUDA
#: version, default to -arch=sm_50"): a Target("cuda") then builds for a 2014 Maxwell GPU, silently
_TVM_FALLBACK_ARCH = "sm_50"
#: every form a target may take, as the errors about a target name them
ACCEPTED_TARGETS = ("'llvm', 'cuda', a string such as 'cuda -arch=sm_90', a dict like {'kind': 'cuda', 'arch': "
                    "'sm_90'} or a tvm.target.Target")


def local_gpu_arch() -> str | None:
    """``sm_XY`` of this machine's first CUDA GPU, or None without one."""
    from tvm_nimble.runtime.device import gpu_arch

    return gpu_arch()


def default_kind() -> str:
    """``cuda`` when this machine has a GPU, else ``llvm`` (what the demo and benchmarks build for)."""
    return "cuda" if local_gpu_arch() else "llvm"


def _as_dict(target) -> dict:
    if isinstance(target, str):
        if not target.strip():
            raise NimbleError(f"the target is an empty string: give one of {ACCEPTED_TARGETS}")
        kind, *rest = target.split()
        spec = {"kind": kind}
        for opt in rest:
            key, _, val = opt.lstrip("-").partition("=")
            spec[key] = int(val) if val.isdigit() else val  # "-opt-level=1": TVM's integer options take ints
        return spec
    if isinstance(target, dict) and "kind" in target:
        return dict(target)
    raise NimbleError(f"target must be {ACCEPTED_TARGETS}, got {target!r}")


def resolve_target(target, arch: str | None = None) -> tvm.target.Target:
    """A ``tvm.target.Target`` from 'cuda', 'llvm', 'cuda -arch=sm_90', a dict or a Target.

    For CUDA the arch is: the target's own, else ``arch``, else this machine's GPU, else an error.
    """
    if isinstance(target, tvm.target.Target):
        t = target
    else:
        spec = _as_dict(target)
        if spec.get("kind") == "cuda":
            spec["arch"] = spec.get("arch") or arch or local_gpu_arch()
            if not spec["arch"]:
                raise NimbleError(_NEEDS_ARCH)
            spec = {**CUDA_LIMITS, **spec}
        level = env.llvm_opt_level() if spec.get("kind") == "llvm" and "opt-level" not in spec else None
        if level is not None:
            spec["opt-level"] = level
        if spec.get("kind") not in ("cuda", "llvm"):
            raise NimbleError(f"target kind {spec.get('kind')!r} is not supported: give {ACCEPTED_TARGETS}")
        try:
            t = tvm.target.Target(spec)
        except Exception as err:
            raise NimbleError(f"invalid target {spec!r}: {str(err).splitlines()[0]}") from None
    if t.kind.name not in ("cuda", "llvm"):
        raise NimbleError(f"target kind {t.kind.name!r} is not supported: give {ACCEPTED_TARGETS}")
    if t.kind.name == "cuda" and not t.attrs.get("arch"):
        raise NimbleError(_NEEDS_ARCH)
    if (isinstance(target, tvm.target.Target) and t.kind.name == "cuda"
            and str(t.attrs["arch"]) == _TVM_FALLBACK_ARCH and local_gpu_arch() != _TVM_FALLBACK_ARCH):
        # tvm.target.Target("cuda") here: TVM's stand-in arch, not the caller's (a dict or string keeps theirs)
        raise NimbleError(f"the CUDA target was made without a GPU arch (TVM filled in {_TVM_FALLBACK_ARCH}, its "
                          "stand-in when it detects no GPU): give the arch, e.g. "
                          "tvm.target.Target({'kind': 'cuda', 'arch': 'sm_90'}) or the tag 'nimble/h100'")
    return t


def target_dict(t: tvm.target.Target) -> dict:
    """The plain form recorded in plans and artifacts."""
    d = {"kind": t.kind.name}
    if t.kind.name == "cuda":
        d["arch"] = str(t.attrs["arch"])
    return d
