"""Kernel tuning with MetaSchedule + XGBoost, in resumable time-boxed slices.

The database lives in a directory (``database_workload.json``, ``database_tuning_record.json``).
A run counts the trials each task already has there and only tunes what is missing, so a
second run continues instead of starting over. ``time_budget`` stops cleanly before the
deadline, between rounds of trials, with everything measured so far committed. A round that
never returns (seen once on the GPU: a MetaSchedule call stuck after 57 of its 64 trials) cannot be
interrupted from Python, so the CLI also arms ``overrun_watchdog``, which ends the process.

Trials go where the run time is: tasks are ranked by estimated cost (calls x time per call:
the best measured time, or an estimate from the kernel's FLOPs until it has one) and each
round tunes the heaviest pending tasks together in one MetaSchedule call, one iteration of
``trials_per_iter`` trials each, because every call and every iteration has a fixed cost
(design spaces, search, cost model) that small rounds pay over and over. The builder's worker
processes are kept across iterations (TVM restarts them for each), and every process imports TVM's
tensor intrinsics with cheap TVMScript stacks: a 4-trial CPU run of zoo:resnet went from 78 s to 35 s.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field

import tvm
import tvm_ffi

from tvm_nimble.relay_passes.pipeline import fusion_passes, import_tensor_intrinsics

from .builder import normalize_target
from .errors import NimbleError

# Prior for the first round of a time-boxed run, before any round was timed (H100, 16 cores:
# about a minute of fixed cost per MetaSchedule call, ~1.7 s per trial in 64-trial iterations).
_PRIOR_ROUND_S, _PRIOR_TRIAL_S = 60.0, 2.0
_MARGIN = 1.25  # a round must fit in the time left with this factor to spare
_BUILDER_BATCHES = 16  # build batches (MetaSchedule iterations) before the builder's workers are replaced
log = logging.getLogger(__name__)


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}" if v >= 1 else f"{v:.3f}"


@dataclass
class TuneReport:
    tasks: list[dict] = field(default_factory=list)  # name, weight, trials, best_us, share
    trials_this_run: int = 0
    stopped_for_time: bool = False
    stopped_for_trials: bool = False  # total_trials of this run spent
    seconds: float = 0.0

    @property
    def tuned(self) -> int:
        return sum(1 for t in self.tasks if t["trials"] > 0)

    def summary(self) -> str:
        lines = [f"{'task':40s} {'trials':>6s} {'best us':>9s} {'share':>6s}"]
        for t in self.tasks:
            lines.append(f"{t['name'][:40]:40s} {t['trials']:6d} {_us(t['best_us']):>9s} {t.get('share', 0):6.1%}")
        stop = (" (stopped for the time budget; run again to continue)" if self.stopped_for_time else
                " (trial budget of this run spent; run again to continue)" if self.stopped_for_trials else "")
        lines.append("share: estimated share of the model's kernel time (measured, or from FLOPs until measured)")
        lines.append(f"{self.tuned}/{len(self.tasks)} tasks tuned; {self.trials_this_run} trials this run "
                     f"in {self.seconds:.0f}s" + stop)
        return "\n".join(lines)


def tuning_target(target) -> tvm.target.Target:
    """MetaSchedule needs the core count of CPU targets."""
    t = normalize_target(target)
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
        from .frontend import from_onnx

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


def _mean_us(run_secs) -> float | None:
    """Mean run time of one trial in us; None for a failed trial (MetaSchedule records those as >= 1e9 s)."""
    secs = [float(x) for x in run_secs] if run_secs else []
    return sum(secs) / len(secs) * 1e6 if secs and all(s < 1e9 for s in secs) else None


def _workload_trials(db) -> dict[int, tuple[int, float | None]]:
    """Per workload (by structural hash of its module): trials recorded and best run time (us)."""
    out: dict[int, tuple[int, float | None]] = {}
    for rec in db.get_all_tuning_records():
        key = tvm_ffi.structural_hash(rec.workload.mod)
        n, best = out.get(key, (0, None))
        t = _mean_us(rec.run_secs)
        out[key] = (n + 1, t if best is None or (t is not None and t < best) else best)
    return out


def _trials_that_fit(seconds_left: float, rounds: list[tuple[float, int]]) -> int:
    """Trials the next round may hold and still end before the deadline, from past rounds alike to it
    (each bounds it: no cheaper however small, as a call's fixed cost dominates small rounds, and
    proportionally longer when larger, an upper bound as that fixed cost does not grow), or the prior."""
    budget = seconds_left / _MARGIN
    if not rounds:
        return int((budget - _PRIOR_ROUND_S) / _PRIOR_TRIAL_S)
    if max(secs for secs, _ in rounds) > budget:
        return 0
    return int(min(trials * budget / max(secs, 1e-3) for secs, trials in rounds))


def _plan_round(order: list[int], remaining: list[int], trials_per_iter: int, room: int) -> tuple[list[int], int]:
    """(tasks, q): the heaviest pending tasks (``order``), q trials each, at most ``room`` trials in all.
    q is one MetaSchedule iteration, cut to what the chosen tasks still miss (the per-task cap of one
    call is shared by its tasks)."""
    q = min(trials_per_iter, room, remaining[order[0]])
    chosen = order[:max(1, room // q)]
    return chosen, min(q, *(remaining[i] for i in chosen))


def _measure_callback(fn):
    """A MetaSchedule measure callback calling fn(task_id in the call, [run us or None per trial])."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class _Callback(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            fn(int(task_id), [_mean_us(r.run_secs) for r in runner_results])

    return _Callback()


def _build_in_worker(args):
    """One MetaSchedule build in a builder worker (runs there; pickled by reference)."""
    from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func  # pinned TVM

    import_tensor_intrinsics()  # cheaply, before _worker_func does it the slow way
    return _worker_func(*args)


def _lasting_builder(timeout_sec: float):
    """MetaSchedule's LocalBuilder, but its worker processes live until ``close()``, not one build batch.

    LocalBuilder starts fresh workers for every batch (TVM's guard against a slow leak in long-lived
    workers) and each fresh worker imports TVM's tensor intrinsics before its first build (30-70 s on a
    2-core machine done plainly; see ``import_tensor_intrinsics``), paid once per MetaSchedule iteration.
    ``tune`` closes it every few rounds instead, so that rounds that start workers are known and timed apart."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params  # pinned TVM
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    @derived_object
    class _Builder(PyBuilder):
        pool, batches = None, 0

        def build(self, build_inputs):
            if self.pool is None:
                self.pool = PopenPoolExecutor(max_workers=os.cpu_count() or 1, timeout=timeout_sec)
            self.batches += 1
            results = []
            for r in self.pool.map_with_error_catching(
                    _build_in_worker,
                    [(None, None, b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]):
                if r.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(r.value, None))
                elif r.status == StatusKind.TIMEOUT:
                    results.append(BuilderResult(None, f"LocalBuilder: Timeout, killed after {timeout_sec} seconds"))
                else:
                    results.append(BuilderResult(None, f"LocalBuilder: An exception occurred\n{r.value}"))
            return results

        def close(self):
            if self.pool is not None:
                self.pool.shutdown()
            self.pool, self.batches = None, 0

    return _Builder()


OVERRUN_EXIT_CODE = 3


@contextlib.contextmanager
def overrun_watchdog(deadline: float | None, grace_s: float, work_dir: str):
    """Ends the process (exit code 3) if the block is still running ``grace_s`` seconds past ``deadline``.

    The time budget is checked between rounds; a MetaSchedule round stuck inside TVM's C++ ignores
    SIGINT, so without this a time-boxed slice hangs until something kills it. The database is safe:
    each trial is appended to it as it is measured. Only for processes that exist to tune (the CLI):
    it exits the whole process."""
    if deadline is None:
        yield
        return

    def stop():
        sys.stderr.write(
            f"\ntvm-nimble tune: still running {grace_s:.0f} s past the time budget (a MetaSchedule call cannot be "
            f"interrupted from Python); stopping the process. Every trial measured so far is committed in {work_dir}; "
            "run again to continue.\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(OVERRUN_EXIT_CODE)

    timer = threading.Timer(max(0.0, deadline + grace_s - time.time()), stop)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextlib.contextmanager
def _unnamed_log_handlers_detached(name: str = "tvm.s_tir.meta_schedule"):
    """MetaSchedule's logging setup names its logger's current handlers in a dictConfig and fails on an
    unnamed one (pytest attaches its capture handlers to every non-propagating logger): keep them off."""
    logger = logging.getLogger(name)
    unnamed = [h for h in logger.handlers if h.get_name() is None]
    for h in unnamed:
        logger.removeHandler(h)
    try:
        yield
    finally:
        for h in unnamed:
            logger.addHandler(h)


def tune(model, target, work_dir: str, trials_per_task: int = 64, *, time_budget: float | None = None,
         total_trials: int | None = None, trials_per_iter: int = 64, trials_per_round: int | None = None,
         shape_dict=None, progress: bool = True, seed: int = 0, strategy: str = "evolutionary",
         cost_model: str = "xgb") -> TuneReport:
    """Tune the kernel tasks of ``model``, heaviest first, up to ``trials_per_task`` trials each, resuming
    from ``work_dir``.

    ``total_trials`` caps the trials of this run (all tasks together), ``time_budget`` its seconds.
    A round is one MetaSchedule call over the heaviest pending tasks with ``trials_per_iter`` trials each
    and at most ``trials_per_round`` (default 4 x ``trials_per_iter``) in all; the time, trial budget and
    priorities are checked between rounds, and every trial is committed to the database as it is measured.

    The first call in a process pays TVM's one-time import of its tensor intrinsics (about half a
    minute on a 2-core machine), so tiny runs are dominated by it.

    ``strategy``/``cost_model`` default to MetaSchedule's evolutionary search guided by XGBoost;
    "replay-trace"/"random" are much cheaper per trial (tests, smoke runs).
    """
    from tvm.s_tir import meta_schedule as ms

    start = time.time()
    deadline = start + time_budget if time_budget else None
    trials_per_round = trials_per_round or 4 * trials_per_iter
    t, tasks = extract_tuning_tasks(model, target, shape_dict)
    if not tasks:
        raise NimbleError("the model has no kernels to tune")
    os.makedirs(work_dir, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=work_dir)
    hashes = [tvm_ffi.structural_hash(task.dispatched[0]) for task in tasks]
    work = [task_work(task) for task in tasks]
    done = _workload_trials(db)
    state = []
    for task, h in zip(tasks, hashes):
        n, best = done.get(h, (0, None))
        state.append({"name": task.task_name, "weight": int(task.weight), "trials": n, "best_us": best})
    report = TuneReport(tasks=state)
    exhausted: set[int] = set()  # tasks whose search space yielded nothing new

    def shares():
        cost = estimated_costs([s["weight"] for s in state], work, [s["best_us"] for s in state])
        for s, c in zip(state, cost):
            s["share"] = c / sum(cost)
        return cost

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(max(0, trials_per_task - s["trials"]) for s in state), desc="tuning", unit="trial")
    round_tasks: list[int] = []

    def on_measured(pos, run_us):  # live progress: best latency of the task just measured
        s = state[round_tasks[pos]]
        s["best_us"] = min([u for u in run_us + [s["best_us"]] if u is not None], default=None)
        if bar:
            bar.update(len(run_us))
            bar.set_postfix_str(f"{s['name'][:24]} best {_us(s['best_us'])}us")

    import_tensor_intrinsics()  # cheaply, before TuneContext does it the slow way
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    # one builder, runner and cost model for all rounds (the XGBoost model keeps learning across them);
    # generous timeouts: a loaded 2-core machine builds slowly
    with _unnamed_log_handlers_detached():
        ctxs, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, strategy=strategy, seed=seed)
    builder = _lasting_builder(timeout_sec=120)
    # kernels run for microseconds: 20 ms of repeats per measurement is thousands of runs (TVM's default 100 ms
    # makes measuring, one candidate at a time on the one device, a large share of each trial)
    runner = ms.runner.LocalRunner(timeout_sec=60, evaluator_config=ms.runner.EvaluatorConfig(
        number=10, repeat=1, min_repeat_ms=20))
    model_ = ms.cost_model.CostModel.create(cost_model, num_tuning_cores=ctxs[0].num_threads, tree_method="auto")
    callbacks = ms.measure_callback.MeasureCallback.create("default") + [_measure_callback(on_measured)]
    rounds: dict[bool, list[tuple[float, int]]] = {True: [], False: []}  # cold (workers started)? -> (s, trials)
    try:
        while True:
            pending = [i for i, s in enumerate(state) if s["trials"] < trials_per_task and i not in exhausted]
            if not pending:
                break
            room = trials_per_round
            if total_trials is not None:
                room = min(room, total_trials - report.trials_this_run)
                if room <= 0:
                    report.stopped_for_trials = True
                    break
            # a round that starts builder workers ("cold") is bounded by cold rounds, a warm one by warm rounds
            cold = builder.pool is None or builder.batches >= _BUILDER_BATCHES
            if deadline:
                fit = _trials_that_fit(deadline - time.time(), rounds[cold] or rounds[True])
                if fit < 1 and cold and builder.pool is not None:  # too late to replace the workers: keep them
                    cold, fit = False, _trials_that_fit(deadline - time.time(), rounds[False] or rounds[True])
                if not rounds[True]:  # time one iteration of one task before sizing rounds on it
                    fit = min(fit, trials_per_iter)
                if fit < 1:
                    report.stopped_for_time = True
                    break
                room = min(room, fit)
            if cold:
                builder.close()
            cost = shares()
            order = sorted(pending, key=lambda i: -cost[i])
            round_tasks, q = _plan_round(order, [trials_per_task - s["trials"] for s in state], trials_per_iter, room)
            log.info("round: %d trials each for %s%s", q, ", ".join(state[i]["name"] for i in round_tasks),
                     f" ({deadline - time.time():.0f}s left)" if deadline else "")
            r0 = time.time()
            ms.tune_tasks(tasks=[ctxs[i] for i in round_tasks], task_weights=[tasks[i].weight for i in round_tasks],
                          work_dir=work_dir, max_trials_global=q * len(round_tasks), max_trials_per_task=q,
                          num_trials_per_iter=q, database=db, cost_model=model_, builder=builder, runner=runner,
                          measure_callbacks=callbacks)
            rounds[cold and builder.pool is not None].append((time.time() - r0, q * len(round_tasks)))
            after = _workload_trials(db)  # the database is the source of truth
            for i in round_tasks:
                n, best = after.get(hashes[i], (0, None))
                if n <= state[i]["trials"]:
                    exhausted.add(i)  # never loop on a task that yields no new trials
                report.trials_this_run += max(n - state[i]["trials"], 0)
                state[i].update(trials=n, best_us=best)
            if bar:
                bar.n = report.trials_this_run
                bar.refresh()
    finally:
        builder.close()
        if bar:
            bar.close()
    shares()
    report.seconds = time.time() - start
    with open(os.path.join(work_dir, "tuning_summary.json"), "w") as f:
        json.dump({"target": str(t.kind.name), "trials_per_task": trials_per_task, "tasks": state}, f, indent=1)
    return report
