"""The accuracy report of a build that changes precision: how far its outputs are from float32.

The reference is the same model in float32 run by stock TVM (its default kernels, no Nimble pass) on
the build's target; the inputs are seeded, and a report counts only when the reference's output
depends on the input (a random-init model can collapse to a constant, and then every build agrees).

Building that reference is a whole stock TVM build (13.5 of a warm googlenet fp16 build's 22.7 s on an
H100), so its outputs are kept in the build session's cache (:mod:`.session`, kind ``fp32_reference``),
keyed by the float32 module's structural hash (its weights included), the seeds and the inputs' shapes: the
next build of the same model on the same GPU, in any precision, measures its error against them.

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


def report(fp32_mod: tvm.IRModule | None, result, session) -> Accuracy:
    """The accuracy stage of a build session: the report of ``result`` against ``fp32_mod``, measured where the
    build's target can run here; else the reason it is not."""
    options = session.options
    why = unmeasurable(options)
    if fp32_mod is None:
        why = "the build started from a kernel selection, not the model"
    elif not options.compile_kernels:
        why = "kernels were not compiled"
    elif result.plan.states:
        why = "a step of generation (its KV cache is state): the generator checks its logits"
    if why is not None:
        return Accuracy(options.precision, None, why=why)
    return measure(fp32_mod, result, tvm.cuda(0) if options.is_cuda else tvm.cpu(), session)


def measure(fp32_mod: tvm.IRModule, result, device, session) -> Accuracy:
    """The error of ``result`` (the largest relative L2 over :data:`SEEDS`), whether the reference depends on the
    input, whether it came from the cache, and how many output values are NaN or infinite where the reference's
    are finite. The reference comes from (and goes to) ``session``'s cache."""
    from tvm_nimble.runtime.loading import NimbleExecutor
    from tvm_nimble.runtime.timing import random_inputs

    target = result.options.target
    inputs = [random_inputs(result.plan, seed) for seed in SEEDS]
    refs, cached = reference_outputs(fp32_mod, inputs, session, device)
    executor = NimbleExecutor(result, device=device)
    outs = [[o.numpy() for o in executor(*x)] for x in inputs]
    errors = [rel_l2(out, ref) for out, ref in zip(outs, refs)]
    spread = rel_l2(refs[1], refs[0])
    non_finite = sum(int(np.sum(~np.isfinite(o) & np.isfinite(r))) for out, ref in zip(outs, refs)
                     for o, r in zip(out, ref))
    return Accuracy(result.options.precision, max(errors), seeds=len(SEEDS),
                    reference=f"float32, stock TVM on {target.kind.name}", input_dependent=spread > 10 * max(errors),
                    reference_cached=cached, non_finite=non_finite)


def reference_outputs(fp32_mod: tvm.IRModule, inputs: list, session, device) -> tuple[list, bool]:
    """(stock TVM's float32 outputs of ``fp32_mod`` on each input list of ``inputs``, whether they came from the
    session's cache). Computed outputs are kept there for the next build (up to :data:`MAX_CACHED_BYTES`)."""
    key = session.key(REFERENCE_KIND, fp32_mod, seeds=list(SEEDS),
                      inputs=[[[list(np.shape(x)), str(np.asarray(x).dtype)] for x in xs] for xs in inputs])
    found = session.cached(key, valid=lambda value: _decoded(value) is not None)
    if found is not None:
        return _decoded(found), True
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm

    reference = StockVM(build_stock_vm(fp32_mod, session.target), device, [])
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

