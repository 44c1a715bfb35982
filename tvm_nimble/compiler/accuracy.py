"""The accuracy report of a build that changes precision: how far its outputs are from float32.

The reference is the same model in float32 run by stock TVM (its default kernels, no Nimble pass) on
the build's target; the inputs are seeded, and a report counts only when the reference's output
depends on the input (a random-init model can collapse to a constant, and then every build agrees).
"""
from __future__ import annotations

import numpy as np
import tvm

from tvm_nimble.errors import NimbleError

#: seeds of the inputs the error is measured on
SEEDS = (0, 1)


def rel_l2(out: list, ref: list) -> float:
    """Relative L2 error of ``out`` against ``ref`` (all outputs together; inf against a zero reference)."""
    num = sum(float(np.sum((np.asarray(o, np.float64) - np.asarray(r, np.float64)) ** 2)) for o, r in zip(out, ref))
    den = sum(float(np.sum(np.asarray(r, np.float64) ** 2)) for r in ref)
    return (num / den) ** 0.5 if den > 0 else float("inf")


def unmeasurable(options) -> str | None:
    """Why this machine cannot run a build for ``options.target``, or None when it can."""
    from .timers import LocalGPU, has_gpu_for

    if options.is_cuda and (options.rpc_tracker or not has_gpu_for(LocalGPU(), options.target)):
        return f"no GPU of the target's arch ({options.arch}) on this machine"
    return None


def report(fp32_mod: tvm.IRModule | None, result, options) -> dict:
    """The accuracy report of ``result`` (built with ``options``) against ``fp32_mod``, measured where
    the build's target can run here; else the reason it is not."""
    why = unmeasurable(options)
    if fp32_mod is None:
        why = "the build started from a kernel selection, not the model"
    elif not options.compile_kernels:
        why = "kernels were not compiled"
    if why is not None:
        return {"precision": options.precision, "rel_l2": None, "why": why}
    return measure(fp32_mod, result, tvm.cuda(0) if options.is_cuda else tvm.cpu())


def measure(fp32_mod: tvm.IRModule, result, device) -> dict:
    """{precision, rel_l2 (the largest over :data:`SEEDS`), reference, input_dependent} of ``result``."""
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm
    from tvm_nimble.runtime.executor import NimbleExecutor
    from tvm_nimble.runtime.timing import random_inputs

    target = result.options.target
    reference = StockVM(build_stock_vm(fp32_mod, target), device, [])
    executor = NimbleExecutor(result, device=device)
    errors, refs = [], []
    for seed in SEEDS:
        inputs = random_inputs(result.plan, seed)
        ref = _outputs(reference.main(*[tvm.runtime.tensor(x, device) for x in inputs]))
        errors.append(rel_l2([o.numpy() for o in executor(*inputs)], ref))
        refs.append(ref)
    spread = rel_l2(refs[1], refs[0])
    return {"precision": result.options.precision, "rel_l2": max(errors), "seeds": len(SEEDS),
            "reference": f"float32, stock TVM on {target.kind.name}", "input_dependent": spread > 10 * max(errors)}


def _outputs(out) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o.numpy() for o in out]


def check(report: dict, max_error: float | None) -> None:
    """A one-line error when the measured error is over ``max_error``."""
    if max_error is None:
        return
    if report.get("rel_l2") is None:
        raise NimbleError(f"max_error needs the build's error measured, and {report['why']}: build where the "
                          "target's GPU is, or leave max_error out")
    if report["rel_l2"] > max_error:
        raise NimbleError(f"the {report['precision']} build is {report['rel_l2']:.2e} (relative L2) from float32, over "
                          f"max_error {max_error:g}: build in a wider precision (tf32 or fp32), or keep more operators "
                          "in float32 (keep_fp32, e.g. matmul)")


def describe(report: dict) -> str:
    """One line for compile and explain."""
    if report.get("rel_l2") is None:
        return f"accuracy ({report['precision']}): not measured, {report['why']}"
    note = "" if report["input_dependent"] else " (the fp32 output barely depends on the input: not a meaningful check)"
    return (f"accuracy ({report['precision']}): {report['rel_l2']:.2e} relative L2 from {report['reference']}, "
            f"worst of {report['seeds']} seeded inputs{note}")
