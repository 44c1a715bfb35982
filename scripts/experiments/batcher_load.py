"""Experiment: serving under Poisson load (issue #35): bucketed Nimble behind the dynamic batcher, against one
fixed-batch Nimble artifact and PyTorch's CUDA graphs behind the same batcher.

First run on an H200 (--seconds 5): every engine showed p99s of 190-300 ms at some load. On the CPU dry
run the same stalls are Python's full (generation-2) garbage collections, each holding the GIL while it
walks every object of the process (torch, TVM, the plans: 100-150 ms over its 0.3 M objects; more with
torch on CUDA), so that no batch is gathered, launched or handed back meanwhile; objects kept alive while
requests queue (and, then, every future the harness kept) bring more of them, so near capacity one stall
leaves a backlog for the rest of the window, whichever engine it hits. A serving process does what is
done here before measuring (``--gc``), for every engine alike; each row records the collections seen.

    bash scripts/gpu_session.sh "experiment batcher_load 1200 --models tv:googlenet,tv:resnet50 --kernels best"
    python3 scripts/experiments/batcher_load.py --models zoo:inception --target llvm --buckets 1,2,4 --seconds 0.5 --out DIR   # CPU dry run

For each model, three engines, each behind a ``Batcher`` (``--delay-ms``, default 1) that hands each
request its rows as numpy (one copy of the run's outputs to the host per batch, for every engine):

- ``nimble-buckets``: ``build(..., batch_sizes=--buckets)`` (default 1,2,4,8,16,32; ``--kernels``,
  default best; kernel and stream choice per bucket), ``--replicas`` executors (default 1);
- ``nimble-fixed``: the largest bucket's build alone (one fixed-batch artifact: every run padded to it);
- ``torch-cudagraph``: the PyTorch model (torchvision's, the weights the ONNX export has; a zoo model's
  PyTorch mirror), one CUDA graph captured per bucket, padded and split as Nimble does; TF32 off.

First every engine's rows for a batch of 11 requests are checked against each row run alone on the
bucketed executor (and PyTorch's against Nimble's). Then every engine serves one request of each bucket's
size through its batcher (the Nimble executors also ran every bucket when their batchers started, and
each PyTorch graph was replayed once after its capture), so no measured request pays a first use.

Garbage collection (``--gc``, the same for every engine): ``off`` (default) collects and freezes
(``gc.freeze()``) everything set up (models, engines, torch, TVM) once the engines are warm, so no later
collection walks it, and disables the collector during each measured window (it collects between
windows, unmeasured): what a serving process does after loading, where a collection is a pause no
engine causes. ``freeze``: frozen, the collector on during windows (collections then walk only what the
window allocated). ``on``: Python's defaults (the first H200 run; shows the stalls). Each row records the
collections seen in its window and the longest.

Then the bucketed engine's capacity is measured closed-loop (--capacity-requests requests queued at once),
and for each load (``--loads``, fractions of that capacity, default 0.25,0.5,0.85; or ``--rates`` in
requests/s) every engine serves open-loop Poisson arrivals of one-row requests for ``--seconds``: latency
from each request's scheduled arrival to its result, p50/p99/p99.9, requests over 50 ms, the longest time
during which requests waited and none completed (``max_stall_ms``: a run's own duration, or a stall), how
late the generator submitted (``max_submit_lag_ms``: it falling behind), throughput (completed requests /
seconds until the last completion), mean rows per run. Writes DIR/batcher_load_<model>.json and prints a
table.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import threading
import time

import numpy as np


def load_models(spec: str):
    """(name, ONNX model, PyTorch module or None) for ``tv:NAME`` / ``timm:NAME`` or ``zoo:NAME``."""
    if spec.startswith("zoo:"):
        from tvm_nimble import zoo
        from tvm_nimble.bench.torch_onnx import torch_module

        model = zoo.get_model(spec[4:])
        return spec[4:], model, torch_module(model).eval()
    from tvm_nimble.cli.bench import model_builders

    name, onnx_builder, torch_builder = model_builders(spec)
    return name, onnx_builder(batch=1, dynamic_batch=True), torch_builder(1).eval()  # bucketed builds


class TorchBuckets:
    """A PyTorch model as the batcher's function: one static input, output and (on a GPU) CUDA graph per
    bucket; ``n`` rows run on the smallest bucket that holds them (zero-padded), more are split. ``dtype``: the
    inputs' torch dtype (default float32; a half-precision model's torch.float16)."""

    def __init__(self, model, row_shape, buckets, cuda: bool, dtype=None):
        import torch

        self.torch, self.cuda, self.buckets = torch, cuda, sorted(buckets)
        dev = "cuda" if cuda else "cpu"
        self.model = model.to(dev)
        self.inp, self.out, self.graphs = {}, {}, {}
        with torch.no_grad():
            for b in self.buckets:
                self.inp[b] = torch.zeros((b, *row_shape), device=dev, dtype=dtype)
                if not cuda:
                    continue
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        self.model(self.inp[b])
                torch.cuda.current_stream().wait_stream(s)
                self.graphs[b] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graphs[b]):
                    self.out[b] = self.model(self.inp[b])
                self.graphs[b].replay()  # the first replay uploads the graph: not a request's
            if cuda:
                torch.cuda.synchronize()

    def __call__(self, x):
        torch = self.torch
        top, parts = self.buckets[-1], []
        for start in range(0, len(x), top):
            rows = min(top, len(x) - start)
            b = min(s for s in self.buckets if s >= rows)
            inp = self.inp[b]
            inp[:rows].copy_(torch.from_numpy(x[start:start + rows]))
            inp[rows:].zero_()
            with torch.no_grad():
                if self.cuda:
                    self.graphs[b].replay()
                else:
                    self.out[b] = self.model(inp)
            parts.append(self.out[b][:rows].float().cpu().numpy())  # (synchronizes)
        return [np.concatenate(parts) if len(parts) > 1 else parts[0]]


def capacity(batcher, x, requests: int) -> float:
    """Requests per second with ``requests`` one-row requests queued at once (full batches)."""
    t0 = time.perf_counter()
    futures = [batcher.submit(x[i % len(x)][None]) for i in range(requests)]
    for f in futures:
        f.result(600)
    return requests / (time.perf_counter() - t0)


def warm_up(batcher, x, buckets) -> None:
    """One request of each bucket's size through ``batcher`` (each waited for: it runs alone, on that bucket)."""
    for b in buckets:
        batcher.submit(np.resize(x, (b, *x.shape[1:]))).result(600)


class GcWatch:
    """The garbage collections (generation, pause) seen while ``watching``."""

    def __init__(self):
        self.watching, self.seen, self._start = False, [], None
        gc.callbacks.append(self)

    def __call__(self, phase, info):
        if not self.watching:
            return
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seen.append((info["generation"], (time.perf_counter() - self._start) * 1e3))

    def close(self):
        gc.callbacks.remove(self)


def max_stall_ms(arrivals, done) -> float:
    """The longest time during which some request had arrived and none completed (seconds in, ms out)."""
    order = np.argsort(done)
    c, a = done[order], arrivals[order]
    waiting_since = np.minimum.accumulate(a[::-1])[::-1]  # after the k-th completion: the oldest still waiting
    starts = np.maximum(np.concatenate([[-np.inf], c[:-1]]), waiting_since)
    return float(np.max(c - starts) * 1e3)


def poisson_run(batcher, x, rate: float, seconds: float, seed: int = 0, gc_mode: str = "off",
                watch: GcWatch | None = None) -> dict:
    """Open-loop Poisson arrivals of one-row requests at ``rate`` per second for ``seconds``. No future is
    kept past its completion (the harness adds no long-lived objects of its own)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=max(int(rate * seconds), 1)))
    n = len(arrivals)
    done = np.full(n, np.nan)
    lag = np.zeros(n)
    left = [n]
    lock, finished = threading.Lock(), threading.Event()

    def complete(i, t0):
        done[i] = time.perf_counter() - t0
        with lock:
            left[0] -= 1
            if not left[0]:
                finished.set()

    runs0, rows0 = batcher.stats["runs"], sum(batcher.stats["batches"])
    if gc_mode == "off":
        gc.collect()  # (unmeasured) then none during the window
        gc.disable()
    if watch is not None:
        watch.seen, watch.watching = [], True
    try:
        t0 = time.perf_counter()
        for i, a in enumerate(arrivals):
            wait = t0 + a - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            lag[i] = time.perf_counter() - t0 - a
            batcher.submit(x[i % len(x)][None]).add_done_callback(lambda _, i=i: complete(i, t0))
        if not finished.wait(600):
            raise TimeoutError(f"{left[0]} of {n} requests not done after 600 s")
    finally:
        if watch is not None:
            watch.watching = False
        if gc_mode == "off":
            gc.enable()
    lat = (done - arrivals) * 1e3
    runs = batcher.stats["runs"] - runs0
    pauses = [ms for _, ms in (watch.seen if watch is not None else [])]
    return {"rate": rate, "requests": n, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "p999_ms": float(np.percentile(lat, 99.9)),
            "max_ms": float(lat.max()), "over_50ms": int((lat > 50).sum()),
            "max_stall_ms": max_stall_ms(arrivals, done), "max_submit_lag_ms": float(lag.max() * 1e3),
            "throughput": n / float(np.nanmax(done)),
            "mean_rows_per_run": (sum(batcher.stats["batches"]) - rows0) / max(runs, 1),
            "gc_collections": len(pauses), "gc_max_pause_ms": max(pauses, default=0.0)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tv:googlenet,tv:resnet50")
    ap.add_argument("--kernels", default="best", choices=["tvm", "vendor", "best"])
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"], help="llvm: a CPU dry run")
    ap.add_argument("--buckets", default="1,2,4,8,16,32")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--loads", default="0.25,0.5,0.85", help="fractions of the bucketed engine's capacity")
    ap.add_argument("--rates", help="requests per second instead of --loads, e.g. 500,2000,5000")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--capacity-requests", type=int, default=4000)
    ap.add_argument("--gc", default="off", choices=["off", "freeze", "on"],
                    help="garbage collection during the measurement, the same for every engine (see the docstring)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import tvm_nimble
    from tvm_nimble.runtime.batcher import Batcher
    from tvm_nimble.runtime.module import BucketedModule

    cuda = args.target == "cuda"
    if cuda:
        from tvm_nimble.bench.harness import set_torch_tf32

        set_torch_tf32(False)
    buckets = [int(b) for b in args.buckets.split(",")]
    kernels = args.kernels if cuda else "tvm"
    table = []
    watch = GcWatch()
    for spec in args.models.split(","):
        name, model, torch_model = load_models(spec)
        t0 = time.perf_counter()
        bucketed = tvm_nimble.build(model, {"kind": args.target}, batch_sizes=buckets, kernels=kernels)
        fixed = BucketedModule.of({buckets[-1]: bucketed.bucket(buckets[-1])})  # the largest bucket alone
        build_s = time.perf_counter() - t0
        plan = bucketed.plan
        row = plan.tensors[plan.inputs[0]].shape[1:]
        x = np.random.default_rng(0).standard_normal((max(64, buckets[-1]), *row)).astype("float32")
        engines = {
            "nimble-buckets": Batcher(tvm_nimble.NimblePool(bucketed, replicas=args.replicas), max_delay_ms=args.delay_ms,
                                      to_numpy=True),
            "nimble-fixed": Batcher(tvm_nimble.NimblePool(fixed, replicas=args.replicas), max_delay_ms=args.delay_ms,
                                    to_numpy=True),
            "torch-cudagraph": Batcher(TorchBuckets(torch_model, row, buckets, cuda), max_batch=buckets[-1],
                                       max_delay_ms=args.delay_ms),
        }
        with tvm_nimble.NimbleExecutor(bucketed) as ex:
            alone = np.concatenate([ex(x[i:i + 1])[0].numpy() for i in range(11)])
        check = {}
        for engine, batcher in engines.items():
            got = np.concatenate([batcher.submit(x[i:i + 1]).result(600)[0] for i in range(11)])
            check[engine] = float(np.abs(got - alone).max() / max(np.abs(alone).max(), 1e-12))
            assert check[engine] < 1e-3, f"{name} {engine}: rows differ from each row alone by {check[engine]:.2e}"
        for batcher in engines.values():
            warm_up(batcher, x, buckets)
        if args.gc != "on":
            gc.collect()
            gc.freeze()  # what is set up now is never walked again
        if args.gc == "off":
            gc.collect()
            gc.disable()
        try:
            cap = capacity(engines["nimble-buckets"], x, args.capacity_requests)
        finally:
            gc.enable()
        rates = ([float(r) for r in args.rates.split(",")] if args.rates else
                 [round(cap * float(f), 1) for f in args.loads.split(",")])
        res = {"model": name, "kernels": kernels, "buckets": buckets, "fixed_batch": buckets[-1],
               "replicas": args.replicas, "delay_ms": args.delay_ms, "gc": args.gc, "build_s": build_s,
               "max_rel_error_vs_alone": check, "capacity_per_s": cap, "rows": []}
        for rate in rates:
            for engine, batcher in engines.items():
                r = {"engine": engine, **poisson_run(batcher, x, rate, args.seconds, gc_mode=args.gc, watch=watch)}
                res["rows"].append(r)
                table.append((name, r))
                print(f"{name:12s} {engine:16s} {rate:9.1f}/s  p50 {r['p50_ms']:8.3f} ms  p99 {r['p99_ms']:8.3f} ms  "
                      f"p99.9 {r['p999_ms']:8.3f} ms  stall {r['max_stall_ms']:7.1f} ms  {r['throughput']:9.1f}/s  "
                      f"{r['mean_rows_per_run']:5.1f} rows/run  gc {r['gc_collections']} "
                      f"(max {r['gc_max_pause_ms']:.1f} ms)", flush=True)
        for batcher in engines.values():
            batcher.close()
            if getattr(batcher, "_target", None) is not None:
                batcher._target.close()  # the pools made here
        if args.gc != "on":
            gc.unfreeze()  # this model's objects may go now
        with open(os.path.join(args.out, f"batcher_load_{name}.json"), "w") as f:
            json.dump(res, f, indent=1)
    watch.close()
    print(f"\n{'model':12s} {'engine':16s} {'load/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'p99.9 ms':>8s} "
          f"{'stall ms':>8s} {'>50ms':>6s} {'done/s':>9s} {'rows/run':>8s} {'gc':>3s}")
    for name, r in table:
        print(f"{name:12s} {r['engine']:16s} {r['rate']:9.1f} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['p999_ms']:8.3f} "
              f"{r['max_stall_ms']:8.1f} {r['over_50ms']:6d} {r['throughput']:9.1f} {r['mean_rows_per_run']:8.1f} "
              f"{r['gc_collections']:3d}")


if __name__ == "__main__":
    main()
