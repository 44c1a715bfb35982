"""`tvm-nimble tune` / scripts/tune_and_build.py: tune a model's kernels, then build with them.

Resumable: the database in --work-dir (default: under the tvm-nimble cache, printed at the end) is
continued, never restarted. --time-budget is the run's wall time, setup included (e.g. 480 s slices on
the GPU machine): rounds of trials start while the next one is expected to end in time (the first
whenever the setup left any time; a budget the setup spent is an error), then the run stops cleanly;
run again to go on.
A MetaSchedule call that is still running 20 s past the budget cannot be interrupted: the process
then exits with code 3, keeping every trial measured so far in the database.
Trials go to the heaviest kernels first (calls x FLOPs, then calls x best measured time); each
round tunes several of them in one MetaSchedule call, --trials-per-iter trials each.

examples:
  tvm-nimble tune model.onnx --target cuda --arch sm_90 --trials 300 --time-budget 480 -o model.nimble
  tvm-nimble tune zoo:incept6 --time-budget 300 --work-dir incept6-db   # then: compile --tuning-db incept6-db
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time

from tvm_nimble.cli.models import load_model
from tvm_nimble.cli.options import target_args

OVERRUN_GRACE_S = 20.0  # scripts/gpu_session.sh gives tune 30 s past its --time-budget before killing it


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


def default_work_dir(target: dict, model_name: str) -> str:
    """Where a run keeps its database without --work-dir: under the cache root, never in the current folder
    (run from a checkout, it would land untracked beside the committed databases)."""
    from tvm_nimble.env import cache_dir

    return cache_dir("tuning", target.get("arch", "cpu"), model_name)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tvm-nimble tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="ONNX file, zoo:<name> (benchmark size: incept6, nasnet, resnet, mobilenet), or tv:<torchvision/timm name>")
    target_args(ap, default="llvm")
    ap.add_argument("--trials", type=int, default=64, help="trial budget per task (default 64)")
    ap.add_argument("--trials-per-iter", type=int, default=64,
                    help="trials per task per MetaSchedule iteration (default 64); a round gives each of its "
                         "tasks one iteration")
    ap.add_argument("--trials-per-round", type=int,
                    help="most trials in one round, all its tasks together (time checks come between rounds; "
                         "default 4 x --trials-per-iter)")
    ap.add_argument("--total-trials", type=int, help="most trials in this run, all tasks together")
    ap.add_argument("--time-budget", type=float,
                    help="seconds for the whole run, setup included: rounds start while one is expected to end in "
                         "time (the first whenever the setup left any time), then it stops cleanly")
    ap.add_argument("--work-dir", help="database directory (default: <cache>/tuning/<arch|cpu>/<model>, the cache "
                    "being $TVM_NIMBLE_CACHE_DIR, else ~/.cache/tvm-nimble)")
    ap.add_argument("--strategy", default="evolutionary", choices=["evolutionary", "replay-trace", "replay-func"])
    ap.add_argument("--cost-model", default="xgb", choices=["xgb", "random", "mlp"])
    ap.add_argument("-o", "--output", help="after tuning, build the Nimble artifact here with the database")
    ap.add_argument("--force", action="store_true", help="replace the artifact already at -o (refused without it)")
    ap.add_argument("--rpc-tracker", metavar="HOST:PORT",
                    help="measure on the RPC servers of this tracker (python -m tvm.exec.rpc_tracker) instead of here")
    ap.add_argument("--rpc-key", help="with --rpc-tracker: the key the servers registered under")
    args = ap.parse_args(argv)
    if args.arch and args.target != "cuda":  # (the target was cuda by default once: --arch alone meant a GPU)
        ap.error(f"--arch {args.arch} applies to CUDA builds: add --target cuda")

    from tvm_nimble.compiler.tuning.tune import tune

    if args.output:  # before tuning, not after it
        from tvm_nimble.runtime.artifact import check_output_path

        check_output_path(args.output, args.force, replace_hint="pass --force")
    name, model = load_model(args.model)
    from tvm_nimble.compiler.target import resolve_target, target_dict

    target = target_dict(resolve_target(args.target, args.arch))
    work_dir = args.work_dir or default_work_dir(target, name)
    deadline = time.time() + args.time_budget if args.time_budget else None
    with overrun_watchdog(deadline, OVERRUN_GRACE_S, work_dir):  # tune() checks the budget only between rounds
        report = tune(model, target, work_dir, trials_per_task=args.trials, time_budget=args.time_budget,
                      total_trials=args.total_trials, trials_per_iter=args.trials_per_iter,
                      trials_per_round=args.trials_per_round, strategy=args.strategy, cost_model=args.cost_model,
                      rpc_tracker=args.rpc_tracker, rpc_key=args.rpc_key, model_name=name)
    print(report.summary())
    print(f"database: {work_dir} (give it to builds as --tuning-db {work_dir})")
    if args.output:
        from tvm_nimble.compiler.build import build

        module = build(model, target, tuning_db=work_dir)
        module.export(args.output, overwrite=args.force)
        print(f"wrote {args.output} (built with the tuning database)")
    return 0


if __name__ == "__main__":
    main()
