"""Kernel tuning with MetaSchedule + XGBoost, in resumable time-boxed slices.

The database lives in a directory (``database_workload.json``, ``database_tuning_record.json``).
A run counts the trials each task already has there and only tunes what is missing, so a
second run continues instead of starting over. ``time_budget`` stops cleanly before the
deadline, between rounds of trials, with everything measured so far committed; the first round runs
whenever the setup left any time (until one has, nothing says how long a round takes on this machine),
and a budget the setup spent is an error, not a run of no trials. A round that
never returns (seen once on the GPU: a MetaSchedule call stuck after 57 of its 64 trials) cannot be
interrupted from Python, so the CLI arms a watchdog that ends the process (``tvm_nimble.cli.tune``).

Trials go where the run time is: tasks are ranked by estimated cost (calls x time per call:
the best measured time, or an estimate from the kernel's FLOPs until it has one) and each
round tunes the heaviest pending tasks together in one MetaSchedule call, one iteration of
``trials_per_iter`` trials each, because every call and every iteration has a fixed cost
(design spaces, search, cost model) that small rounds pay over and over. The builder's worker
processes are kept across iterations (TVM restarts them for each), and every process imports TVM's
tensor intrinsics with cheap TVMScript stacks: a 4-trial CPU run of zoo:resnet went from 78 s to 35 s.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

import tvm_ffi

from tvm_nimble.compiler.target import resolve_target, target_dict
from tvm_nimble.errors import NimbleError
from tvm_nimble.extras import missing_modules
from tvm_nimble.relay_passes.tvm_compat import (import_tensor_intrinsics, lasting_builder, measure_callback,
                                                unnamed_log_handlers_detached)

from .database import check_tuning_work_dir, database_owner, open_tuning_database, target_label
from .rounds import mean_us, plan_round, trials_that_fit, workload_trials
from .tasks import estimated_costs, extract_tuning_tasks, task_work

_BUILDER_BATCHES = 16  # build batches (MetaSchedule iterations) before the builder's workers are replaced
log = logging.getLogger(__name__)


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}" if v >= 1 else f"{v:.3f}"


def _last_line(text: str) -> str:
    """The message of a (remote) traceback: its last non-empty line."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


@dataclass
class TuneReport:
    tasks: list[dict] = field(default_factory=list)  # name, weight, trials, best_us, share
    trials_this_run: int = 0
    failed_trials: int = 0  # built but not measured (a remote server lost or timed out, a kernel that failed)
    first_failure: str = ""  # the last line of the first failed trial's error (what to fix when all fail)
    servers: int = 0  # RPC servers measuring, 0 = this machine
    stopped_for_time: bool = False
    stopped_for_trials: bool = False  # total_trials of this run spent
    seconds: float = 0.0
    time_budget: float | None = None
    time_left: float = 0.0  # seconds of the budget left when it stopped for time
    round_s: float = 0.0  # what the next round was expected to take then
    rounds: int = 0  # MetaSchedule calls made

    @property
    def tuned(self) -> int:
        return sum(1 for t in self.tasks if t["trials"] > 0)

    def summary(self) -> str:
        lines = [f"{'task':40s} {'trials':>6s} {'best us':>9s} {'share':>6s}"]
        for t in self.tasks:
            lines.append(f"{t['name'][:40]:40s} {t['trials']:6d} {_us(t['best_us']):>9s} {t.get('share', 0):6.1%}")
        if self.failed_trials:
            lines.append(f"{self.failed_trials} trial(s) could not be measured (a remote server lost or timed out, "
                         "or a candidate that failed to run); the run went on without them")
            lines.append(f"first failure: {self.first_failure}")
        stop = (f" ({self._time_stop()})" if self.stopped_for_time else
                " (trial budget of this run spent; run again to continue)" if self.stopped_for_trials else "")
        lines.append("share: estimated share of the model's kernel time (measured, or from FLOPs until measured)")
        lines.append(f"{self.tuned}/{len(self.tasks)} tasks tuned; {self.trials_this_run} trials this run "
                     f"in {self.seconds:.0f}s" + stop)
        return "\n".join(lines)

    def _time_stop(self) -> str:
        budget = f"the {self.time_budget:.0f}s time budget"
        if self.time_left >= 1:  # not spent, but a round would overrun it
            return (f"stopped with {self.time_left:.0f}s of {budget} left, too little for another round (rounds "
                    f"take up to {self.round_s:.0f}s here); run again to continue")
        return f"{budget} is spent; run again to continue"


#: what MetaSchedule imports while it tunes (pyproject.toml's [tune] extra installs them)
_TUNE_MODULES = ("psutil", "cloudpickle")


def check_tune_dependencies(cost_model: str = "xgb") -> None:
    """One line naming the [tune] extra when what tuning imports is not installed, before any work
    (MetaSchedule itself fails later, with a traceback from deep inside TVM)."""
    missing = missing_modules(_TUNE_MODULES + (("xgboost",) if cost_model == "xgb" else ()))
    if missing:
        raise NimbleError(f"tuning needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
                          "installed: install the [tune] extra (pip install -e '.[tune]' in the tvm-nimble checkout)")


def _meta_schedule_logs_to_files_only() -> None:
    """MetaSchedule's logging setup (run by ``extracted_tasks_to_tune_contexts``) adds a console handler
    printing to stdout besides its files in ``work_dir/logs``: its timestamped lines would land between the
    progress bar and the summary, which report the run (failed trials included). Keep them in the files."""
    ms_log = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(ms_log.handlers):
        if handler.get_name() == "tvm.s_tir.meta_schedule.console":
            ms_log.removeHandler(handler)


def _budget_spent_in_setup(time_budget: float, start: float) -> NimbleError:
    """A run whose budget is gone before its first round would run no trial: an error, not a success."""
    return NimbleError(f"the {time_budget:g}s time budget was spent before the first round of trials could start "
                       f"(the setup took {time.time() - start:.0f}s here): give a larger time budget (--time-budget)")


def tune(model, target, work_dir: str, trials_per_task: int = 64, *, time_budget: float | None = None,
         total_trials: int | None = None, trials_per_iter: int = 64, trials_per_round: int | None = None,
         shape_dict=None, progress: bool = True, seed: int = 0, strategy: str = "evolutionary",
         cost_model: str = "xgb", rpc_tracker: str | None = None, rpc_key: str | None = None,
         model_name: str | None = None) -> TuneReport:
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

    ``rpc_tracker`` (``HOST:PORT``) and ``rpc_key``: measure on every RPC server registered with that
    tracker under that key, in parallel, instead of on this machine (see :mod:`.remote`).

    ``model_name`` is recorded in ``work_dir``'s ``tuning_summary.json`` with the target; a ``work_dir``
    holding another model's or another target's database is refused (:func:`.database.check_tuning_work_dir`).
    """
    check_tune_dependencies(cost_model)
    from tvm.s_tir import meta_schedule as ms

    start = time.time()
    deadline = start + time_budget if time_budget else None
    evaluator = ms.runner.EvaluatorConfig(number=10, repeat=1, min_repeat_ms=20)
    servers = 0
    # what the summary says, before the slow task extraction (the workloads are compared after it)
    check_tuning_work_dir(work_dir, model_name, target_dict(resolve_target(target)))
    if rpc_tracker:  # before the slow task extraction: a wrong tracker or key fails at once
        from .remote import rpc_runner

        if not rpc_key:
            raise NimbleError("--rpc-tracker needs --rpc-key: the key the RPC servers registered under")
        runner, servers = rpc_runner(rpc_tracker, rpc_key, evaluator)
    trials_per_round = trials_per_round or 4 * trials_per_iter
    t, tasks = extract_tuning_tasks(model, target, shape_dict)
    log.info("%d tasks extracted, %.1fs from the start", len(tasks), time.time() - start)
    if not tasks:
        raise NimbleError("the model has no kernels to tune")
    if deadline and time.time() >= deadline:  # before the slower rest of the setup, done in vain
        raise _budget_spent_in_setup(time_budget, start)
    owner, db = database_owner(work_dir), None
    if os.path.isdir(work_dir):  # before anything is written there
        if all(os.path.isfile(os.path.join(work_dir, f))
               for f in ("database_workload.json", "database_tuning_record.json")):
            db = open_tuning_database(work_dir)
        check_tuning_work_dir(work_dir, model_name, target_dict(t), db, [task.dispatched[0] for task in tasks])
    os.makedirs(work_dir, exist_ok=True)
    db = db if db is not None else ms.database.JSONDatabase(work_dir=work_dir)
    hashes = [tvm_ffi.structural_hash(task.dispatched[0]) for task in tasks]
    work = [task_work(task) for task in tasks]
    done = workload_trials(db)
    state = []
    for task, h in zip(tasks, hashes):
        n, best = done.get(h, (0, None))
        state.append({"name": task.task_name, "weight": int(task.weight), "trials": n, "best_us": best})
    report = TuneReport(tasks=state, servers=servers, time_budget=time_budget)
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

    def on_measured(pos, run_us, errors):  # live progress: best latency of the task just measured
        report.failed_trials += sum(u is None for u in run_us)
        if not report.first_failure:
            report.first_failure = next((_last_line(e) for e in errors if e), "")
        s = state[round_tasks[pos]]
        s["best_us"] = min([u for u in run_us + [s["best_us"]] if u is not None], default=None)
        if bar:
            bar.update(len(run_us))
            bar.set_postfix_str(f"{s['name'][:24]} best {_us(s['best_us'])}us")

    import_tensor_intrinsics()  # cheaply, before TuneContext does it the slow way
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    # one builder, runner and cost model for all rounds (the XGBoost model keeps learning across them);
    # generous timeouts: a loaded 2-core machine builds slowly
    with unnamed_log_handlers_detached():
        ctxs, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, strategy=strategy, seed=seed)
    _meta_schedule_logs_to_files_only()
    builder = lasting_builder(timeout_sec=120)
    log.info("tune contexts ready, %.1fs from the start", time.time() - start)
    # kernels run for microseconds: 20 ms of repeats per measurement is thousands of runs (TVM's default 100 ms
    # makes measuring, one candidate at a time on the one device, a large share of each trial)
    if rpc_tracker:
        log.info("measuring on %d RPC server(s) under key %r at %s", servers, rpc_key, rpc_tracker)
    else:
        runner = ms.runner.LocalRunner(timeout_sec=60, evaluator_config=evaluator)
    model_ = ms.cost_model.CostModel.create(cost_model, num_tuning_cores=ctxs[0].num_threads, tree_method="auto")
    callbacks = ms.measure_callback.MeasureCallback.create("default") + [measure_callback(on_measured, mean_us)]
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
                left = deadline - time.time()
                if not rounds[True]:
                    # Nothing timed yet. The prior (an H100's minute of fixed cost per call) alone refused every
                    # budget under about 75 s before a single trial: the first round runs whenever time is left,
                    # one iteration of one task, as large as the prior allows; later rounds are sized on it.
                    fit = min(trials_per_iter, max(1, trials_that_fit(left, []))) if left > 0 else 0
                else:
                    fit = trials_that_fit(left, rounds[cold] or rounds[True])
                    if fit < 1 and cold and builder.pool is not None:  # too late to replace the workers: keep them
                        cold, fit = False, trials_that_fit(left, rounds[False] or rounds[True])
                if fit < 1 and not report.rounds:  # a run of no trials is no success
                    raise _budget_spent_in_setup(time_budget, start)
                if fit < 1:
                    report.stopped_for_time, report.time_left = True, max(0.0, left)
                    report.round_s = max((s for s, _ in rounds[cold] or rounds[True]), default=0.0)
                    break
                room = min(room, fit)
            if cold:
                builder.close()
            cost = shares()
            order = sorted(pending, key=lambda i: -cost[i])
            round_tasks, q = plan_round(order, [trials_per_task - s["trials"] for s in state], trials_per_iter, room)
            log.info("round: %d trials each for %s%s", q, ", ".join(state[i]["name"] for i in round_tasks),
                     f" ({deadline - time.time():.0f}s left)" if deadline else "")
            r0 = time.time()
            ms.tune_tasks(tasks=[ctxs[i] for i in round_tasks], task_weights=[tasks[i].weight for i in round_tasks],
                          work_dir=work_dir, max_trials_global=q * len(round_tasks), max_trials_per_task=q,
                          num_trials_per_iter=q, database=db, cost_model=model_, builder=builder, runner=runner,
                          measure_callbacks=callbacks)
            rounds[cold and builder.pool is not None].append((time.time() - r0, q * len(round_tasks)))
            report.rounds += 1
            log.info("round done in %.1fs (%s builder workers)", time.time() - r0, "fresh" if cold else "kept")
            after = workload_trials(db)  # the database is the source of truth
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
        who = {"model": model_name or owner.get("model"), "target": target_label(target_dict(t))}
        json.dump({**{k: v for k, v in who.items() if v}, "trials_per_task": trials_per_task, "tasks": state}, f,
                  indent=1)
    return report
