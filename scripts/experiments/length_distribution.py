"""Experiment: prompts of varying length at batch 1 (issue #52): one bucketed Nimble artifact
(``build(..., buckets={"sequence_length": [...]})``) against PyTorch with a CUDA graph captured per bucket (inputs
padded to the bucket, right padding masked), torch.compile with dynamic shapes (each prompt at its own length) and
ONNX Runtime's CUDA execution provider on the dynamic-shape ONNX export (its own length, outputs bound on the GPU).

Prompt lengths are drawn uniformly from --min-length..--max-length (seeded); every system runs the same prompts,
interleaved request by request. A request's latency is the host's wall time from its numpy token ids to the logits
of its real positions ready on the GPU. Before timing, each system's logits at three lengths are checked against
PyTorch's float32 eager output of the same prompt (relative L2, with the bench's tolerance for the precision).

    bash scripts/gpu_session.sh "experiment length_distribution 500 --models hf:gpt2 --precision fp16"
    python3 scripts/experiments/length_distribution.py --models hf:gpt2-tiny --target llvm --requests 50 \\
        --buckets 8,16 --max-length 16 --out DIR

Writes DIR/length_distribution.json (per system: p50, p90, p99, mean ms, p50/p99 per bucket, the p50 of each
bucket's replay alone where the system has one (what a request adds to it is host work), the phases of each bucket's
build, the requests a garbage collection ran in and its milliseconds; the build seconds; every request's length and
each system's time for it) and prints a table.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 2e-2, "bf16": 1e-1}  # relative L2, as the bench's checks


def _rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class _GcClock:
    """The milliseconds Python's garbage collector ran since ``total`` was last reset (``gc.callbacks``): a
    collection inside a timed request is host time no replay explains."""

    def __init__(self):
        import gc

        self.total, self._start, self._gc = 0.0, None, gc
        gc.callbacks.append(self._tick)

    def _tick(self, phase, _info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.total += (time.perf_counter() - self._start) * 1e3
            self._start = None

    def close(self):
        self._gc.callbacks.remove(self._tick)


def _bucket(n: int, buckets) -> int:
    """The smallest of ``buckets`` that holds ``n`` tokens (what the bucketed artifact and the per-bucket peer run)."""
    return min(b for b in buckets if b >= n)


def _wall_ms(run, reps: int) -> list[float]:
    """Host wall times (ms) of ``reps`` calls of ``run``."""
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def _by_bucket(times: np.ndarray, bucket_of: np.ndarray, buckets) -> dict:
    """Each bucket's requests' count and p50/p99 (ms): where in the length range a system's tail comes from."""
    out = {}
    for b in sorted(buckets):
        t = times[bucket_of == b]
        if len(t):
            out[str(b)] = {"requests": int(len(t)), "p50_ms": float(np.percentile(t, 50)),
                           "p99_ms": float(np.percentile(t, 99))}
    return out


def _feeds(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ids[None, :].astype(np.int64), np.ones((1, len(ids)), np.int64)


class NimbleBuckets:
    """The bucketed artifact: the executor pads to the smallest bucket and returns the real positions."""

    name = "nimble-buckets"

    def __init__(self, model, target, buckets, args):
        import tvm

        import tvm_nimble

        start = time.perf_counter()
        result = tvm_nimble.build(model, target, buckets={"batch": [1], "sequence_length": buckets}, kernels=args.kernels,
                                  precision=args.precision)
        self.executor = tvm_nimble.NimbleExecutor(result)
        self.dev = tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)
        self.build_s = time.perf_counter() - start
        self.phases = {result.space.label(k): m.info.get("phases", {}) for k, m in result.buckets.items()}

    def __call__(self, ids):
        out = self.executor(*_feeds(ids), copy=False)[0]
        self.dev.sync()
        return out

    def logits(self, ids):
        return self(ids).numpy()

    def replay_ms(self, bucket: int, reps: int) -> list[float]:
        """Host wall times of the bucket's replay alone (launch and wait, the inputs left as they are)."""
        axis = self.executor.space.names.index("sequence_length")
        return _wall_ms(self.executor.bucket(next(k for k in self.executor.keys if k[axis] == bucket)).replay, reps)


class TorchPerBucket:
    """PyTorch (SDPA attention) with one CUDA graph captured per bucket; a prompt is padded to its bucket.

    Captured with a mask of ones, as a full-length prompt: transformers decides on the host, from the mask's values,
    whether to build a padding mask at all (masking_utils' ``_ignore_causal_mask_sdpa``), and a graph keeps what the
    capture decided (captured with an all-padding mask, its replays failed the logits check; benchmarks/findings.md).
    With ones the graph runs the causal attention alone; the real positions of a right-padded prompt never attend to
    the padding after them, so their logits are exact."""

    name = "torch-cuda-graph-buckets"

    def __init__(self, module, buckets, dtype):
        import torch

        start = time.perf_counter()
        self.torch, self.buckets, self.graphs = torch, sorted(buckets), {}
        module = module.to("cuda", dtype)
        with torch.no_grad():
            for b in self.buckets:
                ids = torch.zeros(1, b, dtype=torch.int64, device="cuda")
                mask = torch.ones(1, b, dtype=torch.int64, device="cuda")
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        module(ids, mask)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = module(ids, mask)
                self.graphs[b] = (graph, ids, mask, out)
        self.module = module  # the graphs read its weights: freed, their memory would be reused under the replays
        torch.cuda.synchronize()
        self.build_s = time.perf_counter() - start

    def __call__(self, ids):
        n = len(ids)
        bucket = _bucket(n, self.buckets)
        graph, static_ids, static_mask, out = self.graphs[bucket]
        host_ids = np.zeros((1, bucket), np.int64)
        host_ids[0, :n] = ids
        host_mask = np.zeros((1, bucket), np.int64)
        host_mask[0, :n] = 1
        static_ids.copy_(self.torch.from_numpy(host_ids))
        static_mask.copy_(self.torch.from_numpy(host_mask))
        graph.replay()
        self.torch.cuda.synchronize()
        return out[:, :n]

    def logits(self, ids):
        return self(ids).float().cpu().numpy()

    def replay_ms(self, bucket: int, reps: int) -> list[float]:
        """Host wall times of the bucket's graph replay alone (launch and wait)."""
        graph = self.graphs[bucket][0]
        return _wall_ms(lambda: (graph.replay(), self.torch.cuda.synchronize()), reps)


class TorchDynamic:
    """torch.compile(dynamic=True): each prompt at its own length, no padding."""

    name = "torch-compile-dynamic"

    def __init__(self, module, dtype, warm_lengths):
        import torch

        start = time.perf_counter()
        self.torch = torch
        self.fn = torch.compile(module.to("cuda", dtype), dynamic=True)
        with torch.no_grad():
            for n in warm_lengths:
                self.fn(*[torch.from_numpy(x).cuda() for x in _feeds(np.zeros(n, np.int64))])
        torch.cuda.synchronize()
        self.build_s = time.perf_counter() - start

    def __call__(self, ids):
        with self.torch.no_grad():
            out = self.fn(*[self.torch.from_numpy(x).cuda() for x in _feeds(ids)])
        self.torch.cuda.synchronize()
        return out

    def logits(self, ids):
        return self(ids).float().cpu().numpy()


class OrtDynamic:
    """ONNX Runtime's CUDA execution provider on the dynamic-shape export; logits bound on the GPU."""

    name = "ort-cuda-dynamic"

    def __init__(self, model, precision):
        import onnxruntime as ort

        from tvm_nimble.bench.onnxruntime_peer import fp16_model, serialized

        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        if precision == "fp16":
            model = fp16_model(model)
        start = time.perf_counter()
        with serialized(model) as blob:
            self.sess = ort.InferenceSession(blob, providers=[("CUDAExecutionProvider", {
                "use_tf32": "1" if precision == "tf32" else "0"})])
        self.ort, self.output = ort, self.sess.get_outputs()[0].name
        self(np.zeros(8, np.int64))
        self.build_s = time.perf_counter() - start

    def __call__(self, ids):
        binding = self.sess.io_binding()
        ids2, mask = _feeds(ids)
        binding.bind_cpu_input("input_ids", ids2)
        binding.bind_cpu_input("attention_mask", mask)
        binding.bind_output(self.output, "cuda")
        self.sess.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return binding

    def logits(self, ids):
        return self(ids).copy_outputs_to_cpu()[0]


def _systems(spec, args, target, buckets):
    """The systems that could be made, and the one-line reasons for those that could not."""
    import torch

    from tvm_nimble.bench.harness import peer_or_why
    from tvm_nimble.bench.hf_models import hf_builders

    _, onnx_builder, torch_builder = hf_builders(spec)
    dynamic = onnx_builder(1, dynamic=True)
    systems, notes = [NimbleBuckets(dynamic, target, buckets, args)], []
    if target.kind.name != "cuda":
        return systems, ["llvm: the PyTorch and ONNX Runtime peers run on the GPU only"], torch_builder
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.precision]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    peers = [("PyTorch per bucket", lambda: TorchPerBucket(torch_builder(1), buckets, dtype)),
             ("torch.compile dynamic",
              lambda: TorchDynamic(torch_builder(1), dtype, sorted({args.min_length, 100, args.max_length})))]
    if args.precision == "bf16":  # ONNX Runtime has no bf16 conversion of an fp32 model (as the bench's ORT rows)
        notes.append("ONNX Runtime: no bf16 rows")
    else:
        peers.append(("ONNX Runtime", lambda: OrtDynamic(dynamic, args.precision)))
    for title, make in peers:  # a peer that cannot run is left out with its reason, as in the bench
        made, why = peer_or_why(title, lambda: ([make()], []))
        systems += made
        notes += why
    return systems, notes, torch_builder


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="hf:gpt2")
    ap.add_argument("--precision", default="fp16", choices=list(TOLERANCE))
    ap.add_argument("--kernels", default="best", choices=["tvm", "vendor", "best"])
    ap.add_argument("--buckets", default="64,128,256,512")
    ap.add_argument("--min-length", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="stop the timed loop after this long (0: never), keeping the requests timed so far")
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    from tvm_nimble.compiler.target import resolve_target

    target = resolve_target(args.target)
    if args.target == "llvm" and args.kernels != "tvm":
        args.kernels = "tvm"
    buckets = [int(b) for b in args.buckets.split(",")]
    rng = np.random.default_rng(0)
    report = {"precision": args.precision, "buckets": buckets, "requests": args.requests, "models": {}}
    for spec in args.models.split(","):
        import torch

        systems, notes, torch_builder = _systems(spec, args, target, buckets)
        reference = torch_builder(1).eval()
        vocab = reference.model.config.vocab_size
        errors = {}
        for n in sorted({args.min_length, (args.min_length + args.max_length) // 2, args.max_length}):
            ids = rng.integers(0, vocab, size=n)
            with torch.no_grad():
                expected = reference(*[torch.from_numpy(x) for x in _feeds(ids)]).numpy()
            for s in systems:
                err = _rel_l2(s.logits(ids), expected)
                errors.setdefault(s.name, []).append(err)
                if not err <= TOLERANCE[args.precision]:  # NaN fails too
                    notes.append(f"{s.name}: length {n} relative L2 {err:.2e} over {TOLERANCE[args.precision]}: not timed")
        checked = [s for s in systems if all(e <= TOLERANCE[args.precision] for e in errors[s.name])]
        lengths = rng.integers(args.min_length, args.max_length + 1, size=args.requests)
        prompts = [rng.integers(0, vocab, size=n) for n in lengths]
        for s in checked:  # warm every bucket / length once
            for n in buckets:
                s(rng.integers(0, vocab, size=min(n, args.max_length)))
        times = {s.name: [] for s in checked}
        collected = {s.name: [] for s in checked}  # the milliseconds of Python's garbage collections within a request
        gc_ms = _GcClock()
        began = time.perf_counter()
        for i, ids in enumerate(prompts if checked else []):
            if i and args.max_seconds and time.perf_counter() - began > args.max_seconds:
                notes.append(f"the timed loop stopped after {i} of {len(prompts)} requests (--max-seconds "
                             f"{args.max_seconds:g})")
                lengths = lengths[:i]
                break
            for s in checked[i % len(checked):] + checked[:i % len(checked)]:  # who goes first rotates
                gc_ms.total = 0.0
                start = time.perf_counter()
                s(ids)
                times[s.name].append((time.perf_counter() - start) * 1e3)
                collected[s.name].append(gc_ms.total)
        gc_ms.close()
        replays = {s.name: {str(b): float(np.median(s.replay_ms(b, 50))) for b in buckets}
                   for s in checked if hasattr(s, "replay_ms")}  # a bucket's run alone: the rest of a request is host
        bucket_of = np.array([_bucket(n, buckets) for n in lengths])
        rows = {name: {"p50_ms": float(np.percentile(t, 50)), "p90_ms": float(np.percentile(t, 90)),
                       "p99_ms": float(np.percentile(t, 99)), "mean_ms": float(np.mean(t)),
                       "build_s": next(s.build_s for s in checked if s.name == name),
                       "build_phases_s": next(getattr(s, "phases", {}) for s in checked if s.name == name),
                       "max_rel_err": max(errors[name]),
                       "by_bucket": _by_bucket(np.asarray(t), bucket_of, buckets),
                       "replay_p50_ms": replays.get(name, {}),
                       "gc": {"requests": int(np.count_nonzero(collected[name])),
                              "ms": float(np.sum(collected[name]))}} for name, t in times.items()}
        report["models"][spec] = {"systems": rows, "notes": notes,
                                  "unchecked_errors": {k: v for k, v in errors.items() if k not in rows},
                                  "lengths": [int(n) for n in lengths],  # each request's, in order, and its times:
                                  "times_ms": {k: [round(x, 4) for x in t] for k, t in times.items()}}
        print(f"{spec} {args.precision}, {args.requests} prompts of {args.min_length}..{args.max_length} tokens, "
              f"buckets {buckets}")
        print(f"  {'system':28s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'build s':>8s} {'rel err':>9s}")
        for name, r in rows.items():
            print(f"  {name:28s} {r['p50_ms']:8.3f} {r['p90_ms']:8.3f} {r['p99_ms']:8.3f} {r['build_s']:8.1f} "
                  f"{r['max_rel_err']:9.2e}")
        for b in sorted(buckets):
            print(f"  prompts of bucket {b}: " + ", ".join(
                f"{name} p50 {r['by_bucket'][str(b)]['p50_ms']:.3f} p99 {r['by_bucket'][str(b)]['p99_ms']:.3f}"
                for name, r in rows.items() if str(b) in r["by_bucket"]))
        for name, r in rows.items():
            if r["replay_p50_ms"]:  # and what a request adds to it: the host's work and the copies in and out
                r["request_over_replay_ms"] = {b: r["by_bucket"][b]["p50_ms"] - ms
                                               for b, ms in r["replay_p50_ms"].items() if b in r["by_bucket"]}
                print(f"  {name} replay alone p50 per bucket: " + ", ".join(
                    f"{b} {ms:.3f}" for b, ms in r["replay_p50_ms"].items()) + "; a request's p50 over it: " + ", ".join(
                    f"{b} {ms:.3f}" for b, ms in r["request_over_replay_ms"].items()))
        for name, r in rows.items():
            for label, phases in r["build_phases_s"].items():  # where a bucketed build's seconds went
                print(f"  {name} build of bucket {label}: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
        print("  garbage collections within requests: " + ", ".join(
            f"{name} {r['gc']['requests']} ({r['gc']['ms']:.2f} ms)" for name, r in rows.items()))
        for n in notes:
            print(f"  note: {n}")
    with open(os.path.join(args.out, "length_distribution.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
