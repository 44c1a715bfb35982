"""Timing built plans where they run: what the kernel choice, the stream choice and ``explain --profile``
measure with (CUDA-graph replays, interleaved so that drift hits all alike), on this machine or, through
:mod:`.rpc_session`, on an RPC server's GPU. Runtime only: it takes built or loaded modules."""
from __future__ import annotations

import time
from dataclasses import dataclass

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
#: the rounds every side-by-side replay runs, and at most this many more while its two fastest modules are
#: within noise of each other (:meth:`PairedGain.clear`): more rounds where the answer is close, not everywhere
ROUNDS = 5
EXTRA_ROUNDS = 10
#: a module is faster beyond noise only if it was faster in at least this share of the rounds
WIN_SHARE = 0.8
#: the median absolute deviation times this estimates a standard deviation where the noise is normal
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class ReplayTimes:
    """Side-by-side replay times: ``rounds[r][m]``, the median ms of module ``m``'s runs in round ``r``. Every
    module runs in every round, one after the other, so one round's numbers share its conditions (clocks,
    temperature, other work on the GPU): compare modules round by round (:func:`paired_gain`)."""

    rounds: tuple[tuple[float, ...], ...]

    def __post_init__(self):
        rounds = tuple(tuple(float(x) for x in r) for r in self.rounds)
        if not rounds or not rounds[0] or len({len(r) for r in rounds}) != 1:
            raise ValueError(f"replay times need one number per module in every round, got {self.rounds!r}")
        object.__setattr__(self, "rounds", rounds)

    @property
    def modules(self) -> int:
        return len(self.rounds[0])

    def of(self, module: int) -> list[float]:
        """Module ``module``'s time in each round."""
        return [r[module] for r in self.rounds]

    def median(self) -> list[float]:
        """Each module's median over the rounds: its one number."""
        return [float(np.median(self.of(m))) for m in range(self.modules)]

    def to_json(self) -> list[list[float]]:
        return [list(r) for r in self.rounds]

    @classmethod
    def from_json(cls, value) -> "ReplayTimes":
        if not cls.is_json(value):
            raise ValueError(f"not replay times (a list of rounds, each a list of numbers): {value!r:.200}")
        return cls(value)

    @staticmethod
    def is_json(value, modules: int | None = None) -> bool:
        """Whether ``value`` is :meth:`to_json`'s form (of ``modules`` modules, when given)."""
        return (isinstance(value, list) and bool(value) and all(isinstance(r, list) for r in value)
                and len({len(r) for r in value}) == 1 and len(value[0]) == (modules or len(value[0])) > 0
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for r in value for x in r))


@dataclass(frozen=True)
class PairedGain:
    """How much faster module ``other`` ran than module ``base``, round by round (:func:`paired_gain`): ``gain``
    the median over the rounds of ``(base - other) / base``, ``spread`` the median absolute deviation of those
    round-by-round gains times :data:`MAD_TO_SIGMA`, ``wins`` the rounds ``other`` was faster in, of ``rounds``."""

    gain: float
    spread: float
    wins: int
    rounds: int

    def clear(self, min_gain: float = 0.0) -> bool:
        """Whether ``other`` is faster beyond noise: in at least :data:`WIN_SHARE` of the rounds, by a median gain
        over both ``min_gain`` and the spread.

        Why this rule: a pair's rounds ran under the same conditions, so their differences cancel drift that moves
        both (which two medians taken apart do not); a gain that is real shows in most rounds, and is larger than
        what the rounds vary by. A significance test (a sign test, Wilcoxon's) answers another question: at 5 rounds
        it needs every round to agree, so one outlier round would decide, and at 15 it calls a 0.3% gain real that
        is not worth a more complex schedule. The median and the median absolute deviation are not moved by one
        outlier round; 80% of the rounds lets one of 5 go the other way."""
        return self.wins >= WIN_SHARE * self.rounds - 1e-9 and self.gain > max(min_gain, self.spread)

    def describe(self) -> str:
        """``3.1% ± 0.4% in 5/5 rounds``: the gain, its spread, the rounds ``other`` won."""
        return f"{self.gain:.1%} ± {self.spread:.1%} in {self.wins}/{self.rounds} rounds"


def paired_gain(times: ReplayTimes, base: int, other: int) -> PairedGain:
    """Module ``other``'s gain over module ``base`` in ``times``, compared round by round (see :class:`PairedGain`)."""
    b, o = np.asarray(times.of(base)), np.asarray(times.of(other))
    gains = (b - o) / b
    gain = float(np.median(gains))
    return PairedGain(gain, MAD_TO_SIGMA * float(np.median(np.abs(gains - gain))), int(np.sum(o < b)), len(gains))


def _settled(times: ReplayTimes) -> bool:
    """Whether the two fastest modules (by median) are apart beyond noise, or there is only one."""
    if times.modules < 2:
        return True
    medians = times.median()
    first, second = sorted(range(times.modules), key=lambda m: (medians[m], m))[:2]
    return paired_gain(times, second, first).clear()


def interleaved_rounds(one_round, rounds: int = ROUNDS, extra_rounds: int = EXTRA_ROUNDS) -> ReplayTimes:
    """``rounds`` calls of ``one_round()`` (each: one number per module, from running them one after the other),
    then up to ``extra_rounds`` more, one at a time, while the two fastest modules are within noise of each other:
    a close answer gets more rounds to settle on, a clear one costs no more than before."""
    times = ReplayTimes([one_round() for _ in range(rounds)])
    for _ in range(extra_rounds):
        if _settled(times):
            break
        times = ReplayTimes([*times.rounds, one_round()])
    return times


def replay_ms(modules: list, rounds: int = ROUNDS, iters: int = 40, extra_rounds: int = EXTRA_ROUNDS) -> ReplayTimes:
    """The ms of one run (launch to synchronize; a CUDA-graph replay on a GPU) of each module, interleaved: in each
    round every module runs ``iters`` times, and the round keeps each one's median (:func:`interleaved_rounds`:
    ``rounds`` rounds, more while the two fastest are within noise of each other). A round runs each
    module fewer times (not under ``MIN_ITERS``) where ``iters`` would take over ``ROUND_MS``: a large batch must
    not turn a stream choice into minutes of replays."""
    executors = [_executor(m) for m in modules]
    try:
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

        def one_round() -> list[float]:
            medians = []
            for ex in executors:
                samples = []
                for _ in range(iters):
                    t0 = time.perf_counter()
                    ex.run()
                    ex.sync()
                    samples.append((time.perf_counter() - t0) * 1e3)
                medians.append(float(np.median(samples)))
            return medians

        return interleaved_rounds(one_round, rounds, extra_rounds)
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
