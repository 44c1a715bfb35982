"""Latency measurement shared by the demo and the benchmarks: warm-up, then median and p90."""
from __future__ import annotations

import time

import numpy as np


def measure(fn, sync=None, warmup: int = 10, iters: int = 100, min_seconds: float = 0.0) -> dict:
    """Time ``fn`` (followed by ``sync``) ``iters`` times after ``warmup`` calls; milliseconds."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    start = time.perf_counter()
    while len(samples) < iters or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    a = np.asarray(samples)
    return {"median_ms": float(np.median(a)), "p90_ms": float(np.percentile(a, 90)), "n": len(a)}


def host_cost_us(fn, iters: int = 2000, sync=None) -> float:
    """Median host time of ``fn`` alone (e.g. one graph launch), in microseconds, synchronizing in batches."""
    sync = sync or (lambda: None)
    samples = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
        if i % 50 == 49:
            sync()
    sync()
    return float(np.median(samples))
