"""Experiment: serving under Poisson load (issue #35): bucketed Nimble behind the dynamic batcher, against one
fixed-batch Nimble artifact and PyTorch's CUDA graphs behind the same batcher.

Not yet run on a GPU (written with the CPU part of #35; dry-run on llvm by tests/test_batcher.py).

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
bucketed executor (and PyTorch's against Nimble's). Then the bucketed engine's capacity is measured
closed-loop (--capacity-requests requests queued at once), and for each load (``--loads``, fractions of
that capacity, default 0.25,0.5,0.85; or ``--rates`` in requests/s) every engine serves open-loop Poisson
arrivals of one-row requests for ``--seconds``: latency from each request's scheduled arrival to its
result, p50/p99, throughput (completed requests / seconds until the last completion), mean rows per run.
Writes DIR/batcher_load_<model>.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
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
    return name, onnx_builder(batch=1), torch_builder(1).eval()


class TorchBuckets:
    """A PyTorch model as the batcher's function: one static input, output and (on a GPU) CUDA graph per
    bucket; ``n`` rows run on the smallest bucket that holds them (zero-padded), more are split."""

    def __init__(self, model, row_shape, buckets, cuda: bool):
        import torch

        self.torch, self.cuda, self.buckets = torch, cuda, sorted(buckets)
        dev = "cuda" if cuda else "cpu"
        self.model = model.to(dev)
        self.inp, self.out, self.graphs = {}, {}, {}
        with torch.no_grad():
            for b in self.buckets:
                self.inp[b] = torch.zeros((b, *row_shape), device=dev)
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


def poisson_run(batcher, x, rate: float, seconds: float, seed: int = 0) -> dict:
    """Open-loop Poisson arrivals of one-row requests at ``rate`` per second for ``seconds``."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=max(int(rate * seconds), 1)))
    done = np.full(len(arrivals), np.nan)
    runs0, rows0 = batcher.stats["runs"], sum(batcher.stats["batches"])
    t0 = time.perf_counter()
    futures = []
    for i, a in enumerate(arrivals):
        wait = t0 + a - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        f = batcher.submit(x[i % len(x)][None])
        f.add_done_callback(lambda _, i=i: done.__setitem__(i, time.perf_counter() - t0))
        futures.append(f)
    for f in futures:
        f.result(600)
    lat = (done - arrivals) * 1e3
    runs = batcher.stats["runs"] - runs0
    return {"rate": rate, "requests": len(arrivals), "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "throughput": len(arrivals) / float(np.nanmax(done)),
            "mean_rows_per_run": (sum(batcher.stats["batches"]) - rows0) / max(runs, 1)}


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
    for spec in args.models.split(","):
        name, model, torch_model = load_models(spec)
        t0 = time.perf_counter()
        bucketed = tvm_nimble.build(model, {"kind": args.target}, batch_sizes=buckets, kernels=kernels)
        fixed = BucketedModule.of({buckets[-1]: bucketed.buckets[buckets[-1]]})  # the largest bucket alone
        build_s = time.perf_counter() - t0
        plan = bucketed.plan
        row = plan.tensors[plan.inputs[0]].shape[1:]
        x = np.random.default_rng(0).standard_normal((64, *row)).astype("float32")
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
        cap = capacity(engines["nimble-buckets"], x, args.capacity_requests)
        rates = ([float(r) for r in args.rates.split(",")] if args.rates else
                 [round(cap * float(f), 1) for f in args.loads.split(",")])
        res = {"model": name, "kernels": kernels, "buckets": buckets, "fixed_batch": buckets[-1],
               "replicas": args.replicas, "delay_ms": args.delay_ms, "build_s": build_s,
               "max_rel_error_vs_alone": check, "capacity_per_s": cap, "rows": []}
        for rate in rates:
            for engine, batcher in engines.items():
                r = {"engine": engine, **poisson_run(batcher, x, rate, args.seconds)}
                res["rows"].append(r)
                table.append((name, r))
                print(f"{name:12s} {engine:16s} {rate:9.1f}/s  p50 {r['p50_ms']:8.3f} ms  p99 {r['p99_ms']:8.3f} ms  "
                      f"{r['throughput']:9.1f}/s  {r['mean_rows_per_run']:5.1f} rows/run", flush=True)
        for batcher in engines.values():
            batcher.close()
            if getattr(batcher, "_target", None) is not None:
                batcher._target.close()  # the pools made here
        with open(os.path.join(args.out, f"batcher_load_{name}.json"), "w") as f:
            json.dump(res, f, indent=1)
    print(f"\n{'model':12s} {'engine':16s} {'load/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'done/s':>9s} {'rows/run':>8s}")
    for name, r in table:
        print(f"{name:12s} {r['engine']:16s} {r['rate']:9.1f} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} "
              f"{r['throughput']:9.1f} {r['mean_rows_per_run']:8.1f}")


if __name__ == "__main__":
    main()
