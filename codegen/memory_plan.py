"""Storage reuse that stays correct when streams run concurrently.

TVM's ``StaticPlanBlockMemory`` lets a tensor reuse a block once the previous occupant's
last use is *earlier in the program*. With several streams "earlier" means nothing: two
kernels far apart in the launch list may run at the same time. Here a tensor may take over
a block only when every access of the block's previous occupants *happens before* (see
:mod:`codegen.happens_before`) the launch that first writes the new tensor. With a
single-stream relation the same planner reproduces the sequential plan, which is how we
report what concurrency costs in memory.
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


def plan_pool(tensors: list[int], nbytes: dict[int, int], first_write: dict[int, int],
              accesses: dict[int, int], before: list[int]) -> PoolPlan:
    """Assign each tensor to a block.

    ``accesses[t]`` is the bitmask of launches that touch ``t`` (its writer included) and
    ``before`` the happens-before bitsets. Greedy in first-write order, best fit by size,
    growing the largest free block when none is big enough (as TVM does).
    """
    block_sizes: list[int] = []
    block_users: list[int] = []  # union of the access masks of every occupant so far
    block_of: dict[int, int] = {}
    for t in sorted(tensors, key=lambda t: (first_write[t], t)):
        hb = before[first_write[t]]
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


def no_reuse_bytes(tensors: list[int], nbytes: dict[int, int]) -> int:
    return sum(nbytes[t] for t in tensors)
