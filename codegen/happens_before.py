"""The happens-before relation of a multi-stream schedule, as bitsets over launches.

Launch ``a`` happens before launch ``b`` when ``b`` cannot start until ``a`` has finished,
whatever the GPU does: program order on one stream, plus event record -> wait edges, closed
transitively. Everything that must be safe under concurrency (memory reuse, data
dependencies) is checked against this relation, never against the launch list order.
"""
from __future__ import annotations

from collections.abc import Sequence


def happens_before(streams: Sequence[int], waits: Sequence[Sequence[int]],
                   records: Sequence[Sequence[int]]) -> list[int]:
    """``before[i]``: bitmask of the launches that happen before launch ``i`` (strictly).

    ``streams[i]`` is launch i's stream; it waits on the events in ``waits[i]`` and records
    those in ``records[i]``. Launches are given in a topological order of the schedule.
    """
    before: list[int] = []
    last_on_stream: dict[int, int] = {}
    recorder: dict[int, int] = {}
    for i, s in enumerate(streams):
        preds = [recorder[e] for e in waits[i]]
        if s in last_on_stream:
            preds.append(last_on_stream[s])
        mask = 0
        for p in preds:
            mask |= before[p] | (1 << p)
        before.append(mask)
        last_on_stream[s] = i
        for e in records[i]:
            recorder[e] = i
    return before


def sequential_order(n: int) -> list[int]:
    """The relation of a single-stream schedule: every earlier launch happens before."""
    return [(1 << i) - 1 for i in range(n)]


def access_masks(launches, root) -> tuple[dict[int, int], dict[int, int]]:
    """Per tensor (resolved by ``root``): the first launch writing it, and the bitmask of
    launches touching it. ``launches`` yields (index, args, writes)."""
    first_write: dict[int, int] = {}
    accesses: dict[int, int] = {}
    for idx, args, writes in launches:
        for a in args:
            r = root(a)
            accesses[r] = accesses.get(r, 0) | (1 << idx)
        for w in writes:
            first_write.setdefault(root(w), idx)
    return first_write, accesses


def write_ready(launches, root, before: list[int]) -> dict[int, int]:
    """Per tensor (resolved by ``root``): the bitmask of launches that happen before *every* launch
    writing it. Memory may pass to a tensor only once its previous occupants are done before all of its
    writers, not just the first: the slices of a concatenation built in place are written by unordered
    launches. ``launches`` yields (index, args, writes)."""
    ready: dict[int, int] = {}
    for idx, _args, writes in launches:
        for w in writes:
            r = root(w)
            ready[r] = ready.get(r, before[idx]) & before[idx]
    return ready


def plan_happens_before(plan) -> list[int]:
    """:func:`happens_before` of a :class:`tvm_nimble.contract.plan.Plan`."""
    return happens_before([l.stream for l in plan.launches], [l.waits for l in plan.launches],
                          [l.records for l in plan.launches])
