"""Experiment: serving on Ray Serve under Poisson load (issue #56): a bucketed Nimble artifact on 1 and 2
replicas (one GPU each) against Ray Serve replicas running PyTorch's CUDA graphs with the same batching.

    bash scripts/gpu_session.sh "experiment serve_load 560 --models tv:googlenet --precision fp16 --replicas 1,2"
    python3 scripts/experiments/serve_load.py --models zoo:inception --target llvm --replicas 1,2 --seconds 0.5 \\
        --capacity-requests 40 --out DIR   # CPU dry run (Ray's local cluster, CPU replicas)

For each model: one bucketed build (``--buckets``, default 1,2,4,8,16,32; ``--kernels``, default best;
``--precision``, default fp16), exported; then for each replica count (``--replicas``) two Serve
applications in turn, each replica on its own GPU:

- ``nimble``: ``tvm_nimble.serve`` on the artifact (``@serve.batch`` up to the largest bucket, a batch one
  run of the smallest bucket that holds it);
- ``torch-cudagraph``: a deployment of the same shape and batching (``@serve.batch``, the same largest batch
  and wait) running the PyTorch model (torchvision's, with the weights the ONNX export has) through one CUDA
  graph per bucket, zero-padded to the smallest that holds the batch (batcher_load.TorchBuckets).

The load comes from ``--clients`` Ray actors (default 4, so that no single Python process's handle calls
bound the rate), each sending its share of one-row requests through the deployment handle. First, every
application's answers to 11 rows are checked against each row run alone on the artifact here. Then its
capacity (closed loop: ``--capacity-requests`` requests queued at once) and, for each load (``--loads``,
fractions of the one-replica Nimble capacity times the replica count, so both engines see the same rates),
open-loop Poisson arrivals for ``--seconds``: p50/p99 latency from each request's scheduled arrival to its
answer, and throughput. Writes DIR/serve_load.json, DIR/serving.csv (a row per engine, replica count and load,
in ``tvm_nimble.bench.report.SERVING_COLUMNS``; ``benchmarks/serving.csv`` collects them, RESULTS.md shows them) and
prints a table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
APP = "load"


def torch_deployment(serve, torch_model, row_shape, buckets, cuda: bool, half: bool, wait_s: float):
    """The PyTorch peer: a Serve deployment with the Nimble one's ``infer`` and batching."""

    class TorchGraphs:
        def __init__(self):
            import torch
            from batcher_load import TorchBuckets

            model = torch_model.half() if half else torch_model
            self.engine = TorchBuckets(model, row_shape, buckets, cuda, dtype=torch.float16 if half else None)
            self.run_batch.set_max_batch_size(buckets[-1])
            self.run_batch.set_batch_wait_timeout_s(wait_s)

        @serve.batch
        async def run_batch(self, requests: list) -> list:
            import asyncio

            x = np.concatenate([r["input"] for r in requests])
            (out,) = await asyncio.to_thread(self.engine, x)
            sizes = np.cumsum([len(r["input"]) for r in requests])[:-1]
            return [[part] for part in np.split(out, sizes)]

        async def infer(self, inputs: dict) -> list:
            return await self.run_batch(inputs)

    return TorchGraphs


def load_generator(ray):
    @ray.remote(num_cpus=0)
    class LoadGen:
        """One client process (an async actor): requests of one row through the deployment handle, awaited on one
        event loop (no thread per request), at most ``concurrency`` of them in flight."""

        def __init__(self, x, timeout_s: float):
            from ray import serve

            self.handle, self.x, self.timeout_s = serve.get_app_handle(APP), x, timeout_s

        async def _one(self, i: int) -> np.ndarray:
            import asyncio

            call = self.handle.infer.remote({"input": self.x[i % len(self.x)][None]})
            return (await asyncio.wait_for(call, self.timeout_s))[0]

        async def answers(self, n: int) -> list:
            return [await self._one(i) for i in range(n)]

        async def closed_loop(self, requests: int, concurrency: int) -> float:
            import asyncio

            slots = asyncio.Semaphore(concurrency)

            async def one(i):
                async with slots:
                    await self._one(i)

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(requests)))
            return time.perf_counter() - t0

        async def poisson(self, rate: float, seconds: float, seed: int):
            import asyncio

            arrivals = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=max(int(rate * seconds), 1)))
            done = np.full(len(arrivals), np.nan)

            async def one(i, t0):
                await self._one(i)
                done[i] = time.perf_counter() - t0

            t0 = time.perf_counter()
            tasks = []
            for i, a in enumerate(arrivals):
                wait = t0 + a - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(one(i, t0)))
            await asyncio.gather(*tasks)
            return arrivals, done

    return LoadGen


def capacity(ray, gens, requests: int, in_flight: int) -> float:
    """Requests per second in a closed loop: ``requests`` shared among the clients, ``in_flight`` of them at once
    in all (the deployments' ``max_ongoing_requests`` times the replicas: more would wait in Serve's router, whose
    back-off when every replica is full, up to 1 s, is then what a capacity measures)."""
    k = len(gens)
    elapsed = ray.get([g.closed_loop.remote(requests // k, max(1, -(-in_flight // k))) for g in gens])
    return (requests // k) * k / max(elapsed)


def poisson_rows(ray, gens, rates: list, seconds: float) -> list:
    """At each rate, open-loop Poisson arrivals (the clients' shares): latency percentiles and throughput."""
    k = len(gens)
    rows = []
    for rate in rates:
        parts = ray.get([g.poisson.remote(rate / k, seconds, seed) for seed, g in enumerate(gens)])
        lat = np.concatenate([(d - a) * 1e3 for a, d in parts])
        last = max(float(np.nanmax(d)) for _, d in parts)
        rows.append({"rate": rate, "requests": len(lat), "p50_ms": float(np.percentile(lat, 50)),
                     "p99_ms": float(np.percentile(lat, 99)), "throughput": len(lat) / last})
    return rows


def serving_rows(record: dict, device: str) -> list[dict]:
    """One model's record as serving.csv rows (a row per engine, replica count and load)."""
    date = datetime.date.today().isoformat()
    build = "" if record["build_s"] is None else f"{record['build_s']:.1f}"
    return [{"date": date, "device": device, "model": record["model"], "precision": record["precision"],
             "kernels": record["kernels"], "buckets": " ".join(map(str, record["buckets"])), "engine": e["engine"],
             "replicas": e["replicas"], "capacity_per_s": f"{e['capacity']:.1f}", "rate_per_s": f"{row['rate']:.1f}",
             "requests": row["requests"], "p50_ms": f"{row['p50_ms']:.3f}", "p99_ms": f"{row['p99_ms']:.3f}",
             "throughput_per_s": f"{row['throughput']:.1f}", "check_rel": f"{e['check_rel']:.2e}",
             "build_s": build if e["engine"] == "nimble" else ""}
            for e in record["engines"] for row in e["loads"]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tv:googlenet")
    ap.add_argument("--kernels", default="best", choices=["tvm", "vendor", "best"])
    ap.add_argument("--precision", default="fp16", choices=["fp32", "fp16"])
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"], help="llvm: a CPU dry run")
    ap.add_argument("--buckets", default="1,2,4,8,16,32")
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--wait-ms", type=float, default=1.0, help="Serve's batch wait, the same for both engines")
    ap.add_argument("--loads", default="0.25,0.5,0.85")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--capacity-requests", type=int, default=4000)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--port", type=int, default=8000, help="Serve's HTTP port")
    ap.add_argument("--artifact", help="serve this bucketed artifact of the (one) model instead of building it "
                    "(e.g. one an earlier run wrote: OUT/NAME.nimble); its buckets are the artifact's")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    sys.path.insert(0, HERE)
    import ray
    from ray import serve as ray_serve

    import tvm_nimble
    from tvm_nimble import serve
    from tvm_nimble.bench.harness import device_name
    from tvm_nimble.bench.report import SERVING_COLUMNS, append_rows
    from batcher_load import load_models

    cuda = args.target == "cuda"
    buckets = sorted(int(b) for b in args.buckets.split(","))
    replicas = [int(r) for r in args.replicas.split(",")]
    precision = args.precision if cuda else "fp32"
    half = precision == "fp16"
    if cuda:
        from tvm_nimble.bench.harness import set_torch_tf32

        set_torch_tf32(False)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster: no token written under the home folder
    ray.init(num_gpus=max(replicas) if cuda else 0, num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                 filter(None, [ROOT, HERE, os.environ.get("PYTHONPATH")]))}})
    LoadGen = load_generator(ray)
    results = []
    for spec in args.models.split(","):
        name, model, torch_model = load_models(spec)
        if args.artifact:
            artifact, build_s = args.artifact, None
            buckets = sorted(serve.ServeOptions(artifact).facts().batch_sizes or ())
            if not buckets:
                raise SystemExit(f"--artifact {artifact}: not a bucketed artifact; build one with --buckets")
        else:
            t0 = time.perf_counter()
            built = tvm_nimble.build(model, {"kind": args.target}, batch_sizes=buckets,
                                     kernels=args.kernels if cuda else "tvm", precision=precision)
            build_s = time.perf_counter() - t0
            artifact = os.path.join(args.out, f"{name}.nimble")
            built.export(artifact, overwrite=True)
            del built
        with tvm_nimble.NimbleExecutor(artifact) as ex:
            row_shape = tuple(ex.plan.tensors[ex.plan.inputs[0]].shape[1:])
            x = np.random.default_rng(0).standard_normal((64, *row_shape)).astype("float32")
            alone = np.concatenate([ex(x[i:i + 1])[0].numpy() for i in range(11)]).astype("float32")
        record = {"model": name, "precision": precision, "kernels": args.kernels if cuda else "tvm", "buckets": buckets,
                  "build_s": build_s, "engines": []}
        base = None
        max_ongoing = serve.max_ongoing_requests(buckets[-1])  # a replica's: the Nimble deployment's, the peer's
        for r in replicas:
            engines = [("nimble", None)] + ([] if args.skip_torch else [("torch-cudagraph", torch_model)])
            for engine, tm in engines:
                if engine == "nimble":
                    serve.start(serve.ServeOptions(artifact, name=APP, replicas=r, max_batch_size=buckets[-1],
                                                   batch_wait_ms=args.wait_ms), port=args.port)
                else:
                    cls = torch_deployment(ray_serve, tm, row_shape, buckets, cuda, half, args.wait_ms / 1000)
                    app = ray_serve.deployment(cls, name="TorchGraphs", num_replicas=r,
                                               ray_actor_options={"num_gpus": 1 if cuda else 0},
                                               max_ongoing_requests=max_ongoing).bind()
                    ray_serve.run(app, name=APP, route_prefix="/torch")
                gens = [LoadGen.remote(x, 60.0) for _ in range(args.clients)]
                got = np.concatenate(ray.get(gens[0].answers.remote(11))).astype("float32")
                err = float(np.abs(got - alone).max() / max(np.abs(alone).max(), 1e-12))
                assert err < (5e-2 if half else 1e-3), f"{name} {engine} x{r}: answers differ from each row alone by {err:.2e}"
                in_flight = r * max_ongoing
                ray.get([g.closed_loop.remote(8 * buckets[-1], in_flight) for g in gens])  # warm: every bucket used
                m = {"capacity": capacity(ray, gens, args.capacity_requests, in_flight)}
                if base is None:  # the rates: fractions of one Nimble replica's capacity, times the replicas
                    base = m["capacity"]
                m["loads"] = poisson_rows(ray, gens, [float(f) * base * r for f in args.loads.split(",")], args.seconds)
                record["engines"].append({"engine": engine, "replicas": r, "check_rel": err, **m})
                print(f"{name} {engine} x{r}: capacity {m['capacity']:.0f}/s; " + "; ".join(
                    f"{row['rate']:.0f}/s p50 {row['p50_ms']:.2f} p99 {row['p99_ms']:.2f} ms" for row in m["loads"]),
                    flush=True)
                for g in gens:
                    ray.kill(g)
                ray_serve.delete(APP)
        results.append(record)
        with open(os.path.join(args.out, "serve_load.json"), "w") as f:
            json.dump(results, f, indent=1)
        append_rows(os.path.join(args.out, "serving.csv"), serving_rows(record, device_name(cuda)), SERVING_COLUMNS, {})
    ray_serve.shutdown()
    ray.shutdown()
    print(f"\n{'model':12s} {'engine':16s} {'replicas':>8s} {'capacity/s':>10s}  p99 ms at each load")
    for rec in results:
        for e in rec["engines"]:
            print(f"{rec['model']:12s} {e['engine']:16s} {e['replicas']:8d} {e['capacity']:10.0f}  "
                  + " ".join(f"{row['p99_ms']:.2f}" for row in e["loads"]))


if __name__ == "__main__":
    main()
