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


def plan_pool_by_size(tensors: list[int], nbytes: dict[int, int], first_write: dict[int, int],
                      accesses: dict[int, int], before: list[int], ready: dict[int, int] | None = None) -> PoolPlan:
    """Largest tensors first; a tensor joins the block that grows least among those whose every
    occupant is happens-before ordered with it (either way). Packs better when sizes vary."""
    ready_of = _ready(first_write, before, ready)

    def ordered(a: int, b: int) -> bool:
        return accesses[a] & ~ready_of(b) == 0 or accesses[b] & ~ready_of(a) == 0

    block_sizes: list[int] = []
    occupants: list[list[int]] = []
    block_of: dict[int, int] = {}
    for t in sorted(tensors, key=lambda t: (-nbytes[t], first_write[t], t)):
        best = None
        for b, occ in enumerate(occupants):
            if all(ordered(t, o) for o in occ):
                key = (max(block_sizes[b], nbytes[t]) - block_sizes[b], abs(block_sizes[b] - nbytes[t]), b)
                best = key if best is None or key < best else best
        if best is None:
            block_sizes.append(nbytes[t])
            occupants.append([t])
            block_of[t] = len(block_sizes) - 1
        else:
            b = best[2]
            block_sizes[b] = max(block_sizes[b], nbytes[t])
            occupants[b].append(t)
            block_of[t] = b
    return PoolPlan(block_of, block_sizes)


def best_pool_plan(tensors, nbytes, first_write, accesses, before, ready=None) -> PoolPlan:
    """The smaller of the two greedy plans (both are safe under ``before``)."""
    plans = [plan_pool(tensors, nbytes, first_write, accesses, before, ready),
             plan_pool_by_size(tensors, nbytes, first_write, accesses, before, ready)]
    return min(plans, key=lambda p: p.total_bytes)


def no_reuse_bytes(tensors: list[int], nbytes: dict[int, int]) -> int:
    return sum(nbytes[t] for t in tensors)
