"""Kernel tuning with MetaSchedule + XGBoost, in resumable time-boxed slices.

The database lives in a directory (``database_workload.json``, ``database_tuning_record.json``).
A run counts the trials each task already has there and only tunes what is missing, so a
second run continues instead of starting over. ``time_budget`` stops cleanly before the
deadline, between rounds of trials, with everything measured so far committed.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import tvm
import tvm_ffi

from .builder import normalize_target
from .errors import NimbleError


@dataclass
class TuneReport:
    tasks: list[dict] = field(default_factory=list)  # name, trials, best_us
    trials_this_run: int = 0
    stopped_for_time: bool = False
    seconds: float = 0.0

    @property
    def tuned(self) -> int:
        return sum(1 for t in self.tasks if t["trials"] > 0)

    def summary(self) -> str:
        lines = [f"{'task':40s} {'trials':>6s} {'best us':>9s}"]
        for t in self.tasks:
            best = f"{t['best_us']:.1f}" if t["best_us"] is not None else "-"
            lines.append(f"{t['name'][:40]:40s} {t['trials']:6d} {best:>9s}")
        lines.append(f"{self.tuned}/{len(self.tasks)} tasks tuned; {self.trials_this_run} trials this run "
                     f"in {self.seconds:.0f}s" + (" (stopped for the time budget; run again to continue)"
                                                  if self.stopped_for_time else ""))
        return "\n".join(lines)


def tuning_target(target) -> tvm.target.Target:
    """MetaSchedule needs the core count of CPU targets."""
    t = normalize_target(target)
    if t.kind.name == "llvm" and not t.attrs.get("num-cores"):
        t = tvm.target.Target({"kind": "llvm", "num-cores": max(1, (os.cpu_count() or 1))})
    return t


def _workload_trials(db) -> dict[int, tuple[int, float | None]]:
    """Per workload (by structural hash of its module): trials recorded and best run time (us)."""
    out: dict[int, tuple[int, float | None]] = {}
    for rec in db.get_all_tuning_records():
        key = tvm_ffi.structural_hash(rec.workload.mod)
        n, best = out.get(key, (0, None))
        secs = [float(x) for x in rec.run_secs] if rec.run_secs else []
        t = sum(secs) / len(secs) * 1e6 if secs and all(s < 1e9 for s in secs) else None
        out[key] = (n + 1, t if best is None or (t is not None and t < best) else best)
    return out


def tune(model, target, work_dir: str, trials_per_task: int = 64, *, time_budget: float | None = None,
         trials_per_round: int = 16, shape_dict=None, progress: bool = True, seed: int = 0,
         strategy: str = "evolutionary", cost_model: str = "xgb") -> TuneReport:
    """Tune every kernel task of ``model`` up to ``trials_per_task`` trials, resuming from ``work_dir``.

    The first call in a process pays TVM's one-time import of its tensor intrinsics (about a
    minute on a 2-core machine), so tiny runs are dominated by it.

    ``strategy``/``cost_model`` default to MetaSchedule's evolutionary search guided by XGBoost;
    "replay-trace"/"random" are much cheaper per trial (tests, smoke runs).
    """
    from tvm.s_tir import meta_schedule as ms

    start = time.time()
    deadline = start + time_budget if time_budget else None
    t = tuning_target(target)
    if isinstance(model, tvm.IRModule):
        mod = model
    else:
        from .frontend import from_onnx

        mod = from_onnx(model, shape_dict=shape_dict)
    # The tasks are the fused kernels, exactly as the build produces them before scheduling.
    from tvm import relax

    fuse = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                     relax.transform.FoldConstant(), relax.transform.FuseOps(),
                                     relax.transform.FuseTIR()])
    with t:
        mod = fuse(mod)
    tasks = ms.relax_integration.extract_tasks(mod, t)
    if not tasks:
        raise NimbleError("the model has no kernels to tune")
    os.makedirs(work_dir, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=work_dir)
    done = _workload_trials(db)
    report = TuneReport()
    state = []
    for task in tasks:
        n, best = done.get(tvm_ffi.structural_hash(task.dispatched[0]), (0, None))
        state.append({"name": task.task_name, "trials": n, "best_us": best})
    total_todo = sum(max(0, trials_per_task - s["trials"]) for s in state)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total_todo, desc="tuning", unit="trial")
    round_seconds = None
    import logging

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    # one worker pool for all rounds; generous timeouts: a loaded 2-core machine builds slowly
    builder = ms.builder.LocalBuilder(timeout_sec=120)
    runner = ms.runner.LocalRunner(timeout_sec=60)
    ctxs, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, strategy=strategy, seed=seed)
    try:
        while True:
            pending = [i for i, s in enumerate(state) if s["trials"] < trials_per_task]
            if not pending:
                break
            i = min(pending, key=lambda i: state[i]["trials"])  # round-robin over the least tuned
            n = min(trials_per_round, trials_per_task - state[i]["trials"])
            if deadline and round_seconds is not None and time.time() + round_seconds > deadline:
                report.stopped_for_time = True
                break
            r0 = time.time()
            ms.tune_tasks(tasks=[ctxs[i]], task_weights=[1.0], work_dir=work_dir, max_trials_global=n,
                          max_trials_per_task=n, num_trials_per_iter=n, database=db, cost_model=cost_model,
                          builder=builder, runner=runner)
            round_seconds = max(round_seconds or 0.0, time.time() - r0)
            after = _workload_trials(db).get(tvm_ffi.structural_hash(tasks[i].dispatched[0]), (0, None))
            gained = max(after[0] - state[i]["trials"], 0)
            # a task whose search space is exhausted yields fewer trials: never loop on it forever
            state[i]["trials"] = after[0] if gained else trials_per_task
            state[i]["best_us"] = after[1]
            report.trials_this_run += gained
            if bar:
                bar.update(gained)
                bar.set_postfix_str(f"{state[i]['name'][:24]} best {after[1] or 0:.1f}us")
    finally:
        if bar:
            bar.close()
    report.tasks = state
    report.seconds = time.time() - start
    with open(os.path.join(work_dir, "tuning_summary.json"), "w") as f:
        json.dump({"target": str(t.kind.name), "trials_per_task": trials_per_task, "tasks": state}, f, indent=1)
    return report
