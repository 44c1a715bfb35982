"""``kernels="best"``: per offloadable operator, cuDNN/cuBLASLt or TVM's kernel, whichever is faster here.

Both kernels of every distinct chain are timed on this machine's GPU, in graph mode, inside the
probe module (``relay_passes.kernel_probe``): built once with TVM's kernels (tuned ones when a
database is given) and once with the vendor offload, each replayed as a one-stream CUDA graph with
an event pair around every launch. A chain's time is the sum over the launches that feed its
output (TVM may need two kernels where the vendor needs one, e.g. a padding and a convolution).
Each launch's bracket adds the same small cost on both sides. Measurements are kept per process,
keyed by arch, tuning database and signature, so the stock-TVM baseline and the single-stream
build of a benchmark reuse the choice of the first build.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import tvm
import tvm_ffi

from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes.kernel_probe import build_probe
from tvm_nimble.runtime.plan import Plan

from .timers import LocalGPU

#: profiled replays per build; the median per launch is kept
PROFILE_REPS = 15

_measured: dict[tuple, tuple[float, float]] = {}  # (arch, tuning db, where, signature) -> (vendor_ms, tvm_ms)


@dataclass
class KernelTiming:
    """One distinct offloadable chain: how often the model has it, both kernels' measured times, and
    the kernel it got (the faster one, unless the whole-model check overruled the choice)."""

    signature: str
    count: int
    vendor_ms: float
    tvm_ms: float
    kernel: str = ""

    def __post_init__(self):
        self.kernel = self.kernel or ("vendor" if self.vendor_ms <= self.tvm_ms else "tvm")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ModelCheck:
    """The per-chain choice against all-vendor kernels, both as whole one-stream CUDA graphs: a chain
    timed alone can fuse differently inside the model (TVM fuses a following element-wise op into
    its convolution; the vendor call does not), so the mix is kept only where the model confirms it."""

    best_ms: float
    vendor_ms: float

    @property
    def kept(self) -> str:
        return "best" if self.best_ms < self.vendor_ms else "vendor"

    def to_dict(self) -> dict:
        return {**asdict(self), "kept": self.kept}


def launches_per_output(plan: Plan) -> list[list[int]]:
    """For each output of ``plan``: the launches its value depends on (backward through the data flow)."""
    writers_of: dict[int, list[int]] = {}
    for w, r in plan.read_after_write():
        writers_of.setdefault(r, []).append(w)
    result = []
    for out in plan.outputs:
        root = plan.root(out)
        stack = [l.idx for l in plan.launches if any(plan.root(t) == root for t in l.writes)]
        seen: set[int] = set()
        while stack:
            idx = stack.pop()
            if idx not in seen:
                seen.add(idx)
                stack.extend(writers_of.get(idx, ()))
        result.append(sorted(seen))
    return result


def _per_output_ms(result, reps: int, timer) -> list[float]:
    """Graph-mode time of the launches behind each output of a built probe, on ``timer``'s GPU."""
    per_launch = timer.launch_ms(result, reps)
    return [sum(per_launch[i] for i in launches) for launches in launches_per_output(result.plan)]


_checked: dict[tuple, ModelCheck] = {}


def check_in_model(chosen: tvm.IRModule, all_vendor: tvm.IRModule, target: tvm.target.Target, build,
                   tuning_db: str | None = None, timer=None) -> ModelCheck:
    """Both modules (already offloaded) built one-stream and replayed, side by side, on ``timer``'s GPU
    (default: this machine's)."""
    timer = timer or LocalGPU()
    key = (str(target.attrs["arch"]), tuning_db, timer.where, tvm_ffi.structural_hash(chosen),
           tvm_ffi.structural_hash(all_vendor))
    if key not in _checked:
        built = [build(m, target, max_streams=1, kernels="tvm", tuning_db=tuning_db) for m in (chosen, all_vendor)]
        _checked[key] = ModelCheck(*timer.replay_ms(built))
    return _checked[key]


def check_measurable(target: tvm.target.Target, timer=None):
    """``timer`` (default: this machine's GPU) if it has a GPU of ``target``'s arch, else a one-line error."""
    if target.kind.name != "cuda":
        raise NimbleError("kernels='best' measures on a CUDA GPU; use kernels='tvm' for llvm")
    timer = timer or LocalGPU()
    arch = str(target.attrs["arch"])
    there = timer.arch()
    if there != arch:
        fix = ("build there, measure there through an RPC tracker (rpc_tracker=, rpc_key=), or use kernels='vendor' "
               "or 'tvm'") if isinstance(timer, LocalGPU) else "start the key's servers on such a GPU, or use another key"
        raise NimbleError(f"kernels='best' times the kernels on a {arch} GPU, and {timer.where} has "
                          f"{'a ' + there if there else 'none'}; {fix}")
    return timer


def measure_kernels(mod: tvm.IRModule, target: tvm.target.Target, build, tuning_db: str | None = None,
                    reps: int = PROFILE_REPS, allow_tf32: bool = False, timer=None) -> list[KernelTiming]:
    """Both kernels' times for every distinct offloadable chain of ``mod``, measured on ``timer``'s GPU
    (default: this machine's; a :class:`~.timers.RemoteGPU` measures through an RPC tracker).
    ``build`` is :func:`tvm_nimble.compiler.build.build` (passed in: this module sits below it)."""
    timer = check_measurable(target, timer)
    arch = str(target.attrs["arch"])
    probe = build_probe(mod, allow_tf32=allow_tf32)
    if probe is None:
        return []
    db = os.path.abspath(tuning_db) if tuning_db else None
    keys = [(arch, db, timer.where, s) for s in probe.signatures]
    if any(k not in _measured for k in keys):
        times = {}
        for kernels in ("vendor", "tvm"):
            built = build(probe.mod, target, max_streams=1, kernels=kernels, tuning_db=tuning_db,
                          allow_tf32=allow_tf32)
            times[kernels] = _per_output_ms(built, reps, timer)
        for k, v, t in zip(keys, times["vendor"], times["tvm"]):
            _measured[k] = (v, t)
    return [KernelTiming(s, n, *_measured[k]) for s, n, k in zip(probe.signatures, probe.counts, keys)]


def from_info(info: dict) -> tuple[list[KernelTiming], ModelCheck | None]:
    """The timings and the model check back from a build's ``info`` (as saved in an artifact)."""
    check = info.get("kernel_choice_check")
    return ([KernelTiming(**c) for c in info.get("kernel_choice", [])],
            ModelCheck(check["best_ms"], check["vendor_ms"]) if check else None)


def summarize(timings: list[KernelTiming], check: ModelCheck | None = None) -> str:
    """One line: which kernel measured faster for how many operators, the kernel time of each choice,
    the model check, and the kernels the plan got."""
    faster_tvm = sum(t.count for t in timings if t.tvm_ms < t.vendor_ms)
    n = sum(t.count for t in timings)
    total = {k: sum(t.count * getattr(t, f"{k}_ms") for t in timings) for k in ("vendor", "tvm")}
    best = sum(t.count * min(t.vendor_ms, t.tvm_ms) for t in timings)
    line = (f"kernel choice: cuDNN/cuBLAS measured faster for {n - faster_tvm} operators, TVM for {faster_tvm}; "
            f"kernel time {best:.3f} ms with the faster of each (all vendor {total['vendor']:.3f} ms, "
            f"all TVM {total['tvm']:.3f} ms)")
    if check is not None:
        line += (f"; whole model, one stream: that mix {check.best_ms:.3f} ms, all vendor {check.vendor_ms:.3f} ms")
    on_tvm = sum(t.count for t in timings if t.kernel == "tvm")
    return line + f"; in the plan: {n - on_tvm} on cuDNN/cuBLAS, {on_tvm} on TVM"
