"""A stream cap chosen with operator costs: which streams to merge, and each stream's order.

Nimble's widest assignment makes every stream a chain of dependent operators, so no order is left
to choose. A cap merges streams, and then two things decide how much the cap costs: which streams
share one, and in what order a shared stream runs its operators (a short side branch placed before
a critical-path operator on the same stream delays the whole graph). Both are decided here on a
list schedule of the operator costs (measured kernel times): whenever a stream is free it starts,
among its operators whose inputs are done, the one with the least critical-path slack (the longest
path through the whole graph minus the longest path through the operator), then the one with the
longest path to the end. Merges are greedy: each time, the pair of streams whose merge lengthens
that schedule the least (among the pairs that lose the least overlap time, when there are many).
The schedule has no GPU model (no contention between streams): it ranks orders and merges; whether
a cap pays on a GPU is measured (``max_streams="auto"``).
"""
from __future__ import annotations

import heapq

import numpy as np


def stream_index(streams: list[list[int]], num_nodes: int) -> list[int]:
    """Per operator, the index in ``streams`` of the stream that holds it."""
    stream_of = [0] * num_nodes
    for s, nodes in enumerate(streams):
        for v in nodes:
            stream_of[v] = s
    return stream_of


def path_levels(order: list[int], edges, costs) -> tuple[list[float], list[float]]:
    """(earliest start, longest path from the operator to the end including itself) per operator;
    ``order`` is a topological order of the DAG ``edges``."""
    n = len(order)
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        preds[v].append(u)
        succs[u].append(v)
    start = [0.0] * n
    for v in order:
        start[v] = max((start[u] + costs[u] for u in preds[v]), default=0.0)
    tail = [0.0] * n
    for v in reversed(order):
        tail[v] = costs[v] + max((tail[w] for w in succs[v]), default=0.0)
    return start, tail


def slack_priority(order: list[int], edges, costs) -> list[tuple]:
    """Per operator, a sort key: least slack first, then the longest path to the end, then ``order``."""
    start, tail = path_levels(order, edges, costs)
    length = max(tail, default=0.0)
    position = {v: i for i, v in enumerate(order)}
    return [(length - start[v] - tail[v], -tail[v], position[v]) for v in range(len(order))]


def list_schedule(edges, stream_of: list[int], costs, priority: list[tuple]) -> tuple[list[int], float]:
    """(start order, makespan) of the list schedule of operators on their streams (module doc)."""
    n = len(stream_of)
    waiting = [0] * n
    succs: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        waiting[v] += 1
        succs[u].append(v)
    ready: dict[int, list] = {}  # stream -> heap of (priority, operator) whose inputs are done
    for v in range(n):
        if waiting[v] == 0:
            heapq.heappush(ready.setdefault(stream_of[v], []), (priority[v], v))
    busy: set[int] = set()
    running: list[tuple[float, int, int]] = []  # (finish time, start sequence, operator)
    now, out = 0.0, []
    while len(out) < n:
        for s in sorted(ready):
            if s not in busy and ready[s]:
                _, v = heapq.heappop(ready[s])
                busy.add(s)
                heapq.heappush(running, (now + costs[v], len(out), v))
                out.append(v)
        now, _, v = heapq.heappop(running)
        busy.discard(stream_of[v])
        for w in succs[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(ready.setdefault(stream_of[w], []), (priority[w], w))
    while running:
        now, _, _ = heapq.heappop(running)
    return out, now


def makespan(order: list[int], edges, stream_of: list[int], costs) -> float:
    """When the last operator ends if each stream runs its operators in ``order`` and every operator
    starts once its stream is free and its inputs are done (no GPU model, as in the list schedule)."""
    preds: list[list[int]] = [[] for _ in order]
    for u, v in edges:
        preds[v].append(u)
    end = [0.0] * len(order)
    free: dict[int, float] = {}
    for v in order:
        s = stream_of[v]
        end[v] = max([free.get(s, 0.0)] + [end[u] for u in preds[v]]) + costs[v]
        free[s] = end[v]
    return max(end, default=0.0)


#: pairs of streams scored by the list schedule per merge (every pair up to 14 streams); more are
#: first ranked by the overlap time they lose
PAIRS_TRIED = 100


def _overlap_lost(streams: list[list[int]], closure: np.ndarray, costs) -> np.ndarray:
    """``[i, j]``: the sum over kernel pairs (x in i, y in j) that could run concurrently of
    min(cost x, cost y), the time merging i and j can take away (additive under merges)."""
    n, k = closure.shape[0], len(streams)
    c = np.asarray(costs, dtype=np.float64)
    overlap = (~(closure | closure.T)).astype(np.float64) * np.minimum(c[:, None], c[None, :])
    member = np.zeros((n, k), dtype=np.float64)
    for s, nodes in enumerate(streams):
        member[nodes, s] = 1.0
    return member.T @ overlap @ member


class MergeSequences:
    """The greedy merge sequences (see :func:`cost_capped`) of the ``kept`` graphs asked for most recently.

    Each merge depends only on the streams before it, so a smaller cap of the same graph continues the sequence of
    a larger one: the stream choice's caps 8, 6, 4, 3, 2 of one model score each merge once, not once per cap. A
    graph is its order, edges, streams and costs."""

    def __init__(self, kept: int = 8):
        self.kept = kept
        self._by_graph: dict[tuple, list[tuple[int, int]]] = {}

    def of(self, order, edges, streams, costs) -> list[tuple[int, int]]:
        """The graph's merge sequence so far (a list :func:`cost_capped` extends), newest graph kept last."""
        key = (tuple(order), tuple(map(tuple, edges)), tuple(map(tuple, streams)), tuple(map(float, costs)))
        merges = self._by_graph.pop(key, [])
        self._by_graph[key] = merges
        while len(self._by_graph) > self.kept:
            del self._by_graph[next(iter(self._by_graph))]
        return merges

    def clear(self) -> None:
        """Forget every sequence (tests compare with a greedy that starts from nothing)."""
        self._by_graph.clear()


#: The merge sequences of this process. Process-wide for speed: the stream choice builds each cap of a model
#: separately (``tvm_nimble.compiler.stream_choice`` through ``assign_streams``), with no object between the caps
#: that could own it, and a sequence depends only on its graph. Tests call ``clear()``.
PROCESS_MERGES = MergeSequences()


def cost_capped(order: list[int], edges, streams: list[list[int]], cap: int, costs,
                closure: np.ndarray, sequences: MergeSequences | None = None) -> tuple[list[list[int]], list[int]]:
    """(at most ``cap`` streams, each a union of ``streams``; a topological order that each runs its
    operators in), merging greedily by the list schedule (module doc). With many streams only the
    ``PAIRS_TRIED`` pairs that lose the least overlap are scored each time, so a 50-stream graph
    takes seconds. Ties go to the smaller merged stream, then the lowest pair. ``order`` is any
    topological order of ``edges``; ``closure[u, v]``: u reaches v; costs are >= 0.

    The graph's merge sequence is kept in ``sequences`` (default :data:`PROCESS_MERGES`), so that a smaller cap
    of the same graph continues it instead of scoring the same merges again."""
    n = len(order)
    if any(c < 0 for c in costs):
        raise ValueError("operator costs must be >= 0")
    merges = (PROCESS_MERGES if sequences is None else sequences).of(order, edges, streams, costs)
    priority = slack_priority(order, edges, costs)
    stream_of = stream_index(streams, n)
    lost = _overlap_lost(streams, closure, costs)
    merged = [list(s) for s in streams]
    alive = list(range(len(streams)))
    while len(alive) > cap:
        step = len(streams) - len(alive)
        if step < len(merges):
            i, j = merges[step]
        else:
            i, j = _best_merge(alive, lost, merged, stream_of, edges, costs, priority)
            merges.append((i, j))
        merged[i] += merged[j]
        lost[i, :] += lost[j, :]
        lost[:, i] += lost[:, j]
        stream_of = [i if s == j else s for s in stream_of]
        alive.remove(j)
    schedule_order, _ = list_schedule(edges, stream_of, costs, priority)
    return [merged[s] for s in alive], schedule_order


def _best_merge(alive, lost, merged, stream_of, edges, costs, priority) -> tuple[int, int]:
    """The pair of ``alive`` streams whose merge lengthens the list schedule least (see :func:`cost_capped`)."""
    pairs = [(i, j) for a, i in enumerate(alive) for j in alive[a + 1:]]
    if len(pairs) > PAIRS_TRIED:
        pairs = sorted(pairs, key=lambda p: (lost[p], p))[:PAIRS_TRIED]
    best = None
    for i, j in pairs:
        trial = [i if s == j else s for s in stream_of]
        key = (list_schedule(edges, trial, costs, priority)[1], len(merged[i]) + len(merged[j]), i, j)
        if best is None or key < best:
            best = key
    return best[2], best[3]
