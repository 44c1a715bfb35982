"""Nimble stream assignment checked against brute force on small DAGs."""
import itertools
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_nimble.relay_passes.explain import critical_path_ops, dag_width, summarize, to_dot
from tvm_nimble.relay_passes.stream_assignment import assign_streams


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
    best = 0
    for size in range(n, 0, -1):
        for nodes in itertools.combinations(range(n), size):
            if all(not R[a][b] and not R[b][a] for a, b in itertools.combinations(nodes, 2)):
                return size
    return best


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


dags = st.integers(min_value=1, max_value=11).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.booleans(), min_size=n * (n - 1) // 2, max_size=n * (n - 1) // 2)))


def to_edges(n, bits):
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    return [p for p, b in zip(pairs, bits) if b]


def check_sync_properties(n, edges, a):
    # every edge of G is enforced by program order + syncs
    assert enforced(n, edges, a, a.syncs)
    # every sync is a cross-stream edge of G'
    for u, v in a.syncs:
        assert (u, v) in a.reduced_edges and a.stream_of[u] != a.stream_of[v]
    # no sync is redundant
    for i in range(len(a.syncs)):
        assert not enforced(n, edges, a, a.syncs[:i] + a.syncs[i + 1:]), f"sync {a.syncs[i]} is redundant"


@settings(max_examples=int(__import__("os").environ.get("NIMBLE_HYPOTHESIS_EXAMPLES", 200)), deadline=None)
@given(dags)
def test_assignment_properties_against_brute_force(dag):
    n, bits = dag
    edges = to_edges(n, bits)
    a = assign_streams(n, edges)
    R = closure(n, edges)
    # (e) order is topological
    pos = {v: i for i, v in enumerate(a.order)}
    assert sorted(a.order) == list(range(n)) and all(pos[u] < pos[v] for u, v in edges)
    # (a) max logical concurrency: nodes of one stream are totally ordered by reachability
    for s in range(a.num_streams):
        nodes = a.stream_nodes(s)
        assert all(R[x][y] for x, y in zip(nodes, nodes[1:]))
    # (d) the stream count is the DAG's width
    assert a.num_streams == brute_width(n, R)
    assert sorted(set(a.stream_of)) == list(range(a.num_streams))
    # G' is the transitive reduction: same reachability, no edge implied by the others
    assert closure(n, a.reduced_edges) == R
    for e in a.reduced_edges:
        assert not closure(n, [x for x in a.reduced_edges if x != e])[e[0]][e[1]]
    # (b) syncs enforce G, are irredundant, and respect Nimble's bound
    check_sync_properties(n, edges, a)
    assert len(a.syncs) <= len(a.reduced_edges) - a.matching_size


@settings(max_examples=120, deadline=None)
@given(dags, st.integers(min_value=1, max_value=4))
def test_capped_assignment_stays_valid(dag, cap):
    n, bits = dag
    edges = to_edges(n, bits)
    a = assign_streams(n, edges, max_streams=cap)
    assert a.num_streams <= cap
    check_sync_properties(n, edges, a)
    # streams merged from matched chains keep matched edges inside streams: the bound still holds
    assert len(a.syncs) <= len(a.reduced_edges) - a.matching_size


def test_chain_is_one_stream_without_syncs():
    a = assign_streams(5, [(i, i + 1) for i in range(4)])
    assert a.num_streams == 1 and a.syncs == []


def test_diamond():
    a = assign_streams(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    assert a.num_streams == 2 and len(a.syncs) == 2


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
    assert a.num_streams == 4
    assert len(a.syncs) == 6  # 3 forks + 3 joins: one branch stays on the input's stream


def test_nasnet_like_cell():
    # two cell inputs (0, 1); five pairwise-combined branches: sep-conv pairs and pools on
    # each input, each pair summed (add), the five sums concatenated (12).
    edges = [(0, 2), (2, 3), (1, 4), (3, 5), (4, 5),  # sep(h0) + pool(h1) -> add 5
             (0, 6), (1, 7), (6, 8), (7, 8),  # pool(h0) + sep(h1) -> add 8
             (1, 9), (0, 9),  # identity(h1) + h0 -> add 9
             (0, 10), (1, 10),  # avg-pool pair -> add 10 (fused)
             (1, 11), (0, 11),
             (5, 12), (8, 12), (9, 12), (10, 12), (11, 12)]
    n = 13
    a = assign_streams(n, edges)
    R = closure(n, edges)
    assert a.num_streams == brute_width(n, R) == 7  # {2|3, 4, 6, 7, 9, 10, 11}
    check_sync_properties(n, edges, a)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="cycle"):
        assign_streams(3, [(0, 1), (1, 2), (2, 0)])
    with pytest.raises(ValueError, match="outside"):
        assign_streams(2, [(0, 5)])
    with pytest.raises(ValueError, match="self-loop"):
        assign_streams(2, [(1, 1)])
    with pytest.raises(ValueError, match="max_streams"):
        assign_streams(2, [(0, 1)], max_streams=0)
    assert assign_streams(0, []).num_streams == 0


@settings(max_examples=60, deadline=None)
@given(dags)
def test_summary_against_brute_force(dag):
    n, bits = dag
    edges = to_edges(n, bits)
    a = assign_streams(n, edges)
    s = summarize(n, edges, a)
    R = closure(n, edges)
    assert s["width"] == dag_width(n, edges) == brute_width(n, R)
    # longest chain by brute force over all node subsets that form a chain
    longest = max(len(c) for size in range(1, n + 1) for c in itertools.combinations(range(n), size)
                  if all(R[x][y] for x, y in zip(c, c[1:]))) if n else 0
    assert s["critical_path_ops"] == critical_path_ops(n, edges) == longest


def test_dot_has_every_node_and_sync():
    n, edges = inception_block()
    a = assign_streams(n, edges)
    dot = to_dot(n, edges, a, labels=[f'op "{i}"' for i in range(n)], title="block")
    for v in range(n):
        assert f"n{v} [" in dot
    for u, v in a.syncs:
        assert f"n{u} -> n{v} [style=dashed" in dot
    if not shutil.which("dot"):
        pytest.skip("Graphviz 'dot' is not installed: cannot check that it parses the DOT")
    out = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
