"""Experiment: how long ``tvm_nimble.build()`` takes, cold and warm (issue #36: cold <= 60 s, warm <= 15 s).

Each build runs in a fresh process (nothing measured or compiled in memory). Cold: a cache directory of its
own (``XDG_CACHE_HOME``) with nothing in it but the vendor extension, so no timing-cache entry and no
compiled kernel is there; warm: the same directory again, as the cold build left it. Both build the same
exported ONNX model with ``--kernels`` (default best), ``--precision`` (default fp32) and auto streams; the export
is not timed.

    bash scripts/gpu_session.sh "experiment build_times 580 --models tv:googlenet,tv:inception_v3,tv:densenet121"
    python3 scripts/experiments/build_times.py --models zoo:inception --target llvm --kernels tvm --out DIR
    BUILD_PROFILE=1 bash scripts/gpu_session.sh "experiment build_times 400 --models tv:googlenet --kernels best --precision fp16"

With ``--first-build`` the cold build's cache starts empty, the vendor extension included (nothing builds it
beforehand): a fresh machine's first build, whose kernel choice waits on the extension's units (#55).

Writes DIR/build_times.json (per model: cold and warm seconds, each build's phases, what it did with the
compiled-kernel cache and how long its kernel choice waited on the vendor extension, whether the two plans are the
same, and the cold build's measured chains: provider, count, the provider's and TVM's ms) and prints a table, then
each warm build's phases.
With BUILD_PROFILE=1 in the environment each build runs under cProfile and writes the 40 functions of most
cumulative time to DIR/profile-{cold,warm}-MODEL.txt (the profiler slows Python-heavy phases: time without it).

With ``--gpus N`` (a machine of N GPUs) N models build at once, each on a GPU of its own (``CUDA_VISIBLE_DEVICES``)
with the machine's cores shared out (``TVM_NIMBLE_JOBS``: cores / N): on a 4-GPU machine of 64 cores, four
16-core machines' first builds at once (each row says its GPU and jobs).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gpu_args  # the shared command line, beside this script in scripts/experiments/


def _one(onnx_path: str, target: str, kernels: str, precision: str, profile_to: str = "") -> dict:
    """This process: one build of ``onnx_path``, its wall time, phases and plan digest; ``profile_to``: a file
    for the build's cProfile summary."""
    import tvm_nimble

    profiler = None
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.perf_counter()
    result = tvm_nimble.build(onnx_path, {"kind": target}, kernels=kernels, precision=precision)
    seconds = time.perf_counter() - t0
    if profiler is not None:
        import pstats

        profiler.disable()
        with open(profile_to, "w") as f:
            pstats.Stats(profiler, stream=f).sort_stats("cumulative").print_stats(40)
    plan = json.dumps(result.plan.to_json(), sort_keys=True)
    report = result.report
    chains = [{"provider": t.provider, "count": t.count, "vendor_ms": t.vendor_ms, "tvm_ms": t.tvm_ms,
               "taken_by": t.taken_by, "signature": t.signature} for t in report.kernel_choice.timings]
    return {"seconds": seconds, "phases": report.phases or {}, "streams": result.plan.num_streams, "chains": chains,
            "launches": len(result.plan.launches), "plan": hashlib.sha256(plan.encode()).hexdigest()[:12],
            "kernel_cache": report.kernel_cache,  # hit: a warm build loaded its compiled kernels
            # a first build: how long the kernel choice waited on the vendor extension's units compiling
            "extension_wait_s": round(report.kernel_choice.extension_wait_s, 3),
            # a build in reduced precision: its error against fp32
            "accuracy": report.accuracy.to_dict() if report.accuracy else None}


def _in_fresh_process(onnx_path: str, target: str, kernels: str, precision: str, cache: str,
                      profile_to: str = "", lane: dict | None = None) -> dict:
    from tvm_nimble import env as nimble_env

    env = dict(os.environ, XDG_CACHE_HOME=cache, **(lane or {}))
    env.pop(nimble_env.CACHE_DIR, None)  # it would win over XDG_CACHE_HOME: the "cold" build would be warm
    r = subprocess.run([sys.executable, __file__, "--one", onnx_path, target, kernels, precision, profile_to],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:] or ["exit %d" % r.returncode]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _lanes(gpus: int) -> list[dict]:
    """The environment of each of ``gpus`` builds at once: its GPU and its share of this machine's cores (none
    for one: a build as a user runs it)."""
    if gpus == 1:
        return [{}]
    share = max(1, (os.cpu_count() or 1) // gpus)
    return [{"CUDA_VISIBLE_DEVICES": str(i), "TVM_NIMBLE_JOBS": str(share)} for i in range(gpus)]


def _vendor_cache() -> str | None:
    """This user's cache of built vendor extensions (copied into each cold cache: building it is not build())."""
    from tvm_nimble import env

    root = env.cache_dir("vendor")
    return root if glob.glob(os.path.join(root, "*", "*.so")) else None


def main(argv=None):
    if argv is None and sys.argv[1:2] == ["--one"]:
        print(json.dumps(_one(*sys.argv[2:7])))
        return

    def extend(ap):
        ap.add_argument("--first-build", action="store_true",
                        help="the cold build's cache empty, the vendor extension included")
        ap.add_argument("--gpus", type=int, default=1,
                        help="models built at once, each on a GPU of its own with cores / N compiler jobs")

    args, target = gpu_args.parse(__doc__, argv, "zoo:incept6", batches_and_kernels=True, precision=True,
                                  extend=extend)
    if args.gpus < 1:
        raise SystemExit(f"build_times: --gpus must be at least 1, got {args.gpus}")
    first_build = args.first_build
    kind = target.kind.name
    if kind == "cuda" and args.kernels == "best" and not first_build:
        from tvm_nimble.codegen.vendor_build import build_vendor_library

        build_vendor_library(str(target.attrs["arch"]))  # once, before any timed build
    import onnx

    jobs = []  # (label, ONNX file, batch): every model exported before any build (exporting is not timed)
    for spec, batch, name, model in gpu_args.models_and_batches(args):
        label = name if batch == 1 else f"{name}@{batch}"
        onnx_path = os.path.join(args.out, f"{label}.onnx")
        onnx.save(model, onnx_path)
        jobs.append((label, onnx_path, batch))
    vendor = None if first_build else _vendor_cache()
    kept = os.path.join(args.out, "vendor-built")  # an extension a first build compiled (one is enough: below)
    rows: dict[str, dict] = {}
    lock = threading.Lock()
    free = queue.Queue()  # the lanes no build holds
    for lane in _lanes(args.gpus):
        free.put(lane)

    def ordered() -> list[dict]:
        return [rows[label] for label, _, _ in jobs if label in rows]

    def run(job: tuple) -> None:
        label, onnx_path, batch = job
        lane = free.get()
        cache = os.path.join(args.out, f"cache-{label}")
        shutil.rmtree(cache, ignore_errors=True)
        if vendor:
            shutil.copytree(vendor, os.path.join(cache, "tvm-nimble", "vendor"))
        row = {"model": label, "batch": batch, "kernels": args.kernels, "precision": args.precision, "target": kind,
               "first_build": first_build, **({"lane": lane} if args.gpus > 1 else {})}
        for run_kind in ("cold", "warm"):
            profile_to = os.path.join(args.out, f"profile-{run_kind}-{label}.txt") if os.environ.get("BUILD_PROFILE") \
                else ""
            row[run_kind] = _in_fresh_process(onnx_path, kind, args.kernels, args.precision, cache, profile_to, lane)
            print(f"{run_kind} {label}: {row[run_kind]}", flush=True)
        free.put(lane)
        row["same_plan"] = "plan" in row["cold"] and row["cold"]["plan"] == row["warm"].get("plan")
        built = os.path.join(cache, "tvm-nimble", "vendor")
        with lock:
            rows[label] = row
            if first_build and not os.path.exists(kept) and os.path.isdir(built):
                shutil.copytree(built, kept)
            with open(os.path.join(args.out, "build_times.json"), "w") as f:  # after each model: a cut-off call keeps them
                json.dump(ordered(), f, indent=1)
        shutil.rmtree(cache, ignore_errors=True)
        os.remove(onnx_path)

    # as many builds at once as lanes, each taking a free one (the pool's first builds start together)
    with ThreadPoolExecutor(max_workers=args.gpus) as pool:
        list(pool.map(run, jobs))
    if os.path.isdir(kept):
        if _vendor_cache() is None:  # kept for this user's later builds (another step of the session)
            from tvm_nimble import env

            shutil.copytree(kept, env.cache_dir("vendor"), dirs_exist_ok=True)
        shutil.rmtree(kept, ignore_errors=True)
    rows = ordered()
    secs = lambda r: f"{r['seconds']:8.1f}" if "seconds" in r else f"{'error':>8s}"  # noqa: E731
    print(f"\n{'model':20s} {'cold s':>8s} {'warm s':>8s}  same plan  cold phases")
    for r in rows:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r["cold"].get("phases", {}).items())
        print(f"{r['model']:20s} {secs(r['cold'])} {secs(r['warm'])}  {str(r['same_plan']):9s}  {phases}")
    for r in rows:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r["warm"].get("phases", {}).items())
        print(f"warm {r['model']}: {phases}; kernel cache {r['warm'].get('kernel_cache')}")


if __name__ == "__main__":
    main()
