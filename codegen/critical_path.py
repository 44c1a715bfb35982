"""The critical-path bound of a plan: how fast its kernels could run with unlimited streams.

Data dependencies are read-after-write on tensor ids (views resolve to their base; storage reuse
is ignored, since it is a consequence of the schedule, not of the model). With each launch
weighted by its measured duration, the longest path is the latency no schedule of these kernels
can beat, and the sum of all durations is what one stream takes. A multi-stream replay lands
between the two; how close it gets to the bound is the scheduler's share of the job.
"""
from __future__ import annotations


def dependency_edges(plan) -> list[tuple[int, int]]:
    """(producer position, consumer position) pairs in ``plan.launches``, deduplicated."""
    pos = {l.idx: p for p, l in enumerate(plan.launches)}
    return sorted((pos[w], pos[r]) for w, r in plan.read_after_write())


def critical_path(plan, durations) -> tuple[float, list[int]]:
    """(length, launch positions on the longest path) with launch ``i`` costing ``durations[i]``."""
    if len(durations) != len(plan.launches):
        raise ValueError(f"{len(durations)} durations for {len(plan.launches)} launches")
    if not durations:
        return 0.0, []
    finish = [float(d) for d in durations]
    prev: list[int | None] = [None] * len(durations)
    incoming: dict[int, list[int]] = {}
    for a, b in dependency_edges(plan):
        incoming.setdefault(b, []).append(a)
    for pos in range(len(durations)):  # the launch list is a topological order
        for a in incoming.get(pos, []):
            if finish[a] + durations[pos] > finish[pos]:
                finish[pos], prev[pos] = finish[a] + durations[pos], a
    end = max(range(len(finish)), key=finish.__getitem__)
    path = [end]
    while prev[path[-1]] is not None:
        path.append(prev[path[-1]])
    return finish[end], path[::-1]


def serial_sum(durations) -> float:
    return float(sum(durations))


def critical_stream_priority(plan, durations) -> list[int]:
    """One 0/1 per stream: 1 for the streams that carry a launch of the critical path (with launch ``i``
    costing ``durations[i]``), so that those kernels go first when streams compete for the GPU."""
    _, path = critical_path(plan, durations)
    on_path = {plan.launches[p].stream for p in path}
    return [1 if s in on_path else 0 for s in range(plan.num_streams)]
