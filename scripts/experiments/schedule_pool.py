"""Experiment: DLight's default schedules of a model's kernels in this process against the schedule pool's workers
(#55: cold builds under a minute; ``relay_passes.schedule_pool``).

For each model, in ``--precision`` (default fp16) for sm_90 (lowering needs no GPU): the fused kernels scheduled by
the guarded rules here, one after another, then by a pool of ``--workers`` (default: what a build gets on this
machine) from cold (the workers' start included, as a build's first module meets it when its import took under
that) and warm (a second, empty schedule cache); every kernel's scheduled JSON compared with this process's.

    bash scripts/gpu_session.sh "experiment schedule_pool 120 --models zoo:densenet121,tv:googlenet"
    python3 scripts/experiments/schedule_pool.py --models zoo:densenet121 --workers 2 --out DIR

Writes DIR/schedule_pool.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="zoo:densenet121")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--workers", type=int, default=0, help="pool workers (0: what a build gets here)")
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"], help="(kernels are for sm_90 either way)")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    import tvm

    from tvm_nimble.cli.models import load_model
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.compiler.stages import apply_precision, import_model
    from tvm_nimble.relay_passes import schedule_pool
    from tvm_nimble.relay_passes.pipeline import default_schedule_rules, fusion_passes, run_passes
    from tvm_nimble.relay_passes.schedules import ScheduleCache
    from tvm_nimble.relay_passes.tvm_compat import import_tensor_intrinsics

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    rules, key = default_schedule_rules(target, ())
    workers = args.workers or schedule_pool.pool_size()
    if workers < 1:
        print("no pool on this machine (TVM_NIMBLE_JOBS or the cores): give --workers", file=sys.stderr)
        return 2
    import_tensor_intrinsics()  # a build has them by its first half-precision module; not timed here
    rows = []
    for spec in args.models.split(","):
        name, model = load_model(spec, batch=1, small=args.small)
        mod = apply_precision(import_model(model), BuildOptions(target=target, precision=args.precision))
        mod = run_passes(fusion_passes(target), mod, target)
        funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        t = time.perf_counter()
        here = ScheduleCache().schedule_all(funcs, target, rules, key)
        serial = time.perf_counter() - t
        pool = schedule_pool.SchedulePool(workers)
        t = time.perf_counter()
        cold = ScheduleCache().schedule_all(funcs, target, rules, key, pool=pool)
        cold_s = time.perf_counter() - t
        t = time.perf_counter()
        warm = ScheduleCache().schedule_all(funcs, target, rules, key, pool=pool)
        warm_s = time.perf_counter() - t
        failed = pool.failed
        pool.close()
        same = all((a is None and b is None and c is None) or (a is not None and b is not None and c is not None and
                   tvm.ir.save_json(a) == tvm.ir.save_json(b) == tvm.ir.save_json(c))
                   for a, b, c in zip(here, cold, warm, strict=True))
        rows.append({"model": name, "precision": args.precision, "kernels": len(funcs), "workers": workers,
                     "serial_s": round(serial, 3), "pool_cold_s": round(cold_s, 3), "pool_warm_s": round(warm_s, 3),
                     "identical": same, "pool_failed": failed})
        with open(os.path.join(args.out, "schedule_pool.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'model':28s} {'kernels':>7s} {'workers':>7s} {'serial s':>9s} {'pool cold s':>11s} {'pool warm s':>11s}"
          " identical")
    for r in rows:
        print(f"{r['model']:28s} {r['kernels']:7d} {r['workers']:7d} {r['serial_s']:9.2f} {r['pool_cold_s']:11.2f} "
              f"{r['pool_warm_s']:11.2f} {r['identical'] and not r['pool_failed']}")
    return 0 if all(r["identical"] and not r["pool_failed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
