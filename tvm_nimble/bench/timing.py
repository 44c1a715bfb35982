"""Host-side cost of one call (e.g. one CUDA graph launch), for the GPU validation script."""
from __future__ import annotations

import time

import numpy as np


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
