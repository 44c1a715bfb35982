"""Timing built plans where they run: what the kernel choice, the stream choice and ``explain --profile``
measure with (CUDA-graph replays, interleaved so that drift hits all alike), on this machine or, through
:mod:`.rpc_session`, on an RPC server's GPU. Runtime only: it takes built or loaded modules."""
from __future__ import annotations

import time

import numpy as np

from tvm_nimble.errors import NimbleError


def random_inputs(plan, seed: int = 0) -> list[np.ndarray]:
    """Seeded inputs of the plan's shapes and dtypes: standard normals for floats; ids within their
    table for the inputs that index one (the executor refuses others, and a kernel would read out of
    bounds); 0/1 for other integer inputs (a mask) and booleans."""
    rng = np.random.default_rng(seed)
    out = []
    for tid in plan.inputs:
        t = plan.tensors[tid]
        if np.issubdtype(np.dtype(t.dtype), np.floating):
            value = rng.standard_normal(t.shape)
        else:
            value = rng.integers(0, plan.index_bounds.get(t.name) or 2, t.shape)
        out.append(value.astype(t.dtype))
    return out


def set_random_inputs(ex, plan, seed: int = 0):
    """:func:`random_inputs` set on the executor ``ex``."""
    for i, value in enumerate(random_inputs(plan, seed)):
        ex.set_input(i, value)


def _executor(module):
    """CUDA-graph executor on the GPU for a CUDA plan, the sequential one on the CPU otherwise."""
    from .executor import Executor

    return Executor(module, mode="cuda-graph" if module.plan.target.get("kind") == "cuda" else None)


#: a round of one module runs about this long at most (fewer iterations for slow runs, at least MIN_ITERS):
#: 50 ms keeps 40 replays a round up to 1.25 ms a run; nasnetalarge's dozen candidates (~5 ms a run) took 12 s
#: of replays at 200 ms, a fifth of its cold build
ROUND_MS = 50.0
MIN_ITERS = 5


def replay_ms(modules: list, rounds: int = 5, iters: int = 40) -> list[float]:
    """Median ms of one run (launch to synchronize; a CUDA-graph replay on a GPU) of each module, interleaved.
    A round runs ``iters`` times each, fewer (not under ``MIN_ITERS``) where that would take over
    ``ROUND_MS``: a large batch must not turn a stream choice into minutes of replays."""
    executors = [_executor(m) for m in modules]
    try:
        samples: list[list[float]] = [[] for _ in modules]
        warm_ms = []
        for ex, m in zip(executors, modules):
            set_random_inputs(ex, m.plan)
            ex.run()
            ex.sync()
            t0 = time.perf_counter()
            for _ in range(10):
                ex.run()
            ex.sync()
            warm_ms.append((time.perf_counter() - t0) * 1e2)
        iters = max(MIN_ITERS, min(iters, int(ROUND_MS / max(max(warm_ms), 1e-6))))
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


def _profiles(module, reps: int) -> list[list[tuple]]:
    if module.plan.target.get("kind") != "cuda":
        raise NimbleError("per-launch timing brackets kernels with CUDA events: it needs a CUDA build on a GPU")
    with _executor(module) as ex:
        set_random_inputs(ex, module.plan)
        ex.run()
        ex.sync()
        return [ex.profile(graph=True) for _ in range(reps)]


def launch_ms(module, reps: int = 15) -> list[float]:
    """Median ms of every launch of ``module``'s plan, each bracketed by events inside one CUDA graph."""
    runs = _profiles(module, reps)
    return [float(np.median([r[i][4] - r[i][3] for r in runs])) for i in range(len(module.plan.launches))]


def timeline(module, reps: int = 5) -> list[tuple[int, float, float]]:
    """(stream, start ms, end ms) per launch of ``module``'s plan, from the replay with the median end
    of ``reps`` replays with every launch bracketed by events (one CUDA graph, so overlap is real)."""
    runs = _profiles(module, reps)
    runs.sort(key=lambda rows: max(r[4] for r in rows))
    return [(r[1], r[3], r[4]) for r in runs[len(runs) // 2]]
