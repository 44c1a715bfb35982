"""Timing built plans on this machine's GPU: what the kernel choice, the stream choice and
``explain --profile`` measure with (CUDA-graph replays, interleaved so that drift hits all alike)."""
from __future__ import annotations

import time

import numpy as np
import tvm


def set_random_inputs(ex, plan, seed: int = 0):
    """Standard-normal inputs of the plan's shapes and dtypes, seeded."""
    rng = np.random.default_rng(seed)
    for i, tid in enumerate(plan.inputs):
        t = plan.tensors[tid]
        ex.set_input(i, rng.standard_normal(t.shape).astype(t.dtype))


def replay_ms(results: list, rounds: int = 5, iters: int = 40) -> list[float]:
    """Median ms of one CUDA-graph replay (launch to synchronize) of each built model, interleaved."""
    from tvm_nimble.runtime.executor import NimbleExecutor

    executors = [NimbleExecutor(r, tvm.cuda(0), mode="cuda-graph") for r in results]
    try:
        samples: list[list[float]] = [[] for _ in results]
        for ex, r in zip(executors, results):
            set_random_inputs(ex, r.plan)
            for _ in range(10):
                ex.run()
            ex.sync()
        for _ in range(rounds):
            for ex, s in zip(executors, samples):
                for _ in range(iters):
                    t0 = time.perf_counter()
                    ex.run()
                    ex.sync()
                    s.append((time.perf_counter() - t0) * 1e3)
        return [float(np.median(s)) for s in samples]
    finally:
        for ex in executors:
            ex.close()


def timeline(result, reps: int = 5) -> list[tuple[int, float, float]]:
    """(stream, start ms, end ms) per launch of ``result``'s plan, from the replay with the median end
    of ``reps`` replays with every launch bracketed by events (one CUDA graph, so overlap is real)."""
    from tvm_nimble.runtime.executor import NimbleExecutor

    with NimbleExecutor(result, tvm.cuda(0), mode="cuda-graph") as ex:
        set_random_inputs(ex, result.plan)
        ex.run()
        ex.sync()
        runs = [ex.profile(graph=True) for _ in range(reps)]
    runs.sort(key=lambda rows: max(r[4] for r in rows))
    return [(r[1], r[3], r[4]) for r in runs[len(runs) // 2]]
