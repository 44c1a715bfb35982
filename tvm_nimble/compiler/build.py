"""``tvm_nimble.build``: model in, one :class:`BuildResult` out (stage 1 -> stage 2).

Every consumer of a build reuses this result instead of re-running a stage: the executor
and ``export`` (plan, kernels, params), ``explain`` (assignment, program, lowered module),
and the registered ``nimble`` TVM pipeline (the same :func:`schedule` on the module TVM
hands it).
"""
from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import tvm

from tvm_nimble.codegen.kernels import build_kernels
from tvm_nimble.codegen.lower_plan import build_plan
from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes.annotate import annotate_function
from tvm_nimble.relay_passes.concat_in_place import ATTR_CONCATS_IN_PLACE, ConcatInPlace, FlattenConcats
from tvm_nimble.relay_passes.lowered_ir import LoweredProgram, read_lowered_function
from tvm_nimble.relay_passes.pipeline import kernel_passes
from tvm_nimble.relay_passes.stream_assignment import StreamAssignment
from tvm_nimble.runtime.module import NimbleModule

from .notes import note_once
from .target import local_gpu_arch, resolve_target, target_dict
from .timers import timer_for
from .tuning.database import open_tuning_database



@dataclass
class BuildResult(NimbleModule):
    """A :class:`NimbleModule` (plan, kernels, params: what runs and exports) plus the stages' products."""

    lowered: tvm.IRModule | None = None  # TVM kernel passes applied, before stream annotation
    program: LoweredProgram | None = None  # the kernel DAG read from ``lowered``
    assignment: StreamAssignment | None = None
    tvm_target: tvm.target.Target | None = None


def lower(mod: tvm.IRModule, target: tvm.target.Target, tuning_database=None,
          concat_in_place: bool = True) -> tvm.IRModule:
    """TVM's kernel passes (legalize, fuse, tuned database or DLight schedules, CallTIRRewrite), then,
    unless ``concat_in_place`` is off, concatenations built in place (:mod:`relay_passes.concat_in_place`)."""
    passes = kernel_passes(target, tuning_database)
    if concat_in_place:
        passes = [FlattenConcats()] + passes + [ConcatInPlace()]
    seq = tvm.transform.Sequential(passes)
    with target, (tuning_database if tuning_database is not None else contextlib.nullcontext()):
        return seq(mod)


def schedule(lowered: tvm.IRModule, target: tvm.target.Target, *, max_streams: int | None = None,
             reuse: str = "concurrent", costs=None):
    """Stream assignment, annotation and the launch plan of a lowered module; ``costs`` (one per kernel
    of the lowered program) make a stream cap cost-aware.

    Returns (annotated module, program, assignment, plan, params)."""
    program = read_lowered_function(lowered)
    func, assignment = annotate_function(lowered, max_streams=max_streams, program=program, costs=costs)
    annotated = lowered.clone()
    annotated["main"] = func
    plan, params = build_plan(annotated, target_dict(target), reuse=reuse)
    return annotated, program, assignment, plan, params


#: element-wise operators through which an index input keeps its meaning (the ONNX importer wraps
#: negative indices with less/where/add before the take)
_INDEX_PRESERVING = {"relax.astype", "relax.add", "relax.where", "relax.clip", "relax.maximum", "relax.minimum"}


def index_bounds(mod: tvm.IRModule) -> dict[str, int]:
    """Inputs of ``main`` used as indices of a ``take`` (ONNX Gather), directly or through element-wise
    arithmetic: input name -> the size of the indexed axis. The executor checks them with
    ``check_inputs=True``."""
    from tvm import relax

    func = mod["main"]
    origin = {p: p.name for p in func.params}  # var -> the input its values come from
    bounds: dict[str, int] = {}
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)):
                continue
            if v.op.name == "relax.take":
                data, idx = v.args
                name = origin.get(idx)
                shape = data.ty.shape if isinstance(data.ty, relax.TensorType) else None
                if name and shape is not None:
                    axis = int(v.attrs.axis) if v.attrs.axis is not None else 0
                    size = int(shape.values[axis % len(shape.values)])
                    bounds[name] = min(size, bounds.get(name, size))
            elif v.op.name in _INDEX_PRESERVING:
                names = {origin[a] for a in v.args if a in origin}
                if len(names) == 1:
                    origin[b.var] = names.pop()
    return bounds


def _as_relax(model, shape_dict):
    if isinstance(model, tvm.IRModule):
        return model
    from tvm_nimble.compiler.frontend import from_onnx

    return from_onnx(model, shape_dict=shape_dict)


KERNEL_CHOICES = ("auto", "tvm", "vendor", "best")


def resolve_kernels(kernels: str, target: tvm.target.Target, timer=None) -> str:
    """``auto``: on CUDA, ``best`` (each operator on cuDNN/cuBLASLt or TVM, whichever measured faster)
    when the vendor extension can be built and a GPU is here (or behind ``timer``'s RPC tracker) to
    measure on, ``vendor`` when there is none, TVM's kernels when the extension cannot be built; a
    one-line note says which and why."""
    if kernels not in KERNEL_CHOICES:
        raise NimbleError(f"kernels must be one of {KERNEL_CHOICES}, got {kernels!r}")
    if kernels != "auto":
        return kernels
    if target.kind.name != "cuda":
        return "tvm"
    from tvm_nimble.codegen.vendor_build import vendor_available

    ok, why = vendor_available()
    if not ok:
        note_once(f"vendor kernels unavailable, building with TVM's kernels: {why}")
        return "tvm"
    there = timer.arch() if timer is not None else local_gpu_arch()
    if there != str(target.attrs["arch"]):
        note_once(f"no {target.attrs['arch']} GPU {'here' if timer is None else 'at ' + timer.where} to time "
                  "cuDNN/cuBLAS against TVM's kernels: every convolution and GEMM goes to cuDNN/cuBLAS "
                  "(kernels='vendor'); build on that GPU, or measure there through an RPC tracker, for kernels='best'")
        return "vendor"
    return "best"


def vendor_library(target: tvm.target.Target) -> str:
    """The cuDNN/cuBLASLt extension for the target's arch, built (cached) and loaded in this process."""
    return _vendor_library(str(target.attrs["arch"]))


@functools.lru_cache(maxsize=None)
def _vendor_library(arch: str) -> str:
    """Once per arch and process: offload() needs it loaded, build() packages the same file."""
    from tvm_nimble.codegen.vendor_build import build_vendor_library
    from tvm_nimble.runtime.vendor import load_vendor_library

    path = build_vendor_library(arch)
    load_vendor_library(path)
    return path


def offload(mod: tvm.IRModule, target: tvm.target.Target, kernels: str, tuning_db: str | None = None,
            allow_tf32: bool = False, timer=None):
    """``mod`` with its convolutions, GEMMs and average pools on cuDNN / cuBLASLt (CUDA only): all of
    them (``kernels="vendor"``) or those whose vendor kernel measured faster than TVM's (``"best"``,
    TVM's tuned kernels when ``tuning_db`` is given); the vendor extension is built for the target's
    arch and loaded in this process. With ``best``, a mix of vendor and TVM kernels is kept only if the
    whole model, built one-stream both ways, confirms it is faster than all vendor kernels (see
    :class:`ModelCheck`). Returns (module, the :class:`KernelTiming` list, the :class:`ModelCheck` or
    None); both empty unless ``best``. ``timer`` is where ``best`` measures (:mod:`.timers`; default here)."""
    kernels = resolve_kernels(kernels, target, timer)
    if kernels == "tvm":
        return mod, [], None
    if target.kind.name != "cuda":
        raise NimbleError(f"vendor kernels (cuDNN / cuBLAS) need a CUDA target; use kernels='tvm' for {target.kind.name}")
    from tvm_nimble.relay_passes.vendor_offload import OffloadToVendor

    from .kernel_choice import check_in_model, check_measurable, measure_kernels

    if kernels == "best":
        timer = check_measurable(target, timer)  # before building anything for a GPU that is not there
    vendor_library(target)
    all_vendor = OffloadToVendor(allow_tf32=allow_tf32)(mod)
    if kernels == "vendor":
        return all_vendor, [], None
    timings = measure_kernels(mod, target, build, tuning_db, allow_tf32=allow_tf32, timer=timer)
    vendor = {t.signature for t in timings if t.kernel == "vendor"}
    if len(vendor) == len(timings):
        return all_vendor, timings, None
    chosen = OffloadToVendor(allow_tf32=allow_tf32, select=lambda o: o.signature in vendor)(mod)
    check = check_in_model(chosen, all_vendor, target, build, tuning_db, timer)
    if check.kept == "best":
        return chosen, timings, check
    for t in timings:
        t.kernel = "vendor"
    return all_vendor, timings, check


def build(model, target="llvm", params: dict | None = None, *, max_streams: int | str | None = "auto",
          shape_dict: dict | None = None, tuning_db: str | None = None, reuse: str = "concurrent",
          compile_kernels: bool = True, kernels: str = "auto", allow_tf32: bool = False,
          memory_budget: int | None = None, concat_in_place: bool = True, rpc_tracker: str | None = None,
          rpc_key: str | None = None) -> BuildResult:
    """Build ``model`` (a Relax IRModule, an ONNX ModelProto or a path to a .onnx file) with Nimble.

    ``max_streams`` caps the stream count: 1 gives the single-stream schedule, None Nimble's widest
    schedule, ``"auto"`` (default) the fastest of the caps 1, 2, 3, 4, 6, 8 and the widest, measured on
    this machine's GPU (see :mod:`.stream_choice`; the widest without a GPU here). ``memory_budget``
    (bytes) bounds the concurrency-safe memory pool: auto picks among the schedules that fit, and a
    fixed cap whose pool does not fit is an error. ``tuning_db``
    is a MetaSchedule database directory whose tuned kernels replace the default schedules.
    ``compile_kernels=False`` stops before code generation (what ``explain`` needs).
    ``kernels``: ``"vendor"`` runs convolutions, GEMMs and average pools on cuDNN / cuBLASLt (CUDA; see
    :func:`offload`), ``"best"`` each of them on cuDNN/cuBLASLt or TVM, whichever measured faster on
    this machine's GPU, ``"tvm"`` keeps TVM's kernels; ``"auto"`` (default, see :func:`resolve_kernels`)
    is best on a CUDA machine that can build the extension (nvcc and the nvidia-cudnn-cu13 /
    nvidia-cublas wheels), vendor without a GPU here, else tvm. ``allow_tf32`` lets cuDNN / cuBLASLt use
    TF32 tensor cores for fp32 (faster, about 1e-3 relative error; off by default, like PyTorch's
    ``allow_tf32=False`` baseline). ``concat_in_place`` (default on) lets the kernels feeding a
    concatenation write straight into their slice of it where the slices are contiguous (batch 1 along
    channels), which removes the concatenation's copy kernel; off, every concat is a kernel as in stock TVM.
    ``rpc_tracker`` (``HOST:PORT``) and ``rpc_key``: what ``best`` and ``auto`` measure runs on a GPU of an
    RPC server registered under that key (``tvm-nimble rpc-server``) instead of this machine's, so a
    machine without the GPU builds for it (see :mod:`.timers`).
    """
    t = resolve_target(target)
    timer = timer_for(rpc_tracker, rpc_key) if (rpc_tracker or rpc_key) else None
    mod = _as_relax(model, shape_dict)
    if params:
        mod = tvm.relax.transform.BindParams("main", params)(mod)
    kernels = resolve_kernels(kernels, t, timer)
    mod, timings, check = offload(mod, t, kernels, tuning_db, allow_tf32, timer)
    auto_streams = max_streams == "auto"
    if auto_streams:
        max_streams = None
    elif max_streams is not None and (not isinstance(max_streams, int) or max_streams < 1):
        raise NimbleError(f"max_streams must be an integer >= 1, None or 'auto', got {max_streams!r}")
    database = open_tuning_database(tuning_db) if tuning_db else None
    if database is None and t.kind.name == "cuda" and compile_kernels:
        note_once("building CUDA kernels without a tuning database: kernels use TVM's default "
                  "schedules (several times slower than tuned ones); see `tvm-nimble tune`", stacklevel=2)
    bounds = index_bounds(mod)
    lowered = lower(mod, t, database, concat_in_place)
    annotated, program, assignment, plan, consts = schedule(lowered, t, max_streams=max_streams, reuse=reuse)
    plan.index_bounds = bounds
    library = build_kernels(annotated, t) if compile_kernels else None
    info = {"max_streams": max_streams, "tuning_db": os.path.abspath(tuning_db) if tuning_db else None,
            "kernels": kernels, "allow_tf32": allow_tf32,
            "concats_in_place": int(lowered["main"].attrs.get(ATTR_CONCATS_IN_PLACE, 0)) if concat_in_place else 0}
    if timings:
        info["kernel_choice"] = [k.to_dict() for k in timings]
    if check is not None:
        info["kernel_choice_check"] = check.to_dict()
    uses_vendor = t.kind.name == "cuda" and plan.uses_vendor_kernels
    result = BuildResult(plan, library, consts, annotated, info, vendor_library(t) if uses_vendor else None,
                         lowered=lowered, program=program, assignment=assignment, tvm_target=t)
    if auto_streams:
        from .stream_choice import choose_streams

        result, record = choose_streams(result, schedule, reuse, memory_budget, timer)
        result.info["streams_choice"] = record
    elif memory_budget is not None and plan.memory["pool_bytes"] > memory_budget:
        raise NimbleError(f"the schedule's memory pool needs {plan.memory['pool_bytes']} bytes, over the budget of "
                          f"{memory_budget}: use max_streams='auto' (or fewer streams) to pick one that fits")
    return result
