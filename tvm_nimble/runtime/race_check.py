"""A CPU simulator that hunts for races in a launch plan, no GPU needed.

It executes the very issue sequence the GPU executor issues
(:func:`tvm_nimble.runtime.issue.issue_sequence`: fork, per launch its waits, the kernel and
its records, join), framed by the host's input copy and its read of the outputs on the main
stream, in random orders that respect only what the GPU guarantees: program order per stream,
and each wait blocking until the record it binds to has run. Memory the plan considers free
is poisoned (all-ones bytes: NaN for floats): every pool and output block before the run,
input blocks until the input copy, and a tensor's bytes once its last reader has run. A
missing synchronization (a dropped wait, fork or join) makes a consumer, or the host, read
poison or stale data, and an unsafe storage reuse lets a dead tensor's poison (or a new
tensor's data) clobber a live one; either shows up as a wrong output. Without the poison,
stale bytes that happen to be right (a previous run's, an earlier occupant's) would hide it.
"""
from __future__ import annotations

import random

import numpy as np

from .device import Workspace
from .issue import COPY_IN, LAUNCH, READ_OUT, WAIT, bind_waits, issue_sequence, with_host_ops
from .tvm_compat import tensor_view

POISON = 0xFF  # all-ones bytes: NaN for floats, -1 for signed ints


def random_order(ops, rng: random.Random, strategy: str = "uniform") -> list[int]:
    """A random execution order (positions in ``ops``) that a GPU may choose for ``ops``.

    ``strategy``: ``"uniform"`` picks a random ready stream at each step; ``"priority"`` draws a
    random priority per stream and always runs the highest-priority ready stream, which pushes
    some streams as far ahead of the others as the synchronization allows (finds missing waits
    sooner).
    """
    bound = bind_waits(ops)
    queues: dict[int, list[int]] = {}
    for k, op in enumerate(ops):
        queues.setdefault(op.stream, []).append(k)
    heads = {s: 0 for s in queues}
    rank = {s: rng.random() for s in queues}
    done = [False] * len(ops)
    order: list[int] = []
    while len(order) < len(ops):
        ready = []
        for s, q in queues.items():
            h = heads[s]
            if h < len(q):
                k = q[h]
                rec = bound.get(k)
                if ops[k].kind != WAIT or rec is None or done[rec]:
                    ready.append(s)
        if not ready:
            raise RuntimeError("the sequence deadlocks: a wait blocks on a record that cannot run first")
        s = max(ready, key=rank.__getitem__) if strategy == "priority" else rng.choice(ready)
        k = queues[s][heads[s]]
        heads[s] += 1
        done[k] = True
        order.append(k)
    return order


def random_interleaving(plan, rng: random.Random, ops=None) -> list[int]:
    """A random order of the plan's launches that the issue sequence (default: the executor's) allows."""
    ops = issue_sequence(plan) if ops is None else ops
    return [ops[k].launch for k in random_order(ops, rng) if ops[k].kind == LAUNCH]


def _poison(tensor) -> None:
    """Fill a uint8 tensor (a storage block, or a byte view of one) with poison."""
    tensor.copyfrom(np.full(tuple(tensor.shape), POISON, dtype=np.uint8))


def simulate(module, inputs: dict[str, np.ndarray], seed: int, device=None, ops=None,
             poison: bool = True) -> list[np.ndarray]:
    """Run ``module`` (a NimbleModule for llvm) in one random order of ``ops`` (default: the
    executor's multi-stream issue sequence); return the outputs the host reads.

    Even seeds draw uniformly random orders, odd seeds random stream priorities (see
    :func:`random_order`). ``poison=False`` leaves free memory as it is (to show what the
    poison finds).
    """
    import tvm

    from .module import resolve_kernels

    plan = module.plan
    device = device or tvm.cpu(0)
    ops = issue_sequence(plan) if ops is None else list(ops)
    full = with_host_ops(ops)
    ws = Workspace(plan, module.params, device)
    if poison:
        for s in plan.storages:
            if s.kind in ("pool", "output", "input"):
                _poison(ws.storages[s.id])
    funcs = resolve_kernels(plan, module.kernels)
    args = ws.launch_args()
    rng = random.Random(seed)
    order = random_order(full, rng, "priority" if seed % 2 else "uniform")
    # A tensor is dead once its last reader has run (in this order); poison it then.
    remaining: dict[int, int] = {}
    for l in plan.launches:
        for a in l.args:
            remaining[plan.root(a)] = remaining.get(plan.root(a), 0) + 1
    outs: list[np.ndarray] = []
    for k in order:
        op = full[k]
        if op.kind == COPY_IN:
            for name, value in inputs.items():
                ws.tensors[plan.inputs[plan.input_names.index(name)]].copyfrom(np.asarray(value, order="C"))
        elif op.kind == READ_OUT:
            outs = [ws.tensors[o].numpy().copy() for o in plan.outputs]
        elif op.kind == LAUNCH:
            launch = plan.launches[op.launch]
            funcs[op.launch](*args[op.launch])
            for a in launch.args:
                r = plan.root(a)
                remaining[r] -= 1
                t = plan.tensors[r]
                if poison and remaining[r] == 0 and t.kind == "intermediate":
                    _poison(tensor_view(ws.storages[t.storage], [t.nbytes], "uint8", t.offset))
    ws.release()
    return outs


def check_races(module, inputs: dict[str, np.ndarray], reference: list[np.ndarray], seeds=range(20),
                rtol: float = 1e-4, atol: float = 1e-4, ops=None, poison: bool = True) -> list[int]:
    """Seeds whose order produced a wrong output (empty: no race found)."""
    bad = []
    for seed in seeds:
        outs = simulate(module, inputs, seed, ops=ops, poison=poison)
        if len(outs) != len(reference) or not all(
                np.allclose(o, r, rtol=rtol, atol=atol) for o, r in zip(outs, reference)):
            bad.append(seed)
    return bad
