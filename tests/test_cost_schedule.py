"""Cost-aware stream caps (relay_passes/cost_schedule.py) against brute force on small DAGs.

The reference shares no code with the implementation: every split of the operators into at most
``cap`` streams, times every topological order, timed with each stream running its operators in
that order and each operator starting once its stream is free and its inputs are done (the model
the list schedule ranks with; no GPU contention). Its minimum is the best schedule there is.
"""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_stream_assignment import EXAMPLES, check_numbering, check_order, check_sync_properties, dags

from tvm_nimble.relay_passes.stream_assignment import assign_streams


def finish_time(n, edges, stream_of, order, costs):
    preds = {v: [u for u, w in edges if w == v] for v in range(n)}
    end, free = {}, {}
    for v in order:
        start = max([free.get(stream_of[v], 0)] + [end[u] for u in preds[v]])
        end[v] = free[stream_of[v]] = start + costs[v]
    return max(end.values(), default=0)


def topological_orders(n, edges):
    for perm in itertools.permutations(range(n)):
        pos = {v: i for i, v in enumerate(perm)}
        if all(pos[u] < pos[v] for u, v in edges):
            yield perm


def best_possible(n, edges, costs, cap):
    orders = list(topological_orders(n, edges))
    return min(finish_time(n, edges, split, order, costs)
               for split in itertools.product(range(cap), repeat=n) for order in orders)


def schedule_time(n, edges, costs, cap, cost_aware=True):
    a = assign_streams(n, edges, max_streams=cap, costs=costs if cost_aware else None)
    return finish_time(n, edges, a.stream_of, a.order, costs)


# (nodes, edges, costs): a cap of 2 streams
#: Nimble merges the two branches that share the fewest concurrent pairs: the 5 and the 10 (one pair
#: each way), 17 in all; the cost-aware merge puts the short 2-chain with the 10.
MERGE_MATTERS = (4, [(0, 1), (0, 2)], [2, 2, 5, 10])
#: the same split either way, but node 1 (an independent 10) comes first in program order on the
#: stream that also runs node 2, which feeds the critical path (2 -> 3 -> 4); least slack first runs 2 first
ORDER_MATTERS = (5, [(0, 3), (0, 4), (2, 3), (2, 4), (3, 4)], [5, 10, 5, 10, 5])
BOTH = (6, [(0, 1), (0, 2), (0, 4), (1, 4), (2, 5), (3, 4)], [10, 5, 5, 2, 2, 5])


@pytest.mark.parametrize("dag", [MERGE_MATTERS, ORDER_MATTERS, BOTH], ids=["merge", "order", "both"])
def test_the_cost_aware_cap_finds_the_best_schedule_where_counting_pairs_does_not(dag):
    n, edges, costs = dag
    optimum = best_possible(n, edges, costs, 2)
    assert schedule_time(n, edges, costs, 2) == optimum
    assert schedule_time(n, edges, costs, 2, cost_aware=False) > optimum


def test_order_matters_case_keeps_the_split_and_changes_the_order():
    n, edges, costs = ORDER_MATTERS
    aware, plain = (assign_streams(n, edges, max_streams=2, costs=c) for c in (costs, None))

    def split(a):
        return sorted(sorted(a.stream_nodes(s)) for s in range(a.num_streams))

    assert split(aware) == split(plain)
    shared = next(s for s in range(2) if 1 in aware.stream_nodes(s))
    assert aware.stream_nodes(shared) == [2, 1]
    assert plain.stream_nodes(next(s for s in range(2) if 1 in plain.stream_nodes(s))) == [1, 2]


@st.composite
def dags_with_costs(draw, max_nodes=6):
    n, edges = draw(dags(max_nodes=max_nodes))
    costs = draw(st.lists(st.sampled_from([0, 1, 2, 5, 10]), min_size=n, max_size=n))
    return n, edges, costs


@settings(max_examples=EXAMPLES, deadline=None)
@given(dags_with_costs(), st.integers(min_value=1, max_value=3))
def test_cost_aware_caps_are_valid_never_worse_than_counting_and_never_beat_brute_force(dag, cap):
    n, edges, costs = dag
    a = assign_streams(n, edges, max_streams=cap, costs=costs)
    check_order(n, edges, a)
    check_numbering(a)
    check_sync_properties(n, edges, a)
    free = assign_streams(n, edges)
    assert a.num_streams == min(cap, free.num_streams)
    if cap >= free.num_streams:
        assert a == free  # no cap to apply: the costs change nothing
    mine = finish_time(n, edges, a.stream_of, a.order, costs)
    assert mine <= schedule_time(n, edges, costs, cap, cost_aware=False)
    if n <= 5:
        assert mine >= best_possible(n, edges, costs, cap)


def test_on_random_dags_the_cost_aware_cap_is_closer_to_the_best_schedule():
    """Against brute force on 150 random 4-6 node DAGs of width >= 3 capped at 2 streams: the
    cost-aware cap is optimal more often and is never worse."""
    rng = random.Random(7)
    aware_gap, plain_gap = [], []
    while len(aware_gap) < 150:
        n = rng.randint(4, 6)
        edges = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < 0.3]
        if assign_streams(n, edges).num_streams < 3:
            continue
        costs = [rng.choice([1, 2, 5, 10]) for _ in range(n)]
        optimum = best_possible(n, edges, costs, 2)
        aware_gap.append(schedule_time(n, edges, costs, 2) / optimum)
        plain_gap.append(schedule_time(n, edges, costs, 2, cost_aware=False) / optimum)
    aware_gap, plain_gap = np.array(aware_gap), np.array(plain_gap)
    assert (aware_gap <= plain_gap + 1e-12).all()
    assert (aware_gap == 1).sum() > (plain_gap == 1).sum() + 30
    assert aware_gap.mean() < plain_gap.mean() - 0.05


@pytest.mark.parametrize("cap", [3, 4])
def test_a_wide_fork_join_reaches_its_longest_branch(cap):
    """Sixteen branches (two of 10, fourteen of 0.5) between a fork and a join: with 3 or 4 streams the
    best schedule takes as long as one long branch (the short ones share streams). 120 stream pairs:
    more than the list schedule scores per merge, so the overlap ranking is exercised too."""
    from tvm_nimble.relay_passes.cost_schedule import PAIRS_TRIED

    n, edges = 18, [(0, b) for b in range(1, 17)] + [(b, 17) for b in range(1, 17)]
    costs = [0] + [10, 10] + [0.5] * 14 + [0]
    assert 16 * 15 // 2 > PAIRS_TRIED
    a = assign_streams(n, edges, max_streams=cap, costs=costs)
    check_order(n, edges, a)
    check_sync_properties(n, edges, a)
    assert finish_time(n, edges, a.stream_of, a.order, costs) == 10
    assert schedule_time(n, edges, costs, cap, cost_aware=False) > 10


def test_costs_are_checked():
    with pytest.raises(ValueError, match="2 costs for 3 nodes"):
        assign_streams(3, [(0, 1)], max_streams=1, costs=[1, 2])
    with pytest.raises(ValueError, match="operator costs must be >= 0"):
        assign_streams(3, [], max_streams=2, costs=[1, -2, 1])


def test_a_cost_aware_capped_model_matches_the_reference_in_every_order(nasnet_built):
    """The cost-aware plan of a zoo net, with made-up kernel costs, on llvm: the same outputs as the
    ONNX reference evaluator (and they depend on the input), in 20 random interleavings of its streams."""
    from tvm_nimble import NimbleExecutor, zoo
    from tvm_nimble.compiler.stream_choice import rescheduled
    from tvm_nimble.runtime.race_check import check_races

    b = nasnet_built
    rng = random.Random(0)
    costs = [rng.choice([1.0, 3.0, 10.0]) for _ in b.module.program.kernels]
    plain = rescheduled(b.module, 3)
    aware = rescheduled(b.module, 3, costs=costs)
    assert aware.plan.num_streams == 3 and aware.report.stream_order == "slack"
    assert [(l.kernel, l.stream) for l in aware.plan.launches] != [(l.kernel, l.stream) for l in plain.plan.launches]
    with NimbleExecutor(aware) as ex:
        out = [o.numpy() for o in ex(**b.inputs)]
        other = [o.numpy() for o in ex(**zoo.random_inputs(b.model, seed=1))]
    for o, r in zip(out, b.reference):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4)
    assert any(not np.allclose(o, p) for o, p in zip(out, other))
    assert check_races(aware, b.inputs, b.reference, seeds=range(20)) == []


def test_a_kept_merge_sequence_gives_every_cap_what_a_fresh_greedy_gives():
    """cost_capped keeps each graph's greedy merge sequence so that smaller caps continue it: on random
    wide DAGs, every cap asked in a shuffled order (some continuing the kept sequence, some replaying a
    prefix of it) gives the streams and order the greedy gives with nothing kept."""
    from tvm_nimble.relay_passes import cost_schedule

    rng = random.Random(3)
    tried = 0
    while tried < 25:
        n = rng.randint(8, 14)
        edges = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < 0.15]
        widest = assign_streams(n, edges)
        if widest.num_streams < 4:
            continue
        tried += 1
        costs = [rng.choice([1, 2, 5, 10]) for _ in range(n)]
        caps = list(range(1, widest.num_streams))
        fresh = {}
        for cap in caps:
            cost_schedule.PROCESS_MERGES.clear()
            a = assign_streams(n, edges, max_streams=cap, costs=costs)
            fresh[cap] = (a.stream_of, a.order)
        cost_schedule.PROCESS_MERGES.clear()
        rng.shuffle(caps)
        for cap in caps:
            a = assign_streams(n, edges, max_streams=cap, costs=costs)
            assert (a.stream_of, a.order) == fresh[cap], (n, edges, costs, cap)
