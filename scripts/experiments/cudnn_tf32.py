"""Experiment: why our cuDNN convolutions get no TF32 speed on resnet50 at batch 1 (PyTorch alone).

Why: Nimble's resnet50 in TF32 ran at its fp32 speed, about twice PyTorch's time, with half PyTorch's TF32
error, so its convolutions ran few TF32 kernels (see benchmarks/findings.md, 'Our fp32 GEMM for transformers,
build times, precision rows of the chains'). Ours call cuDNN's legacy API (the
heuristic's first algorithm of cudnnGetConvolutionForwardAlgorithm_v7 that fits an 8 MiB workspace); timing
every such candidate did not help. This separates the suspects on PyTorch's side, each a fresh process:
cudnn.benchmark on and off (PyTorch's heuristics-only mode) and the workspace capped at 8 MiB
(``CUDNN_CONV_WSCAP_DBG``, PyTorch's cap in MiB), in fp32, TF32 and fp16, NCHW, one CUDA graph per forward.

    bash scripts/gpu_session.sh "experiment cudnn_tf32 200"

Writes DIR/cudnn_tf32.json; prints one line per configuration (ms per forward).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CONFIGS = [  # (precision, cudnn.benchmark, workspace cap in MiB or None)
    ("fp32", True, None), ("tf32", True, None), ("tf32", False, None), ("tf32", True, 8), ("tf32", False, 8),
    ("fp16", True, None), ("fp16", False, None), ("fp16", True, 8),
]


def one(precision: str, benchmark: bool, model: str) -> float:
    """ms per forward of torchvision ``model`` at batch 1, replayed as a CUDA graph (run in a child process)."""
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    net = getattr(torchvision.models, model)().eval().cuda()
    x = torch.randn(1, 3, 224, 224, device="cuda")
    if precision == "fp16":
        net, x = net.half(), x.half()
    side = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(5):
            net(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        net(x)
    times = []
    for _ in range(50):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            g.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 10)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/cudnn_tf32")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--child", nargs=2, metavar=("PRECISION", "BENCHMARK"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(one(args.child[0], args.child[1] == "1", args.model)))
        return 0
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for precision, benchmark, cap in CONFIGS:
        env = dict(os.environ)
        if cap is not None:
            env["CUDNN_CONV_WSCAP_DBG"] = str(cap)
        r = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", precision, str(int(benchmark))],
                           capture_output=True, text=True, env=env)
        ms = float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
        rows.append({"precision": precision, "benchmark": benchmark, "workspace_cap_mib": cap, "ms": ms,
                     "error": None if r.returncode == 0 else r.stderr.strip().splitlines()[-1][:300]})
        print(f"{args.model} {precision:5} benchmark={int(benchmark)} cap={cap or '-':>3} MiB: "
              f"{ms if ms is None else round(ms, 3)} ms", flush=True)
    with open(os.path.join(args.out, "cudnn_tf32.json"), "w") as f:
        json.dump({"model": args.model, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
