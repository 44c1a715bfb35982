"""Storage reuse that stays correct when streams run concurrently.

TVM's ``StaticPlanBlockMemory`` lets a tensor reuse a block once the previous occupant's
last use is *earlier in the program*. With several streams "earlier" means nothing: two
kernels far apart in the launch list may run at the same time. Here a tensor may take over
a block only when every access of the block's previous occupants *happens before* (see
:mod:`codegen.happens_before`) the launch that first writes the new tensor. With a
single-stream relation the same planner reproduces the sequential plan, which is how we
report what concurrency costs in memory. Two greedy orders are tried (first write, largest
first) and the smaller plan kept; both only ever share a block between happens-before-ordered
tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PoolPlan:
    block_of: dict[int, int]  # tensor -> block
    block_sizes: list[int]

    @property
    def total_bytes(self) -> int:
        return sum(self.block_sizes)


def _ready(first_write, before, ready):
    """t -> the launches that happen before every write of t: ``ready[t]`` when given (a tensor written
    in slices by several launches), else what happens before its one writer."""
    return (lambda t: ready[t]) if ready is not None else (lambda t: before[first_write[t]])


def plan_pool(tensors: list[int], nbytes: dict[int, int], first_write: dict[int, int],
              accesses: dict[int, int], before: list[int], ready: dict[int, int] | None = None) -> PoolPlan:
    """Assign each tensor to a block.

    ``accesses[t]`` is the bitmask of launches that touch ``t`` (its writer included) and
    ``before`` the happens-before bitsets. Greedy in first-write order, best fit by size,
    growing the largest free block when none is big enough (as TVM does). ``ready`` (see
    :func:`codegen.happens_before.write_ready`) is needed when a tensor has several writers.
    """
    ready_of = _ready(first_write, before, ready)
    block_sizes: list[int] = []
    block_users: list[int] = []  # union of the access masks of every occupant so far
    block_of: dict[int, int] = {}
    for t in sorted(tensors, key=lambda t: (first_write[t], t)):
        hb = ready_of(t)
        free = [b for b in range(len(block_sizes)) if block_users[b] & ~hb == 0]
        fits = [b for b in free if block_sizes[b] >= nbytes[t]]
        if fits:
            b = min(fits, key=lambda b: (block_sizes[b], b))
        elif free:
            b = max(free, key=lambda b: (block_sizes[b], -b))
            block_sizes[b] = nbytes[t]
        else:
            b = len(block_sizes)
            block_sizes.append(nbytes[t])
            block_users.append(0)
        block_users[b] |= accesses[t]
        block_of[t] = b
    return PoolPlan(block_of, block_sizes)


def _bit_rows(masks: list[int], width: int) -> np.ndarray:
    """The launch bitsets ``masks`` as rows of a 0/1 uint8 matrix ``width`` launches wide."""
    nbytes = (width + 7) // 8
    raw = np.frombuffer(b"".join(m.to_bytes(nbytes, "little") for m in masks), dtype=np.uint8)
    return np.unpackbits(raw.reshape(len(masks), nbytes), axis=1, bitorder="little")[:, :width]


#: rows of the pair matrix computed at once: the float32 blocks stay under ~16 MB a side up to 2,048 launches
_BLOCK = 2048


def ordered_pairs(tensors: list[int], accesses: dict[int, int], ready_of) -> np.ndarray:
    """[i, j]: ``tensors[i]`` and ``tensors[j]`` are happens-before ordered, either way (every access of one
    happens before the other's first write), for all pairs at once: the count of i's accesses that are not
    ready for j is a product of two 0/1 matrices (a pair at a time was most of a nasnetalarge schedule), taken
    in blocks so that a graph of many thousand tensors needs no more than its n x n booleans."""
    masks = [accesses[t] for t in tensors]
    ready = [ready_of(t) for t in tensors]
    width = max(1, max(m.bit_length() for m in masks + ready))
    a, r = _bit_rows(masks, width), _bit_rows(ready, width)
    n = len(tensors)
    i_then_j = np.empty((n, n), dtype=bool)
    for i0 in range(0, n, _BLOCK):
        rows = a[i0:i0 + _BLOCK].astype(np.float32)
        for j0 in range(0, n, _BLOCK):
            not_ready = 1.0 - r[j0:j0 + _BLOCK].astype(np.float32)
            i_then_j[i0:i0 + _BLOCK, j0:j0 + _BLOCK] = (rows @ not_ready.T) == 0  # exact: counts below 2**24
    return i_then_j | i_then_j.T


def plan_pool_by_size(tensors: list[int], nbytes: dict[int, int], first_write: dict[int, int],
                      accesses: dict[int, int], before: list[int], ready: dict[int, int] | None = None) -> PoolPlan:
    """Largest tensors first; a tensor joins the block that grows least among those whose every
    occupant is happens-before ordered with it (either way). Packs better when sizes vary."""
    order = sorted(tensors, key=lambda t: (-nbytes[t], first_write[t], t))
    if not order:
        return PoolPlan({}, [])
    ordered = ordered_pairs(order, accesses, _ready(first_write, before, ready))
    # blocked[b, j]: some occupant of block b is not ordered with tensor j (rows grow with the blocks)
    blocked = np.zeros((len(order), len(order)), dtype=bool)
    block_sizes: list[int] = []
    block_of: dict[int, int] = {}
    for j, t in enumerate(order):
        best = None
        for b in np.flatnonzero(~blocked[:len(block_sizes), j]).tolist():
            key = (max(block_sizes[b], nbytes[t]) - block_sizes[b], abs(block_sizes[b] - nbytes[t]), b)
            best = key if best is None or key < best else best
        if best is None:
            b = len(block_sizes)
            block_sizes.append(nbytes[t])
        else:
            b = best[2]
            block_sizes[b] = max(block_sizes[b], nbytes[t])
        blocked[b] |= ~ordered[j]
        block_of[t] = b
    return PoolPlan(block_of, block_sizes)


def best_pool_plan(tensors, nbytes, first_write, accesses, before, ready=None) -> PoolPlan:
    """The smaller of the two greedy plans (both are safe under ``before``)."""
    plans = [plan_pool(tensors, nbytes, first_write, accesses, before, ready),
             plan_pool_by_size(tensors, nbytes, first_write, accesses, before, ready)]
    return min(plans, key=lambda p: p.total_bytes)


def no_reuse_bytes(tensors: list[int], nbytes: dict[int, int]) -> int:
    return sum(nbytes[t] for t in tensors)
