"""Nimble stream assignment checked against independent brute force on small DAGs.

References here share no code with the implementation: Floyd-Warshall reachability, antichain
enumeration for the width, a from-scratch Kuhn matching, and networkx's blossom matching for the
most G' edges a minimum chain cover can keep.
"""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_nimble.relay_passes.explain import (PALETTE, critical_path_ops, dag_width, format_summary, summarize,
                                             to_dot)
from tvm_nimble.relay_passes.stream_assignment import assign_streams

EXAMPLES = int(os.environ.get("NIMBLE_HYPOTHESIS_EXAMPLES", 200))


# ---- independent brute-force references ----------------------------------------------------
def closure(n, edges):
    """Floyd-Warshall reachability: R[u][v] is True when v is reachable from u."""
    R = [[False] * n for _ in range(n)]
    for u, v in edges:
        R[u][v] = True
    for k in range(n):
        for i in range(n):
            if R[i][k]:
                for j in range(n):
                    R[i][j] = R[i][j] or R[k][j]
    return R


def brute_width(n, R):
    """Largest antichain by enumeration, largest size first."""
    for size in range(n, 0, -1):
        for nodes in itertools.combinations(range(n), size):
            if all(not R[a][b] and not R[b][a] for a, b in itertools.combinations(nodes, 2)):
                return size
    return 0


def brute_reduction(n, edges, R):
    """Edges of G not implied by a path through a third node."""
    return sorted({(u, v) for u, v in edges if not any(R[u][w] and R[w][v] for w in range(n))})


def kuhn_matching_size(n, pairs):
    """Maximum bipartite matching by simple augmenting paths (left u -> right v)."""
    adj = {u: [v for a, v in pairs if a == u] for u in range(n)}
    owner = {}

    def augment(u, seen):
        for v in adj[u]:
            if v not in seen:
                seen.add(v)
                if v not in owner or augment(owner[v], seen):
                    owner[v] = u
                    return True
        return False

    return sum(augment(u, set()) for u in range(n))


def best_kept_reduced_edges(n, R, reduced):
    """Most G' edges that a minimum chain cover can keep between consecutive nodes (blossom)."""
    g = nx.Graph()
    g.add_nodes_from([("l", u) for u in range(n)] + [("r", v) for v in range(n)])
    red = set(reduced)
    for u in range(n):
        for v in range(n):
            if R[u][v]:
                g.add_edge(("l", u), ("r", v), weight=2 if (u, v) in red else 1)
    m = nx.max_weight_matching(g, maxcardinality=True)
    return sum(g.edges[e]["weight"] for e in m) - len(m)


def happens_before(n, a, syncs):
    """HB = transitive closure of per-stream program order plus the syncs."""
    hb_edges = list(syncs)
    for s in range(a.num_streams):
        nodes = a.stream_nodes(s)
        hb_edges += list(zip(nodes, nodes[1:]))
    return closure(n, hb_edges)


def enforced(n, edges, a, syncs):
    H = happens_before(n, a, syncs)
    return all(H[u][v] for u, v in edges)


def kept_reduced_edges(a):
    """G' edges between consecutive nodes of a stream (never needing a sync)."""
    red = set(a.reduced_edges)
    return sum((x, y) in red for s in range(a.num_streams) for x, y in zip(a.stream_nodes(s), a.stream_nodes(s)[1:]))


# ---- strategies ----------------------------------------------------------------------------
@st.composite
def dags(draw, max_nodes=12):
    """Random DAG: edges i<j from booleans, then node ids shuffled so ids are not topological."""
    n = draw(st.integers(min_value=1, max_value=max_nodes))
    bits = draw(st.lists(st.booleans(), min_size=n * (n - 1) // 2, max_size=n * (n - 1) // 2))
    perm = draw(st.permutations(range(n)))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    return n, [(perm[i], perm[j]) for (i, j), b in zip(pairs, bits) if b]


def check_order(n, edges, a):
    """(e) ``order`` is a topological order of G."""
    pos = {v: i for i, v in enumerate(a.order)}
    assert sorted(a.order) == list(range(n))
    assert all(pos[u] < pos[v] for u, v in edges)


def check_sync_properties(n, edges, a):
    """(b) minus the count bound: enforced, irredundant, cross-stream G' edges only."""
    assert enforced(n, edges, a, a.syncs)
    assert len(set(a.syncs)) == len(a.syncs)
    for u, v in a.syncs:
        assert (u, v) in a.reduced_edges and a.stream_of[u] != a.stream_of[v]
    for i in range(len(a.syncs)):
        assert not enforced(n, edges, a, a.syncs[:i] + a.syncs[i + 1:]), f"sync {a.syncs[i]} is redundant"


def check_numbering(a):
    """Streams are 0..k-1, numbered by the position of their first node; stream 0 holds order[0]."""
    assert sorted(set(a.stream_of)) == list(range(a.num_streams))
    firsts = [a.order.index(a.stream_nodes(s)[0]) for s in range(a.num_streams)]
    assert firsts == sorted(firsts) and a.stream_of[a.order[0]] == 0


# ---- properties ------------------------------------------------------------------------------
@settings(max_examples=EXAMPLES, deadline=None)
@given(dags())
def test_assignment_properties_against_brute_force(dag):
    n, edges = dag
    a = assign_streams(n, edges)
    R = closure(n, edges)
    check_order(n, edges, a)
    # (a) max logical concurrency: each stream is a chain of G
    for s in range(a.num_streams):
        nodes = a.stream_nodes(s)
        assert all(R[x][y] for x, y in zip(nodes, nodes[1:]))
    # (d) as few streams as that allows: the width
    assert a.num_streams == brute_width(n, R)
    check_numbering(a)
    # G' and M
    assert a.reduced_edges == brute_reduction(n, edges, R)
    assert a.matching_size == kuhn_matching_size(n, a.reduced_edges)
    # (b) syncs; the count is bounded by the G' edges left between streams, the cover keeps
    # as many G' edges as any minimum chain cover can, so Nimble's bound holds whenever
    # some width-stream cover keeps |M| of them (see the counterexample test otherwise).
    check_sync_properties(n, edges, a)
    kept = kept_reduced_edges(a)
    assert kept == best_kept_reduced_edges(n, R, a.reduced_edges)
    assert len(a.syncs) <= len(a.reduced_edges) - kept
    if kept == a.matching_size:
        assert len(a.syncs) <= len(a.reduced_edges) - a.matching_size


@settings(max_examples=EXAMPLES, deadline=None)
@given(dags(), st.integers(min_value=1, max_value=4))
def test_capped_assignment_stays_valid(dag, cap):
    n, edges = dag
    a = assign_streams(n, edges, max_streams=cap)
    free = assign_streams(n, edges)
    check_order(n, edges, a)
    assert a.num_streams == min(cap, free.num_streams)
    check_numbering(a)
    check_sync_properties(n, edges, a)
    # merging whole streams never splits a kept G' edge, so the uncapped bound carries over
    # (and with it Nimble's |E'| - |M| whenever the uncapped cover keeps |M| G' edges)
    assert len(a.syncs) <= len(a.reduced_edges) - kept_reduced_edges(free)
    if kept_reduced_edges(free) == free.matching_size:
        assert len(a.syncs) <= len(a.reduced_edges) - a.matching_size
    if cap >= free.num_streams:
        assert a == free


# ---- where the plain two-step approach falls short -------------------------------------------
# G' = {0,1} -> 4 -> {6,9}, {2,3} -> 5 -> {7,8}, plus 2 -> 9 and 3 -> 9. Width 4, |E'| = 10, |M| = 5.
COUNTEREXAMPLE = (10, [(0, 4), (1, 4), (4, 6), (4, 9), (2, 5), (3, 5), (5, 7), (5, 8), (2, 9), (3, 9)])


def max_matchings(edges, size):
    for combo in itertools.combinations(edges, size):
        if len({u for u, _ in combo}) == size == len({v for _, v in combo}):
            yield dict(combo)


def whole_path_streams(n, matching, R):
    """Fewest streams made of whole matched paths: paths minus a max matching of their order."""
    starts = [v for v in range(n) if v not in matching.values()]
    paths = []
    for s in starts:
        p = [s]
        while p[-1] in matching:
            p.append(matching[p[-1]])
        paths.append(p)
    order = [(i, j) for i, p in enumerate(paths) for j, q in enumerate(paths) if R[p[-1]][q[0]]]
    return len(paths) - kuhn_matching_size(len(paths), order)


def test_two_step_cannot_reach_width_and_width_costs_one_sync_over_nimbles_bound():
    n, edges = COUNTEREXAMPLE
    R = closure(n, edges)
    a = assign_streams(n, edges)
    assert (brute_width(n, R), len(a.reduced_edges), a.matching_size) == (4, 10, 5)
    # whatever maximum matching of G' step 3 picks, whole-path merging ends with 5 streams
    assert min(whole_path_streams(n, m, R) for m in max_matchings(a.reduced_edges, 5)) == 5
    # the assignment reaches the width anyway, with 6 syncs: one over |E'| - |M| = 5 ...
    assert a.num_streams == 4 and len(a.syncs) == 6
    check_sync_properties(n, edges, a)
    # ... and no 4-stream assignment does better: every chain cover of 4 chains needs 6 syncs
    comparable = [(u, v) for u in range(n) for v in range(n) if R[u][v]]
    fewest = 99
    for cover in max_matchings(comparable, n - 4):
        cross = [e for e in a.reduced_edges if e not in cover.items()]
        for k in range(min(fewest, len(cross) + 1)):
            if any(all(closure(n, list(cover.items()) + list(s))[u][v] for u, v in edges)
                   for s in itertools.combinations(cross, k)):
                fewest = k
                break
    assert fewest == 6


def test_two_step_shortfall_fixed_keeping_all_matched_edges():
    # G' = 0->2, 1->2, 2->3, 2->6, 1->5, 4->5: width 3 ({3, 5, 6}), |M| = 3
    n, edges = 7, [(0, 2), (1, 2), (1, 5), (2, 3), (2, 6), (4, 5)]
    R = closure(n, edges)
    # the maximum matching {0->2, 2->3, 1->5} leaves paths [0,2,3] [1,5] [4] [6], none mergeable
    assert whole_path_streams(n, {0: 2, 2: 3, 1: 5}, R) == 4
    a = assign_streams(n, edges)
    assert a.num_streams == brute_width(n, R) == 3
    assert kept_reduced_edges(a) == a.matching_size == 3
    assert len(a.syncs) <= len(a.reduced_edges) - a.matching_size
    check_sync_properties(n, edges, a)


# ---- structured cases with hand-checked counts -------------------------------------------------
def test_chain_is_one_stream_without_syncs():
    a = assign_streams(5, [(i, i + 1) for i in range(4)])
    assert (a.num_streams, a.syncs, a.matching_size) == (1, [], 4)


def test_diamond():
    a = assign_streams(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    assert a.num_streams == 2 and len(a.syncs) == 2
    # one fork event out of 0 and one join event into 3
    assert len([s for s in a.syncs if s[0] == 0]) == 1 and len([s for s in a.syncs if s[1] == 3]) == 1


def inception_block():
    """input(0) -> branches of lengths 1,2,3,2 -> concat(9)."""
    edges, nxt, ends = [], 1, []
    for length in (1, 2, 3, 2):
        prev = 0
        for _ in range(length):
            edges.append((prev, nxt))
            prev = nxt
            nxt += 1
        ends.append(prev)
    edges += [(e, nxt) for e in ends]
    return nxt + 1, edges


def test_inception_block_four_streams_six_syncs():
    n, edges = inception_block()
    a = assign_streams(n, edges)
    assert n == 10 and a.num_streams == 4
    forks = [s for s in a.syncs if s[0] == 0]
    joins = [s for s in a.syncs if s[1] == 9]
    assert len(forks) == 3 and len(joins) == 3 and len(a.syncs) == 6  # one branch rides along
    assert len(a.syncs) == len(a.reduced_edges) - a.matching_size == 12 - 6


def nasnet_cell():
    """Two inputs h0=0, h1=1; four pairwise combinations summed, then concatenated (12).

    sep(h0)=2 + sep(h1)=3 -> add 4;  pool(h0)=5 + h1 -> add 6;  pool(h1)=7 + pool(h1)=8 -> add 9;
    sep(h0)=10 + h0 -> add 11 (the h0 -> 11 skip is implied by h0 -> 10 -> 11);  concat(4, 6, 9, 11).
    """
    edges = [(0, 2), (1, 3), (2, 4), (3, 4), (0, 5), (5, 6), (1, 6), (1, 7), (1, 8), (7, 9), (8, 9),
             (0, 10), (10, 11), (0, 11), (4, 12), (6, 12), (9, 12), (11, 12)]
    return 13, edges


def test_nasnet_like_cell():
    n, edges = nasnet_cell()
    a = assign_streams(n, edges)
    # antichain {2, 3, 5, 7, 8, 10}; chains [0,2,4,12] [1,3] [5,6] [7,9] [8] [10,11] cover it
    assert a.num_streams == brute_width(n, closure(n, edges)) == 6
    assert len(a.reduced_edges) == 17 and (0, 11) not in a.reduced_edges
    assert a.matching_size == 7  # 13 nodes - 6 paths
    # every cross-stream G' edge is needed: forks 2 (h0) + 3 (h1), joins 1 (4) + 1 (9) + 3 (12)
    assert len(a.syncs) == 17 - 7 == 10
    check_sync_properties(n, edges, a)


def test_independent_nodes_each_get_a_stream():
    a = assign_streams(3, [])
    assert (a.num_streams, a.syncs, sorted(a.stream_of)) == (3, [], [0, 1, 2])
    assert assign_streams(3, [], max_streams=1).stream_of == [0, 0, 0]


def test_duplicates_and_determinism():
    n, edges = nasnet_cell()
    a = assign_streams(n, edges + edges[:5])
    assert a == assign_streams(n, list(reversed(edges)))
    assert a == assign_streams(n, edges)


def test_same_result_in_every_process():
    """Hash randomization must not leak into the matching (it did with string-keyed vertices)."""
    passes = Path(__file__).resolve().parents[1] / "relay_passes"
    # the assignment's files alone, as a package of their own: no TVM, no tvm_nimble
    code = ("import importlib, sys, types; pkg = sys.modules['sa'] = types.ModuleType('sa'); pkg.__path__ = [sys.argv[1]];"
            "m = importlib.import_module('sa.stream_assignment');"
            f"print(m.assign_streams(13, {nasnet_cell()[1]!r}), m.assign_streams(4, [(0, 1), (0, 2), (1, 3), (2, 3)]),"
            "'tvm' in sys.modules)")
    runs = [subprocess.Popen([sys.executable, "-c", code, str(passes)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2", "3")]
    outs = [r.communicate(timeout=120)[0] for r in runs]
    assert all(r.returncode == 0 for r in runs) and outs[0] and len(set(outs)) == 1
    assert outs[0].split()[-1] == "False"


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"cycle through node [123] \((\d) -> \d -> \d -> \1\)"):
        assign_streams(5, [(1, 2), (2, 3), (3, 1), (3, 0), (0, 4)])  # node 0 sits behind the cycle
    with pytest.raises(ValueError, match=r"edge \(0, 5\) refers to a node outside 0\.\.1"):
        assign_streams(2, [(0, 5)])
    with pytest.raises(ValueError, match="outside"):
        assign_streams(2, [(-1, 0)])
    with pytest.raises(ValueError, match="self-loop on node 1"):
        assign_streams(2, [(1, 1)])
    with pytest.raises(ValueError, match="max_streams must be >= 1"):
        assign_streams(2, [(0, 1)], max_streams=0)
    with pytest.raises(ValueError, match="num_nodes"):
        assign_streams(-1, [])
    empty = assign_streams(0, [])
    assert (empty.num_streams, empty.stream_of, empty.syncs, empty.order) == (0, [], [], [])


# ---- explain -----------------------------------------------------------------------------------
@settings(max_examples=min(EXAMPLES, 100), deadline=None)
@given(dags(max_nodes=10))
def test_summary_against_brute_force(dag):
    n, edges = dag
    a = assign_streams(n, edges)
    s = summarize(n, edges, a)
    R = closure(n, edges)
    assert s["width"] == dag_width(n, edges) == brute_width(n, R)
    # the longest path of G has as many nodes as the largest set of pairwise comparable nodes
    chain_len = max(len(c) for size in range(1, n + 1) for c in itertools.combinations(range(n), size)
                    if all(R[x][y] or R[y][x] for x, y in itertools.combinations(c, 2)))
    assert s["critical_path_ops"] == critical_path_ops(n, edges) == chain_len
    assert (s["ops"], s["edges"], s["streams"], s["syncs"]) == (n, len(set(edges)), a.num_streams, len(a.syncs))
    assert s["nimble_sync_bound"] == len(a.reduced_edges) - a.matching_size
    text = format_summary(s)
    assert f"streams: {a.num_streams}" in text and f"DAG width (max concurrent ops): {s['width']}" in text


def test_summary_of_empty_graph():
    s = summarize(0, [], assign_streams(0, []))
    assert s["width"] == s["critical_path_ops"] == s["streams"] == 0


def dot_parses(dot):
    if not shutil.which("dot"):
        pytest.skip("Graphviz 'dot' binary is not installed: cannot check that the DOT parses")
    out = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_dot_has_every_node_and_sync_and_parses():
    n, edges = nasnet_cell()
    a = assign_streams(n, edges)
    labels = [f'op "{i}" \\ x\nline2' for i in range(n)]
    dot = to_dot(n, edges, a, labels=labels, title='cell "A"')
    for v in range(n):
        assert f"n{v} [label=" in dot and f"(stream {a.stream_of[v]})" in dot
    for u, v in a.syncs:
        assert f'n{u} -> n{v} [style=dashed, color=red, fontcolor=red, label="sync"];' in dot
    solid = [e for e in a.reduced_edges if e not in a.syncs]
    for u, v in solid:
        assert f"n{u} -> n{v};" in dot
    svg = dot_parses(dot)
    assert svg.count('class="node"') == n + a.num_streams  # operators + legend swatches


def test_dot_palette_cycles_past_its_length():
    n = len(PALETTE) + 3
    a = assign_streams(n, [])
    dot = to_dot(n, [], a)
    assert dot.count(PALETTE[0]) == 2 * 2  # streams 0 and len(PALETTE): node + legend each
    dot_parses(dot)
