"""Round planning for time-boxed tuning: what the database holds, and how many trials fit the time left."""
from __future__ import annotations

import tvm_ffi

# Prior for the first round of a time-boxed run, before any round was timed (H100, 16 cores:
# about a minute of fixed cost per MetaSchedule call, ~1.7 s per trial in 64-trial iterations).
_PRIOR_ROUND_S, _PRIOR_TRIAL_S = 60.0, 2.0
_MARGIN = 1.25  # a round must fit in the time left with this factor to spare


def mean_us(run_secs) -> float | None:
    """Mean run time of one trial in us; None for a failed trial (MetaSchedule records those as >= 1e9 s)."""
    secs = [float(x) for x in run_secs] if run_secs else []
    return sum(secs) / len(secs) * 1e6 if secs and all(s < 1e9 for s in secs) else None


def workload_trials(db) -> dict[int, tuple[int, float | None]]:
    """Per workload (by structural hash of its module): trials recorded and best run time (us)."""
    out: dict[int, tuple[int, float | None]] = {}
    for rec in db.get_all_tuning_records():
        key = tvm_ffi.structural_hash(rec.workload.mod)
        n, best = out.get(key, (0, None))
        t = mean_us(rec.run_secs)
        out[key] = (n + 1, t if best is None or (t is not None and t < best) else best)
    return out


def trials_that_fit(seconds_left: float, rounds: list[tuple[float, int]]) -> int:
    """Trials the next round may hold and still end before the deadline, from past rounds alike to it
    (each bounds it: no cheaper however small, as a call's fixed cost dominates small rounds, and
    proportionally longer when larger, an upper bound as that fixed cost does not grow), or the prior."""
    budget = seconds_left / _MARGIN
    if not rounds:
        return int((budget - _PRIOR_ROUND_S) / _PRIOR_TRIAL_S)
    if max(secs for secs, _ in rounds) > budget:
        return 0
    return int(min(trials * budget / max(secs, 1e-3) for secs, trials in rounds))


def plan_round(order: list[int], remaining: list[int], trials_per_iter: int, room: int) -> tuple[list[int], int]:
    """(tasks, q): the heaviest pending tasks (``order``), q trials each, at most ``room`` trials in all.
    q is one MetaSchedule iteration, cut to what the chosen tasks still miss (the per-task cap of one
    call is shared by its tasks)."""
    q = min(trials_per_iter, room, remaining[order[0]])
    chosen = order[:max(1, room // q)]
    return chosen, min(q, *(remaining[i] for i in chosen))
