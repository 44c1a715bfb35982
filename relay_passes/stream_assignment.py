"""Nimble's stream assignment (Kwon et al., NeurIPS 2020, Algorithm 1 + stream reuse).

Framework-free: it works on a plain DAG ``(num_nodes, edges)`` so it can be tested against
brute force. The steps:

1. transitive reduction G' of the operator DAG G (reachability bitsets);
2. maximum bipartite matching M on G' (Hopcroft-Karp, networkx): matched edges chain operators
   into paths, each a candidate stream;
3. stream reuse: paths that are totally ordered (the end of one reaches the start of the
   other) share a stream, via a second maximum matching over the path order. Together this
   reaches the width of G (max logical concurrency with the fewest streams);
4. synchronization: each cross-stream edge of G' is an event record/wait, minus those
   already implied by stream order and earlier events (none of the kept ones is redundant).

An optional ``max_streams`` cap merges streams (losing the least concurrency first); each
stream then runs its operators in one global topological order, and syncs are recomputed.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import networkx as nx


@dataclass
class StreamAssignment:
    stream_of: list[int]  # stream per node, numbered from 0
    syncs: list[tuple[int, int]]  # (producer, consumer) pairs that need an event record/wait
    order: list[int]  # a topological order; each stream runs its nodes in this order
    num_streams: int
    reduced_edges: list[tuple[int, int]]  # edges of the transitive reduction G'
    matching_size: int  # |M|, matched edges of G'

    def stream_nodes(self, s: int) -> list[int]:
        """Nodes of stream ``s`` in program order."""
        return [v for v in self.order if self.stream_of[v] == s]


# ---- graph basics ------------------------------------------------------------------------
def _validate(num_nodes: int, edges, max_streams) -> list[tuple[int, int]]:
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    if max_streams is not None and max_streams < 1:
        raise ValueError(f"max_streams must be >= 1, got {max_streams}")
    clean = set()
    for e in edges:
        u, v = int(e[0]), int(e[1])
        if not (0 <= u < num_nodes and 0 <= v < num_nodes):
            raise ValueError(f"edge ({u}, {v}) refers to a node outside 0..{num_nodes - 1}")
        if u == v:
            raise ValueError(f"self-loop on node {u}: the operator graph must be a DAG")
        clean.add((u, v))
    return sorted(clean)


def topological_order(num_nodes: int, edges: list[tuple[int, int]]) -> list[int]:
    """Kahn's algorithm, smallest id first (identity when ids already are topological)."""
    succ = [[] for _ in range(num_nodes)]
    indeg = [0] * num_nodes
    for u, v in edges:
        succ[u].append(v)
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
        on_cycle = min(v for v in range(num_nodes) if indeg[v] > 0)
        raise ValueError(f"the graph has a cycle (node {on_cycle} is on or behind it): operators must form a DAG")
    return order


def reachability(num_nodes: int, edges, order) -> list[int]:
    """``reach[u]``: bitmask of the nodes reachable from ``u`` (excluding ``u``)."""
    succ = [[] for _ in range(num_nodes)]
    for u, v in edges:
        succ[u].append(v)
    reach = [0] * num_nodes
    for u in reversed(order):
        m = 0
        for v in succ[u]:
            m |= reach[v] | (1 << v)
        reach[u] = m
    return reach


def transitive_reduction(num_nodes: int, edges, reach) -> list[tuple[int, int]]:
    """Keep (u, v) only when v is not reachable through another successor of u."""
    succ = [[] for _ in range(num_nodes)]
    for u, v in edges:
        succ[u].append(v)
    kept = []
    for u in range(num_nodes):
        cover = 0
        for w in succ[u]:
            cover |= reach[w]
        kept += [(u, v) for v in succ[u] if not (cover >> v) & 1]
    return sorted(kept)


def _max_matching(n_left: int, n_right: int, pairs: list[tuple[int, int]]) -> dict[int, int]:
    """Maximum bipartite matching (Hopcroft-Karp, networkx): left -> right.

    (scipy's ``maximum_bipartite_matching`` was measured to take ~20 s on the dense path-order
    graphs of step 3 where networkx takes milliseconds.)
    """
    if not pairs:
        return {}
    graph = nx.Graph()
    left = [("l", u) for u in range(n_left)]
    graph.add_nodes_from(left)
    graph.add_nodes_from(("r", v) for v in range(n_right))
    graph.add_edges_from((("l", u), ("r", v)) for u, v in pairs)
    match = nx.bipartite.hopcroft_karp_matching(graph, top_nodes=left)
    return {u: match[("l", u)][1] for u in range(n_left) if ("l", u) in match}


# ---- streams ---------------------------------------------------------------------------
def _paths_from_matching(num_nodes: int, matching: dict[int, int]) -> list[list[int]]:
    has_pred = set(matching.values())
    paths = []
    for s in range(num_nodes):
        if s in has_pred:
            continue
        path = [s]
        while path[-1] in matching:
            path.append(matching[path[-1]])
        paths.append(path)
    return paths


def _merge_ordered_paths(paths: list[list[int]], reach: list[int]) -> list[list[int]]:
    """Stream reuse: a second matching over 'end of p reaches start of q' chains paths together."""
    k = len(paths)
    pairs = [(p, q) for p in range(k) for q in range(k)
             if p != q and (reach[paths[p][-1]] >> paths[q][0]) & 1]
    nxt = _max_matching(k, k, pairs)
    has_pred = set(nxt.values())
    streams = []
    for p in range(k):
        if p in has_pred:
            continue
        nodes = []
        while True:
            nodes += paths[p]
            if p not in nxt:
                break
            p = nxt[p]
        streams.append(nodes)
    return streams


def _complete_chain_cover(streams: list[list[int]], reach: list[int], num_nodes: int) -> list[list[int]]:
    """Reach the DAG's width when merging whole paths could not.

    Merging whole paths is not always optimal (an optimal chain cover may need to cut a
    path). The streams define a matching on the transitive closure (each node -> its
    successor on its stream); Kuhn's augmenting paths over the closure, tried from each
    stream's last node, grow it to a maximum one, i.e. a minimum chain cover (Dilworth).
    Matched G' edges are kept unless an augmenting path needs them.
    """
    succ_of: dict[int, int] = {}
    pred_of: dict[int, int] = {}
    for nodes in streams:
        for a, b in zip(nodes, nodes[1:]):
            succ_of[a], pred_of[b] = b, a

    def augment(u: int, visited: list[int]) -> bool:
        candidates = reach[u] & ~visited[0]
        while candidates:
            low = candidates & -candidates
            v = low.bit_length() - 1
            candidates ^= low
            if visited[0] >> v & 1:
                continue
            visited[0] |= low
            if v not in pred_of or augment(pred_of[v], visited):
                succ_of[u], pred_of[v] = v, u
                return True
        return False

    for nodes in streams:
        end = nodes[-1]
        if end not in succ_of:
            augment(end, [0])
    chains = []
    for start in range(num_nodes):
        if start in pred_of:
            continue
        chain = [start]
        while chain[-1] in succ_of:
            chain.append(succ_of[chain[-1]])
        chains.append(chain)
    return chains


def _concurrent_pairs(a: list[int], b_mask: int, reach: list[int], reached_by: list[int]) -> int:
    """How many (x in a, y in b) pairs could run concurrently (neither reaches the other)."""
    total = 0
    for x in a:
        total += (b_mask & ~(reach[x] | reached_by[x]) & ~(1 << x)).bit_count()
    return total


def _cap_streams(streams: list[list[int]], cap: int, reach: list[int], num_nodes: int) -> list[list[int]]:
    """Merge streams until at most ``cap`` remain, each time the pair losing the least concurrency."""
    reached_by = [0] * num_nodes
    for u in range(num_nodes):
        m = reach[u]
        while m:
            low = m & -m
            reached_by[low.bit_length() - 1] |= 1 << u
            m ^= low
    streams = [list(s) for s in streams]
    while len(streams) > cap:
        masks = [sum(1 << v for v in s) for s in streams]
        best = None
        for i in range(len(streams)):
            for j in range(i + 1, len(streams)):
                loss = _concurrent_pairs(streams[i], masks[j], reach, reached_by)
                key = (loss, len(streams[i]) + len(streams[j]), i, j)
                if best is None or key < best:
                    best = key
        _, _, i, j = best
        streams[i] = streams[i] + streams[j]
        del streams[j]
    return streams


def _number_streams(streams: list[list[int]], position: list[int], num_nodes: int) -> list[int]:
    streams = sorted(streams, key=lambda s: min(position[v] for v in s))
    stream_of = [0] * num_nodes
    for sid, nodes in enumerate(streams):
        for v in nodes:
            stream_of[v] = sid
    return stream_of


def minimal_syncs(order: list[int], stream_of: list[int], reduced_edges) -> list[tuple[int, int]]:
    """Cross-stream edges of G' that stream order and earlier syncs do not already enforce.

    Nodes are visited in topological order keeping ``hb[v]``, the set of nodes that happen
    before v. Candidate syncs into v are tried latest producer first; one is kept only if its
    producer does not already happen before v. No kept sync is redundant: a later-tried
    (earlier) producer can never make a later producer happen before v.
    """
    position = {v: i for i, v in enumerate(order)}
    into: dict[int, list[int]] = {}
    for u, v in reduced_edges:
        if stream_of[u] != stream_of[v]:
            into.setdefault(v, []).append(u)
    hb = {}
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


def assign_streams(num_nodes: int, edges, max_streams: int | None = None) -> StreamAssignment:
    """Assign each node of the DAG to a stream and compute the synchronizations (see module doc)."""
    edges = _validate(num_nodes, edges, max_streams)
    if num_nodes == 0:
        return StreamAssignment([], [], [], 0, [], 0)
    order = topological_order(num_nodes, edges)
    position = [0] * num_nodes
    for i, v in enumerate(order):
        position[v] = i
    reach = reachability(num_nodes, edges, order)
    reduced = transitive_reduction(num_nodes, edges, reach)
    matching = _max_matching(num_nodes, num_nodes, reduced)
    streams = _merge_ordered_paths(_paths_from_matching(num_nodes, matching), reach)
    streams = _complete_chain_cover(streams, reach, num_nodes)
    if max_streams is not None and len(streams) > max_streams:
        streams = _cap_streams(streams, max_streams, reach, num_nodes)
    stream_of = _number_streams(streams, position, num_nodes)
    syncs = minimal_syncs(order, stream_of, reduced)
    return StreamAssignment(stream_of, syncs, order, len(streams), reduced, len(matching))
