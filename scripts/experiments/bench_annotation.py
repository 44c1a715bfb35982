"""Experiment (CPU): time stage 1 on a real ~1,500-kernel Relax module: DAG extraction + Nimble
assignment + IR rewrite.

Builds the zoo Inception-style net with enough blocks for ~1,500 kernels, runs TVM's kernel
passes once (not timed), then times the AnnotateStreams pass (median of 3).

Findings: no GPU session; the compile-time figure in README.md (0.45 s for 150 Inception blocks)
comes from this, run on the development machine. Raw outputs: none kept (one printed line).

    python scripts/experiments/bench_annotation.py [--blocks 150]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=150)
    args = ap.parse_args()
    import tvm

    from tvm_nimble import zoo
    from tvm_nimble.compiler.target import resolve_target
    from tvm_nimble.compiler.frontend import from_onnx
    from tvm_nimble.relay_passes.annotate import AnnotateStreams
    from tvm_nimble.relay_passes.lowered_ir import read_lowered_function
    from tvm_nimble.relay_passes.pipeline import kernel_passes

    target = resolve_target("llvm")
    t0 = time.perf_counter()
    mod = from_onnx(zoo.inception(blocks=args.blocks, hw=8, channels=8))
    with target:
        lowered = tvm.transform.Sequential(kernel_passes(target))(mod)
    prep = time.perf_counter() - t0
    kernels = len(read_lowered_function(lowered).kernels)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        annotated = AnnotateStreams()(lowered)
        times.append(time.perf_counter() - t)
    streams = int(annotated["main"].attrs["nimble_num_streams"])
    print(f"kernels {kernels}  streams {streams}  annotate (parse + assign + rewrite) median "
          f"{statistics.median(times):.3f} s  (TVM lowering, not timed: {prep:.1f} s; cpus {os.cpu_count()})")


if __name__ == "__main__":
    main()
