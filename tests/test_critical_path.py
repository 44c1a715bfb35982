"""The critical-path bound against a hand-computed DAG, and against brute force on random plans."""
import itertools
import random

import pytest

from tvm_nimble.codegen.critical_path import critical_path, critical_stream_priority, dependency_edges, serial_sum
from tvm_nimble.contract.plan import Launch, Plan, Storage, TensorSlot


def make_plan(ops, n_tensors, views=None):
    """ops: list of (reads, writes) tensor ids; tensor 0 is the input."""
    views = views or {}
    tensors = [TensorSlot(i, f"t{i}", [4], "float32", "input" if i == 0 else "intermediate", i, 0, views.get(i))
               for i in range(n_tensors)]
    storages = [Storage(i, 16, "input" if i == 0 else "pool") for i in range(n_tensors)]
    launches = [Launch(i, f"k{i}", list(r) + list(w), list(w), 0) for i, (r, w) in enumerate(ops)]
    return Plan({"kind": "llvm"}, 1, 0, tensors, storages, launches, [0], [n_tensors - 1], [])


def test_diamond_with_a_tail():
    #      0 (1ms) -> 1 (5ms) -> 3 (1ms) -> 4 (2ms)
    #              \-> 2 (2ms) -/
    plan = make_plan([([0], [1]), ([1], [2]), ([1], [3]), ([2, 3], [4]), ([4], [5])], 6)
    assert dependency_edges(plan) == [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
    length, path = critical_path(plan, [1, 5, 2, 1, 2])
    assert length == 9 and path == [0, 1, 3, 4]
    assert serial_sum([1, 5, 2, 1, 2]) == 11


def test_a_read_through_a_view_is_a_dependency():
    # launch 1 reads tensor 2, a view of tensor 1 that launch 0 wrote
    plan = make_plan([([0], [1]), ([2], [3])], 4, views={2: 1})
    assert dependency_edges(plan) == [(0, 1)]
    assert critical_path(plan, [3, 4])[0] == 7


@pytest.mark.parametrize("seed", range(20))
def test_longest_path_equals_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 7)
    ops = []
    for i in range(n):  # launch i writes tensor i + 1 and reads a random subset of earlier tensors
        reads = [t for t in range(i + 1) if rng.random() < 0.4] or [0]
        ops.append((reads, [i + 1]))
    plan = make_plan(ops, n + 1)
    durations = [rng.uniform(0.1, 3) for _ in range(n)]
    edges = set(dependency_edges(plan))
    best = 0.0
    for size in range(1, n + 1):  # every increasing chain of launches that follows edges
        for chain in itertools.combinations(range(n), size):
            if all((a, b) in edges for a, b in zip(chain, chain[1:])):
                best = max(best, sum(durations[i] for i in chain))
    assert critical_path(plan, durations)[0] == pytest.approx(best)


def test_the_streams_of_a_heavy_branch_get_priority(inception_built):
    """One heavy launch in one branch: the critical path runs through it, so its stream is marked, and
    the streams of the branches beside it are not."""
    plan = inception_built.module.plan
    assert plan.num_streams > 2
    first = plan.launches[0].stream
    heavy = next(l for l in plan.launches if l.stream != first)
    durations = [1.0] * len(plan.launches)
    durations[heavy.idx] = 1000.0
    priority = critical_stream_priority(plan, durations)
    _, path = critical_path(plan, durations)
    assert heavy.idx in path
    assert len(priority) == plan.num_streams and priority[heavy.stream] == 1
    assert priority == [int(any(plan.launches[p].stream == s for p in path)) for s in range(plan.num_streams)]
    assert 0 < sum(priority) < plan.num_streams
