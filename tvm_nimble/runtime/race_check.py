"""A CPU simulator that hunts for races in a launch plan, no GPU needed.

It executes the plan's launches in random interleavings that respect only what the GPU
guarantees, program order per stream and the planned events, and poisons storage (NaN
bytes) whenever the plan considers a tensor dead. A missing synchronization makes a
consumer read poison or stale data, an unsafe storage reuse lets a dead tensor's poison
(or a new tensor's data) clobber a live one; either shows up as a wrong output.
"""
from __future__ import annotations

import random

import numpy as np

from .device import Workspace

POISON = 0xFF  # all-ones bytes: NaN for floats, -1 for signed ints


def random_interleaving(plan, rng: random.Random) -> list[int]:
    """A random order of launches consistent with per-stream order and the planned events."""
    queues: dict[int, list[int]] = {}
    for l in plan.launches:
        queues.setdefault(l.stream, []).append(l.idx)
    recorded: set[int] = set()
    order: list[int] = []
    while any(queues.values()):
        ready = [s for s, q in queues.items() if q and all(e in recorded for e in plan.launches[q[0]].waits)]
        if not ready:
            raise RuntimeError("the plan deadlocks: a launch waits on an event that is never recorded first")
        s = rng.choice(ready)
        i = queues[s].pop(0)
        order.append(i)
        recorded.update(plan.launches[i].records)
    return order


def _last_use(plan) -> dict[int, int]:
    last: dict[int, int] = {}
    for l in plan.launches:
        for a in l.args:
            last[plan.root(a)] = l.idx
    return last


def simulate(module, inputs: dict[str, np.ndarray], seed: int, device=None) -> list[np.ndarray]:
    """Run ``module`` (a NimbleModule for llvm) in one random interleaving; return the outputs."""
    import tvm

    plan = module.plan
    device = device or tvm.cpu(0)
    ws = Workspace(plan, module.params, device)
    poison_block = {s.id: np.full(max(s.nbytes, 1), POISON, dtype=np.uint8) for s in plan.storages if s.kind == "pool"}
    for sid, block in poison_block.items():
        ws.storages[sid].copyfrom(block)
    for name, value in inputs.items():
        ws.tensors[plan.inputs[plan.input_names.index(name)]].copyfrom(np.asarray(value, order="C"))
    funcs = [module.kernels[l.kernel] for l in plan.launches]
    args = ws.launch_args()
    order = random_interleaving(plan, random.Random(seed))
    # A tensor is dead once its last reader has run (in this interleaving); poison it then.
    remaining = {}
    for l in plan.launches:
        for a in l.args:
            remaining[plan.root(a)] = remaining.get(plan.root(a), 0) + 1
    for i in order:
        launch = plan.launches[i]
        funcs[i](*args[i])
        for a in launch.args:
            r = plan.root(a)
            remaining[r] -= 1
            t = plan.tensors[r]
            if remaining[r] == 0 and t.kind == "intermediate":
                ws.storages[t.storage]._create_view([t.nbytes], "uint8", t.offset).copyfrom(
                    np.full(t.nbytes, POISON, dtype=np.uint8))
    outs = [ws.tensors[o].numpy().copy() for o in plan.outputs]
    ws.release()
    return outs


def check_races(module, inputs: dict[str, np.ndarray], reference: list[np.ndarray], seeds=range(20),
                rtol: float = 1e-4, atol: float = 1e-4) -> list[int]:
    """Seeds whose interleaving produced a wrong output (empty: no race found)."""
    bad = []
    for seed in seeds:
        outs = simulate(module, inputs, seed)
        if len(outs) != len(reference) or not all(
                np.allclose(o, r, rtol=rtol, atol=atol) for o, r in zip(outs, reference)):
            bad.append(seed)
    return bad
