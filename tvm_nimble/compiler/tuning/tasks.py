"""Tuning tasks: the fused kernels of a model as MetaSchedule extracts them, and their estimated cost."""
from __future__ import annotations

import math
import os

import tvm

from tvm_nimble.relay_passes.pipeline import fusion_passes

from tvm_nimble.compiler.target import resolve_target


def tuning_target(target) -> tvm.target.Target:
    """MetaSchedule needs the core count of CPU targets."""
    t = resolve_target(target)
    if t.kind.name == "llvm" and not t.attrs.get("num-cores"):
        t = tvm.target.Target({"kind": "llvm", "num-cores": max(1, (os.cpu_count() or 1))})
    return t


def extract_tuning_tasks(model, target, shape_dict=None):
    """(target, tasks): the tasks are the fused kernels, exactly as the build produces them before scheduling."""
    from tvm.s_tir import meta_schedule as ms

    t = tuning_target(target)
    if isinstance(model, tvm.IRModule):
        mod = model
    else:
        from tvm_nimble.compiler.frontend import from_onnx

        mod = from_onnx(model, shape_dict=shape_dict)
    fuse = tvm.transform.Sequential(fusion_passes(t))  # the build's own passes, so workloads match it
    with t:
        mod = fuse(mod)
    # already-scheduled kernels are not tunable (extracted_tasks_to_tune_contexts skips them too)
    tasks = [task for task in ms.relax_integration.extract_tasks(mod, t)
             if not task.mod.attrs.get("tirx.is_scheduled", False)]
    return t, tasks


def task_work(task) -> float:
    """Work of one call of a task's kernel, to rank tasks before they are measured: its FLOPs, or the
    elements it reads and writes where that is more (copies, reshapes, concatenations have 0 FLOPs)."""
    from tvm.s_tir.analysis import estimate_tir_flops
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    mod = task.dispatched[0]
    try:
        flops = float(estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001 - an estimate only; fall back on the buffer sizes
        flops = 0.0
    try:
        elems = sum(math.prod(int(d) for d in a.shape) for a in ArgInfo.from_entry_func(mod, remove_preproc=False))
    except Exception:  # noqa: BLE001 - symbolic shapes
        elems = 0
    return max(flops, float(elems), 1.0)


def estimated_costs(weights, work, best_us) -> list[float]:
    """Estimated time of each task per model run (us): calls x the best measured time, or for a task not
    measured yet its work at the throughput (work per us) the measured tasks reach. With nothing measured
    the unit is arbitrary (weight x work), which is all ranking and shares need."""
    measured = [(w, b) for w, b in zip(work, best_us) if b]
    rate = sum(w for w, _ in measured) / sum(b for _, b in measured) if measured else 1.0
    return [n * (b if b else w / rate) for n, w, b in zip(weights, work, best_us)]
