"""Concurrency-safe memory planning, the static race checker and the CPU race simulator."""
import copy
import random

import numpy as np
import pytest

from tvm_nimble import build
from tvm_nimble.codegen.checker import check_plan
from tvm_nimble.codegen.happens_before import happens_before, sequential_order
from tvm_nimble.codegen.memory_plan import plan_pool, plan_pool_by_size
from tvm_nimble.runtime.race_check import check_races, random_interleaving
from tvm_nimble.relay_passes.annotate import events_for
from tvm_nimble.relay_passes.stream_assignment import assign_streams


def test_every_zoo_plan_is_race_free(zoo_built):
    assert check_plan(zoo_built.module.plan) == []
    assert check_races(zoo_built.module, zoo_built.inputs, zoo_built.reference, seeds=range(10)) == []


def _random_schedule(seed):
    """A random operator DAG scheduled by Nimble; each op writes one tensor read by its consumers."""
    rng = random.Random(seed)
    n = rng.randint(4, 14)
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.3]
    a = assign_streams(n, edges)
    record, waits = events_for(a)
    order = a.order
    idx = {v: i for i, v in enumerate(order)}
    streams = [a.stream_of[v] for v in order]
    w = [waits.get(v, []) for v in order]
    r = [[record[v]] if v in record else [] for v in order]
    readers = {v: [idx[c] for u, c in edges if u == v] for v in range(n)}
    accesses = {v: (1 << idx[v]) | sum(1 << i for i in readers[v]) for v in range(n)}
    first_write = {v: idx[v] for v in range(n)}
    sizes = {v: rng.choice([256, 512, 1024]) for v in range(n)}
    return n, streams, w, r, accesses, first_write, sizes


def _overlaps(pool, n, accesses, first_write, before):
    bad = []
    by_block = {}
    for t, b in pool.block_of.items():
        by_block.setdefault(b, []).append(t)
    for ts in by_block.values():
        for i, x in enumerate(ts):
            for y in ts[i + 1:]:
                x_then_y = accesses[x] & ~before[first_write[y]] == 0
                y_then_x = accesses[y] & ~before[first_write[x]] == 0
                if not (x_then_y or y_then_x):
                    bad.append((x, y))
    return bad


def test_concurrency_safe_planner_never_overlaps_while_sequential_plan_does():
    sequential_unsafe = 0
    for seed in range(300):
        n, streams, w, r, accesses, first_write, sizes = _random_schedule(seed)
        hb = happens_before(streams, w, r)
        safe = plan_pool(list(range(n)), sizes, first_write, accesses, hb)
        assert _overlaps(safe, n, accesses, first_write, hb) == []
        by_size = plan_pool_by_size(list(range(n)), sizes, first_write, accesses, hb)
        assert _overlaps(by_size, n, accesses, first_write, hb) == []
        naive = plan_pool(list(range(n)), sizes, first_write, accesses, sequential_order(n))
        sequential_unsafe += bool(_overlaps(naive, n, accesses, first_write, hb))
        assert safe.total_bytes <= sum(sizes.values())
    # adversarial DAGs exist where TVM-style sequential reuse is unsafe under concurrency
    assert sequential_unsafe > 0


def test_sequential_plan_on_a_multi_branch_net_is_caught(nasnet_built):
    """TVM-style reuse (last use earlier in the launch list) races once branches run concurrently."""
    b = nasnet_built
    naive = build(b.model, "llvm", reuse="sequential")
    problems = check_plan(naive.plan)
    assert any("lifetimes may overlap" in p for p in problems)
    assert check_races(naive, b.inputs, b.reference, seeds=range(10)) != []
    # the same model, concurrency-safe plan: clean
    assert check_plan(b.module.plan) == []


def test_removed_sync_is_caught(inception_built):
    b = inception_built
    module = b.module
    plan = copy.deepcopy(module.plan)
    launch = next(l for l in plan.launches if l.waits)
    launch.waits = launch.waits[1:]
    assert any("missing sync" in p for p in check_plan(plan))
    faulty = type(module)(plan, module.kernels, module.params)
    assert check_races(faulty, b.inputs, b.reference, seeds=range(20)) != []


def test_interleavings_respect_streams_and_events(nasnet_built):
    plan = nasnet_built.module.plan
    recorder = plan.recorder_of_event()
    seen_orders = set()
    for seed in range(20):
        order = random_interleaving(plan, random.Random(seed))
        pos = {i: k for k, i in enumerate(order)}
        for l in plan.launches:
            assert all(pos[recorder[e]] < pos[l.idx] for e in l.waits)
        for s in range(plan.num_streams):
            ids = [l.idx for l in plan.stream_launches(s)]
            assert [i for i in order if i in set(ids)] == ids
        seen_orders.add(tuple(order))
    assert len(seen_orders) > 1  # really explores different interleavings


def test_memory_report_numbers(zoo_built):
    mem = zoo_built.module.plan.memory
    assert mem["pool_bytes"] == mem["pool_bytes_concurrent_safe"]
    assert mem["pool_bytes_sequential"] <= mem["pool_bytes_concurrent_safe"] <= mem["pool_bytes_no_reuse"]
    pool = sum(s.nbytes for s in zoo_built.module.plan.storages if s.kind == "pool")
    assert pool == mem["pool_bytes"]


def _py_kernel(fn):
    def kernel(*args):
        *ins, out = args
        out.copyfrom(fn(*[t.numpy() for t in ins]).astype(out.dtype))
    return kernel


def _stale_but_right_module(synced: bool):
    """A = relu(x) and B = relu(x) share storage 1: B takes it over once A's reader C = relu(A) is done
    (event e0). If out = B + C does not wait for B's write (e1), it reads storage 1 early, where A's
    stale bytes hold exactly B's values: only the poison written when A dies reveals the missing sync."""
    from tvm_nimble.runtime.module import NimbleModule
    from tvm_nimble.contract.plan import Launch, Plan, Storage, TensorSlot

    shape, nb = [4, 8], 128
    tensors = [TensorSlot(0, "x", shape, "float32", "input", 0),
               TensorSlot(1, "A", shape, "float32", "intermediate", 1),
               TensorSlot(2, "C", shape, "float32", "intermediate", 2),
               TensorSlot(3, "B", shape, "float32", "intermediate", 1),
               TensorSlot(4, "out", shape, "float32", "output", 3)]
    launches = [Launch(0, "relu", [0, 1], [1], 0),
                Launch(1, "relu", [1, 2], [2], 0, records=[0]),
                Launch(2, "relu", [0, 3], [3], 1, waits=[0], records=[1] if synced else []),
                Launch(3, "add", [3, 2, 4], [4], 0, waits=[1] if synced else [])]
    plan = Plan(target={"kind": "llvm"}, num_streams=2, num_events=2, tensors=tensors,
                storages=[Storage(0, nb, "input"), Storage(1, nb, "pool"), Storage(2, nb, "pool"),
                          Storage(3, nb, "output")],
                launches=launches, inputs=[0], outputs=[4], constants=[])
    plan.validate()
    kernels = {"relu": _py_kernel(lambda x: np.maximum(x, 0)), "add": _py_kernel(lambda a, b: a + b)}
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(shape)
    return NimbleModule(plan, kernels, {}), {"x": x}, [2 * np.maximum(x, 0)]


def test_only_the_poison_reveals_a_missing_sync_over_stale_but_right_data():
    good, inputs, ref = _stale_but_right_module(synced=True)
    assert check_plan(good.plan) == []
    assert check_races(good, inputs, ref, seeds=range(40)) == []
    bad, inputs, ref = _stale_but_right_module(synced=False)
    assert any("missing sync" in p for p in check_plan(bad.plan))  # the static checker sees it too
    assert check_races(bad, inputs, ref, seeds=range(40), poison=False) == []  # stale data is right
    assert check_races(bad, inputs, ref, seeds=range(40)) != []  # the dead tensor's poison is not



@pytest.mark.parametrize("block", [2048, 64])
def test_ordered_pairs_match_the_pairwise_definition(block, monkeypatch):
    """The matrix of happens-before-ordered tensor pairs (a 0/1 matrix product, taken in blocks) against the
    definition pair by pair: every access of one tensor happens before the other's first write, either way."""
    from tvm_nimble.codegen import memory_plan

    monkeypatch.setattr(memory_plan, "_BLOCK", block)
    rng = random.Random(block)
    n, width = 300, 200
    accesses = {t: sum(1 << rng.randrange(width) for _ in range(2)) for t in range(n)}
    ready = {t: rng.getrandbits(width) | rng.getrandbits(width) | rng.getrandbits(width) for t in range(n)}
    got = memory_plan.ordered_pairs(list(range(n)), accesses, lambda t: ready[t])
    want = [[accesses[i] & ~ready[j] == 0 or accesses[j] & ~ready[i] == 0 for j in range(n)] for i in range(n)]
    assert got.tolist() == want
    assert 0 < got.sum() < n * n  # both kinds of pairs are there
