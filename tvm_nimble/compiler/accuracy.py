"""The accuracy report of a build that changes precision: how far its outputs are from float32.

The reference is the same model in float32 run by stock TVM (its default kernels, no Nimble pass) on
the build's target; the inputs are seeded, and a report counts only when the reference's output
depends on the input (a random-init model can collapse to a constant, and then every build agrees).

Building that reference is a whole stock TVM build (10-17 s of an H100's cold fp16 build of googlenet,
inception_v3 or resnet50), so its outputs are kept in the build session's cache (:mod:`.session`, kind
``fp32_reference``), keyed by the float32 module's structural hash (its weights included), the seeds and the
inputs' shapes: the next build of the same model on the same GPU, in any precision, measures its error against
them. Where they are not cached, a CUDA build compiles the reference in a child process from its start
(:func:`start_reference`, :mod:`.reference_build`), beside the kernel choice, instead of after it.

A build whose outputs hold NaN or infinity where float32's are finite (an fp16 overflow) fails, with or without
``max_error``: its relative L2 error is NaN, which no bound compares above.
"""
from __future__ import annotations

import base64

import numpy as np
import tvm

from tvm_nimble.errors import NimbleError

from .report import Accuracy


#: seeds of the inputs the error is measured on
SEEDS = (0, 1)
#: the timing-cache kind of the reference outputs
REFERENCE_KIND = "fp32_reference"
#: reference outputs larger than this (bytes, all seeds) are computed at every build, not cached
MAX_CACHED_BYTES = 8 << 20


def rel_l2(out: list, ref: list) -> float:
    """Relative L2 error of ``out`` against ``ref`` (all outputs together; inf against a zero reference)."""
    num = sum(float(np.sum((np.asarray(o, np.float64) - np.asarray(r, np.float64)) ** 2)) for o, r in zip(out, ref))
    den = sum(float(np.sum(np.asarray(r, np.float64) ** 2)) for r in ref)
    return (num / den) ** 0.5 if den > 0 else float("inf")


def unmeasurable(options) -> str | None:
    """Why this machine cannot run a build for ``options.target``, or None when it can."""
    from .target import local_gpu_arch

    if options.is_cuda and (options.rpc_tracker or local_gpu_arch() != options.arch):
        return f"no GPU of the target's arch ({options.arch}) on this machine"
    return None


def _why_not(options) -> str | None:
    """Why a build with ``options`` gets no measured error, as far as the options say (see :func:`report`)."""
    if not options.compile_kernels:
        return "kernels were not compiled"
    return unmeasurable(options)


def start_reference(model, shape_dict: dict | None, fp32_mod: tvm.IRModule, session, background: bool | None = None,
                    bucket=None):
    """The reference of a build of ``model`` (imported as ``fp32_mod`` with ``shape_dict``, or as ``bucket``, a
    :class:`.reference_build.BucketImport`, says) being compiled by a child process
    (:class:`.reference_build.PendingReference`), where the accuracy stage will need it and the session's cache does
    not have it; else None. ``background``: whether to (default: for a CUDA target, whose reference takes seconds
    of nvcc)."""
    if not in_background(session.options, background):
        return None
    key = reference_key(fp32_mod, session)
    if key is None or session.cached(key, valid=lambda value: _decoded(value) is not None) is not None:
        return None
    from .reference_build import start

    return start(model, shape_dict, fp32_mod, session.target, session.module_hash(fp32_mod), bucket=bucket)


def in_background(options, background: bool | None = None) -> bool:
    """Whether a build with ``options`` compiles its reference in a child process (:func:`start_reference`)."""
    if background is None:
        background = options.is_cuda
    return bool(background) and options.precision != "fp32" and options.kv_cache is None and not _why_not(options)


def report(fp32_mod: tvm.IRModule | None, result, session, pending=None) -> Accuracy:
    """The accuracy stage of a build session: the report of ``result`` against ``fp32_mod``, measured where the
    build's target can run here; else the reason it is not. ``pending``: :func:`start_reference`'s."""
    options = session.options
    why = _why_not(options)
    if fp32_mod is None:
        why = "the build started from a kernel selection, not the model"
    elif result.plan.states:
        why = "a step of generation (its KV cache is state): the generator checks its logits"
    if why is not None:
        if pending is not None:
            pending.cancel()
        return Accuracy(options.precision, None, why=why)
    return measure(fp32_mod, result, tvm.cuda(0) if options.is_cuda else tvm.cpu(), session, pending)


def measure(fp32_mod: tvm.IRModule, result, device, session, pending=None) -> Accuracy:
    """The error of ``result`` (the largest relative L2 over :data:`SEEDS`), whether the reference depends on the
    input, whether it came from the cache, and how many output values are NaN or infinite where the reference's
    are finite. The reference comes from (and goes to) ``session``'s cache, else from ``pending`` (a child's
    build of it), else it is built here."""
    from tvm_nimble.runtime.loading import NimbleExecutor
    from tvm_nimble.runtime.timing import random_inputs

    target = result.options.target
    inputs = [random_inputs(result.plan, seed) for seed in SEEDS]
    refs, cached = reference_outputs(fp32_mod, inputs, session, device, pending)
    executor = NimbleExecutor(result, device=device)
    outs = [[o.numpy() for o in executor(*x)] for x in inputs]
    errors = [rel_l2(out, ref) for out, ref in zip(outs, refs)]
    spread = rel_l2(refs[1], refs[0])
    non_finite = sum(int(np.sum(~np.isfinite(o) & np.isfinite(r))) for out, ref in zip(outs, refs)
                     for o, r in zip(out, ref))
    return Accuracy(result.options.precision, max(errors), seeds=len(SEEDS),
                    reference=f"float32, stock TVM on {target.kind.name}", input_dependent=spread > 10 * max(errors),
                    reference_cached=cached, non_finite=non_finite)


def _input_specs(mod: tvm.IRModule) -> list | None:
    """[[shape, dtype]] of ``mod``'s ``main`` parameters (the model's inputs), None where a shape is not static."""
    specs = []
    for p in mod["main"].params:
        ty = p.ty
        if not isinstance(ty, tvm.relax.TensorType) or not isinstance(ty.shape, tvm.relax.ShapeExpr) \
                or not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
            return None
        specs.append([[int(d) for d in ty.shape.values], str(ty.dtype)])
    return specs


def reference_key(fp32_mod: tvm.IRModule, session, inputs: list | None = None):
    """The cache key of the reference outputs of ``fp32_mod`` on :data:`SEEDS`' inputs: the inputs' shapes and
    dtypes from the module's parameters (from ``inputs``, the arrays, where those are not static; None without)."""
    specs = _input_specs(fp32_mod)
    if specs is None:
        if inputs is None:
            return None
        specs = [[list(np.shape(x)), str(np.asarray(x).dtype)] for x in inputs[0]]
    return session.key(REFERENCE_KIND, fp32_mod, seeds=list(SEEDS), inputs=[specs for _ in SEEDS])


def reference_outputs(fp32_mod: tvm.IRModule, inputs: list, session, device, pending=None) -> tuple[list, bool]:
    """(stock TVM's float32 outputs of ``fp32_mod`` on each input list of ``inputs``, whether they came from the
    session's cache). Computed outputs are kept there for the next build (up to :data:`MAX_CACHED_BYTES`); the
    stock build is ``pending``'s (a child process's) where that made it, else made here."""
    key = reference_key(fp32_mod, session, inputs)
    found = session.cached(key, valid=lambda value: _decoded(value) is not None)
    if found is not None:
        if pending is not None:
            pending.cancel()
        return _decoded(found), True
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm

    executable = pending.executable() if pending is not None else None
    if executable is None:
        executable = build_stock_vm(fp32_mod, session.target)
    reference = StockVM(executable, device, [])
    refs = [_outputs(reference.main(*[tvm.runtime.tensor(x, device) for x in xs])) for xs in inputs]
    if sum(r.nbytes for outs in refs for r in outs) <= MAX_CACHED_BYTES:
        session.keep(key, [[_encode(r) for r in outs] for outs in refs])
    return refs, False


def _encode(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a)
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode("ascii")}


def _decoded(value) -> list | None:
    """The outputs per seed that :func:`_encode` wrote into ``value``, or None when it is not that (a damaged
    cache entry: a wrong structure, bytes that do not fill their shape)."""
    if not (isinstance(value, list) and len(value) == len(SEEDS)
            and all(isinstance(outs, list) and outs for outs in value)):
        return None
    try:
        return [[np.frombuffer(base64.b64decode(o["data"]), dtype=o["dtype"]).reshape(o["shape"]) for o in outs]
                for outs in value]
    except (KeyError, TypeError, ValueError):
        return None


def _outputs(out) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o.numpy() for o in out]


def check(report: Accuracy, max_error: float | None) -> None:
    """A one-line error when the build's outputs are NaN or infinite where float32's are finite (whatever
    ``max_error``), or when the measured error is over ``max_error``."""
    if report.non_finite:
        raise NimbleError(f"the {report.precision} build's outputs hold {report.non_finite} NaN or infinite "
                          "values where float32's are finite (an overflow of the reduced precision): build in a wider "
                          "precision (bf16, tf32 or fp32), or keep the overflowing operators in float32 (keep_fp32)")
    if max_error is None:
        return
    if report.rel_l2 is None:
        raise NimbleError(f"max_error needs the build's error measured, and {report.why}: build where the "
                          "target's GPU is, or leave max_error out")
    if report.rel_l2 > max_error:
        raise NimbleError(f"the {report.precision} build is {report.rel_l2:.2e} (relative L2) from float32, over "
                          f"max_error {max_error:g}: build in a wider precision (tf32 or fp32), or keep more operators "
                          "in float32 (keep_fp32, e.g. matmul)")

