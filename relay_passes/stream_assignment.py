"""Nimble's stream assignment (Kwon et al., NeurIPS 2020, Algorithm 1 + stream reuse).

Framework-free: it works on a plain DAG ``(num_nodes, edges)`` so it can be checked against
brute force. The steps:

1. transitive reduction G' of the operator DAG G (reachability bitsets on Python ints);
2. maximum matching M of the bipartite graph of G' (Hopcroft-Karp, networkx): matched edges
   chain operators into paths, each a candidate stream;
3. stream reuse: paths that are totally ordered (the end of one reaches the start of the
   other) share a stream, via a second maximum matching over the path order;
4. the two-step cover of 2-3 keeps every edge of M inside a stream, but it does not always
   reach the width of G (merging whole paths can be worse than cutting one; hypothesis and
   exhaustive search find such DAGs from 7 nodes on). An alternating-path search on the
   transitive closure detects that case; then a minimum chain cover (Dilworth) is solved
   exactly as a max-weight assignment on the closure that keeps as many G' edges inside
   streams as any minimum chain cover can;
5. synchronization: each cross-stream edge of G' is an event record/wait, minus those
   already implied by stream order and other events (none of the kept ones is redundant,
   and per node the kept set is the smallest possible).

Sync bound: #syncs <= |E(G')| - (G' edges kept inside streams). When the cover keeps |M|
of them (always after steps 2-3, often but not always after step 4) this is Nimble's
|E(G')| - |M|. Some DAGs admit no stream assignment that has both width-many streams and at
most |E(G')| - |M| syncs, e.g. G' = {0,1}->4->{6,9}, {2,3}->5->{7,8}, 2->9, 3->9 (width 4,
|E'| = 10, |M| = 5, every 4-stream assignment needs 6 syncs); then the width wins.

An optional ``max_streams`` cap merges streams (losing the least concurrency first); each
stream then runs its operators in one global topological order, and syncs are recomputed. With
per-node costs the cap merges the streams whose merge lengthens a list schedule the least, and
the order is that schedule's (least critical-path slack first).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import networkx as nx
import numpy as np

from .cost_schedule import cost_capped, makespan, stream_index

Edge = tuple[int, int]


@dataclass
class StreamAssignment:
    stream_of: list[int]  # stream per node, numbered from 0
    syncs: list[Edge]  # (producer, consumer) pairs that need an event record/wait
    order: list[int]  # a topological order; each stream runs its nodes in this order
    num_streams: int
    reduced_edges: list[Edge]  # edges of the transitive reduction G'
    matching_size: int  # |M|, a maximum matching of G'

    def stream_nodes(self, s: int) -> list[int]:
        """Nodes of stream ``s`` in program order."""
        return [v for v in self.order if self.stream_of[v] == s]


# ---- input and graph basics -------------------------------------------------------------
def _validate(num_nodes: int, edges, max_streams: int | None) -> list[Edge]:
    """Reject malformed input early with a message that names the offending item."""
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    if max_streams is not None and max_streams < 1:
        raise ValueError(f"max_streams must be >= 1 (or None for no cap), got {max_streams}")
    clean = set()
    for e in edges:
        u, v = int(e[0]), int(e[1])
        if not (0 <= u < num_nodes and 0 <= v < num_nodes):
            raise ValueError(f"edge ({u}, {v}) refers to a node outside 0..{num_nodes - 1}")
        if u == v:
            raise ValueError(f"self-loop on node {u}: the operator graph must be a DAG")
        clean.add((u, v))
    return sorted(clean)


def _successors(num_nodes: int, edges) -> list[list[int]]:
    succ: list[list[int]] = [[] for _ in range(num_nodes)]
    for u, v in edges:
        succ[u].append(v)
    return succ


def _find_cycle(num_nodes: int, edges, done: set[int]) -> list[int]:
    """A cycle among the nodes Kahn's algorithm could not order (each has a pending predecessor)."""
    pred: dict[int, int] = {}
    for u, v in edges:
        if u not in done and v not in done:
            pred.setdefault(v, u)
    v = min(w for w in range(num_nodes) if w not in done)
    seen: dict[int, int] = {}
    walk: list[int] = []
    while v not in seen:
        seen[v] = len(walk)
        walk.append(v)
        v = pred[v]
    return walk[seen[v]:][::-1]  # walked backwards along edges


def topological_order(num_nodes: int, edges) -> list[int]:
    """Kahn's algorithm, smallest id first, so the order is deterministic (identity if ids are)."""
    succ = _successors(num_nodes, edges)
    indeg = [0] * num_nodes
    for _, v in edges:
        indeg[v] += 1
    heap = [v for v in range(num_nodes) if indeg[v] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        u = heapq.heappop(heap)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, v)
    if len(order) != num_nodes:
        cycle = _find_cycle(num_nodes, edges, set(order))
        path = " -> ".join(map(str, cycle + cycle[:1]))
        raise ValueError(f"the graph has a cycle through node {cycle[0]} ({path}): operators must form a DAG")
    return order


def reachability(num_nodes: int, edges, order: list[int]) -> list[int]:
    """``reach[u]``: bitmask of the nodes reachable from ``u`` (excluding ``u``), one pass."""
    succ = _successors(num_nodes, edges)
    reach = [0] * num_nodes
    for u in reversed(order):
        m = 0
        for v in succ[u]:
            m |= reach[v] | (1 << v)
        reach[u] = m
    return reach


def reach_matrix(num_nodes: int, reach: list[int]) -> np.ndarray:
    """Dense boolean closure ``R[u, v]`` (u reaches v) from the bitsets, for vectorized steps."""
    if num_nodes == 0:
        return np.zeros((0, 0), dtype=bool)
    nbytes = (num_nodes + 7) // 8
    raw = np.frombuffer(b"".join(r.to_bytes(nbytes, "little") for r in reach), dtype=np.uint8)
    bits = np.unpackbits(raw.reshape(num_nodes, nbytes), axis=1, bitorder="little")
    return bits[:, :num_nodes].astype(bool)


def transitive_reduction(num_nodes: int, edges, reach: list[int]) -> list[Edge]:
    """Keep (u, v) only when v is not reachable through another successor of u."""
    succ = _successors(num_nodes, edges)
    kept = []
    for u in range(num_nodes):
        cover = 0
        for w in succ[u]:
            cover |= reach[w]
        kept += [(u, v) for v in succ[u] if not (cover >> v) & 1]
    return sorted(kept)


def _bits(mask: int):
    """Indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


# ---- matchings ------------------------------------------------------------------------------
def hopcroft_karp(num_nodes: int, pairs: list[Edge]) -> dict[int, int]:
    """Maximum matching (left u -> right v) of the bipartite graph of a sparse edge list.

    networkx rather than scipy: scipy's ``maximum_bipartite_matching`` was measured to take
    minutes on dense closures where this and the dense solver below take milliseconds.
    Vertices are ints (left u, right num_nodes + v): string-keyed vertices hash differently in
    every process, which made networkx's choice among maximum matchings vary between runs.
    """
    if not pairs:
        return {}
    graph = nx.Graph()
    graph.add_nodes_from(range(2 * num_nodes))
    graph.add_edges_from((u, num_nodes + v) for u, v in pairs)
    match = nx.bipartite.hopcroft_karp_matching(graph, top_nodes=range(num_nodes))
    return {u: match[u] - num_nodes for u in range(num_nodes) if u in match}


def dense_matching(weights: np.ndarray) -> list[Edge]:
    """Max-weight matching of a dense bipartite graph (entry > 0 is an edge), via scipy's LSA.

    With 0/1 weights this is a maximum matching; unmatched rows get a zero entry and are dropped.
    """
    if weights.size == 0:
        return []
    from scipy.optimize import linear_sum_assignment  # here, not at the top: a slow import only this needs

    rows, cols = linear_sum_assignment(weights, maximize=True)
    keep = weights[rows, cols] > 0
    return list(zip(rows[keep].tolist(), cols[keep].tolist()))


def closure_matching_size(num_nodes: int, edges) -> int:
    """Maximum matching on the transitive closure; ``num_nodes`` minus it is the width (Dilworth)."""
    edges = list(edges)
    reach = reachability(num_nodes, edges, topological_order(num_nodes, edges))
    return len(dense_matching(reach_matrix(num_nodes, reach).astype(np.float64)))


# ---- streams ---------------------------------------------------------------------------------
def _chains_from_successors(num_nodes: int, succ: dict[int, int]) -> list[list[int]]:
    """Follow ``succ`` links from every node without a predecessor."""
    has_pred = set(succ.values())
    chains = []
    for start in range(num_nodes):
        if start in has_pred:
            continue
        chain = [start]
        while chain[-1] in succ:
            chain.append(succ[chain[-1]])
        chains.append(chain)
    return chains


def _merge_ordered_paths(paths: list[list[int]], closure: np.ndarray) -> list[list[int]]:
    """Stream reuse: a second matching over 'end of p reaches start of q' chains whole paths."""
    ends = [p[-1] for p in paths]
    starts = [p[0] for p in paths]
    order_of_paths = closure[np.ix_(ends, starts)].astype(np.float64)
    nxt = dict(dense_matching(order_of_paths))
    streams = []
    for p in _chains_from_successors(len(paths), nxt):
        streams.append([v for q in p for v in paths[q]])
    return streams


def _has_augmenting_path(chains: list[list[int]], reach: list[int]) -> bool:
    """Whether the chain cover is not minimum: an alternating BFS on the closure (bitsets).

    The cover is a matching of the closure (node -> next node on its chain); it is maximum,
    i.e. the cover has width-many chains, iff no free right vertex (chain start) is reachable
    by alternating paths from the free left vertices (chain ends).
    """
    pred = {b: a for c in chains for a, b in zip(c, c[1:])}
    free_right = 0
    for c in chains:
        free_right |= 1 << c[0]
    visited = 0
    frontier = [c[-1] for c in chains]
    while frontier:
        nxt = []
        for u in frontier:
            cand = reach[u] & ~visited
            if cand & free_right:
                return True
            visited |= cand
            nxt += [pred[v] for v in _bits(cand)]
        frontier = nxt
    return False


def _min_chain_cover(num_nodes: int, closure: np.ndarray, reduced: list[Edge]) -> list[list[int]]:
    """Minimum chain cover keeping the most G' edges inside chains (one exact assignment).

    Weight num_nodes per comparable pair plus 1 per G' edge: any maximum-cardinality matching of
    the closure outweighs every smaller one, and among them the most G' edges win.
    """
    weights = closure.astype(np.float64) * num_nodes
    if reduced:
        us, vs = zip(*reduced)
        weights[list(us), list(vs)] += 1.0
    return _chains_from_successors(num_nodes, dict(dense_matching(weights)))


def _cap_streams(streams: list[list[int]], cap: int, closure: np.ndarray) -> list[list[int]]:
    """Merge streams until at most ``cap`` remain, each time the pair losing the least concurrency.

    ``loss[i, j]`` counts node pairs (x in i, y in j) that could run concurrently (neither
    reaches the other); merging j into i adds j's row and column to i's, so it is computed once.
    Ties go to the smaller merged stream, then the lowest (i, j).
    """
    n, k = closure.shape[0], len(streams)
    concurrent = ~(closure | closure.T)
    np.fill_diagonal(concurrent, False)
    member = np.zeros((n, k), dtype=np.float64)
    for s, nodes in enumerate(streams):
        member[nodes, s] = 1.0
    loss = member.T @ concurrent.astype(np.float64) @ member
    sizes = np.array([len(s) for s in streams], dtype=np.float64)
    alive = np.ones(k, dtype=bool)
    upper = np.triu(np.ones((k, k), dtype=bool), 1)
    merged = [list(s) for s in streams]
    for _ in range(k - cap):
        key = loss * (n + 1) + sizes[:, None] + sizes[None, :]  # exact in float64 for n < 2**17
        key[~(upper & alive[:, None] & alive[None, :])] = np.inf
        i, j = divmod(int(np.argmin(key)), k)
        merged[i] += merged[j]
        loss[i, :] += loss[j, :]
        loss[:, i] += loss[:, j]
        sizes[i] += sizes[j]
        alive[j] = False
    return [merged[s] for s in range(k) if alive[s]]


def _cheaper_cap(order, edges, by_count, by_cost, cost_order, costs):
    """(streams, order): the cost-aware cap, unless the count-based one (in ``order``) has the shorter
    dependency-only makespan; the greedy merge is a heuristic, this keeps it from ever losing."""
    n = len(order)
    count_time = makespan(order, edges, stream_index(by_count, n), costs)
    if count_time < makespan(cost_order, edges, stream_index(by_cost, n), costs):
        return by_count, order
    return by_cost, cost_order


def _number_streams(streams: list[list[int]], order: list[int]) -> list[int]:
    """Stream ids by first position in ``order``, so stream 0 holds the first node of ``order``."""
    position = {v: i for i, v in enumerate(order)}
    return stream_index(sorted(streams, key=lambda s: min(position[v] for v in s)), len(order))


def minimal_syncs(order: list[int], stream_of: list[int], reduced_edges) -> list[Edge]:
    """Cross-stream edges of G' that stream order and other syncs do not already enforce.

    Nodes are visited in topological order keeping ``hb[v]``, the set of nodes that happen
    before v. Candidate syncs into v are tried latest producer first; one is kept only if its
    producer does not already happen before v. No kept sync is redundant: a later-tried
    (earlier) producer can never make a later producer happen before v, and syncs into later
    nodes cannot affect v. Per node the kept producers are exactly the HB-maximal ones, so
    the count is also the minimum for this assignment and order.
    """
    position = {v: i for i, v in enumerate(order)}
    into: dict[int, list[int]] = {}
    for u, v in reduced_edges:
        if stream_of[u] != stream_of[v]:
            into.setdefault(v, []).append(u)
    hb: dict[int, int] = {}
    last_on_stream: dict[int, int] = {}
    syncs = []
    for v in order:
        s = stream_of[v]
        mask = 0
        if s in last_on_stream:
            p = last_on_stream[s]
            mask = hb[p] | (1 << p)
        for u in sorted(into.get(v, []), key=position.__getitem__, reverse=True):
            if not (mask >> u) & 1:
                syncs.append((u, v))
                mask |= hb[u] | (1 << u)
        hb[v] = mask
        last_on_stream[s] = v
    return sorted(syncs)


def nimble_chains(num_nodes: int, matching: dict[int, int], closure: np.ndarray) -> list[list[int]]:
    """Nimble's own cover (steps 2-3): the paths of M, then stream reuse over whole paths."""
    return _merge_ordered_paths(_chains_from_successors(num_nodes, matching), closure)


def assign_streams(num_nodes: int, edges, max_streams: int | None = None, costs=None) -> StreamAssignment:
    """Assign each node of the DAG to a stream and compute the synchronizations (see module doc).

    ``costs`` (one per node, e.g. measured kernel times) make a cap cost-aware: streams are merged
    and ordered by a list schedule of those costs (:mod:`.cost_schedule`)."""
    edges = _validate(num_nodes, edges, max_streams)
    if costs is not None and len(costs) != num_nodes:
        raise ValueError(f"{len(costs)} costs for {num_nodes} nodes")
    if num_nodes == 0:
        return StreamAssignment([], [], [], 0, [], 0)
    order = topological_order(num_nodes, edges)
    reach = reachability(num_nodes, edges, order)
    closure = reach_matrix(num_nodes, reach)
    reduced = transitive_reduction(num_nodes, edges, reach)
    matching = hopcroft_karp(num_nodes, reduced)
    streams = nimble_chains(num_nodes, matching, closure)
    if _has_augmenting_path(streams, reach):
        streams = _min_chain_cover(num_nodes, closure, reduced)
    if max_streams is not None and len(streams) > max_streams:
        by_count = _cap_streams(streams, max_streams, closure)
        if costs is None:
            streams = by_count
        else:
            by_cost, cost_order = cost_capped(order, edges, streams, max_streams, costs, closure)
            streams, order = _cheaper_cap(order, edges, by_count, by_cost, cost_order, costs)
    stream_of = _number_streams(streams, order)
    syncs = minimal_syncs(order, stream_of, reduced)
    return StreamAssignment(stream_of, syncs, order, len(streams), reduced, len(matching))
