"""Greedy decoding with the host one step behind the device.

A decode step's inputs follow from the step before: its token ids are that step's ``next_ids`` output, its positions
one more, its mask one more slot. So the next step's inputs are made *on the device*, queued behind the step that
produces them, and the next step is queued before the host reads this one's tokens: the host's part of a token
(reading it, the stop check, the callback, queuing the next step) runs while the device computes, instead of between
two steps. The price: when a request stops, the one step queued past its end ran for nothing (its cache slot is
past the request's tokens, and the next request's prefill rewrites the mask).

:class:`StepFeed` does this with TVM tensor copies, each finished before the next (the CPU, where it changes no
timing but runs the same loop); :class:`CudaStepFeed` queues the copies on the step's CUDA stream (page-locked host
buffers, one event a step), so nothing waits but the read of a step's tokens.
"""
from __future__ import annotations

import numpy as np

#: steps whose tokens may be in flight at once: a ring of host slots this long is reused safely (the loop reads a
#: step's tokens before it queues the step two after it)
RING = 4


def decode_inputs(rows: int, max_length: int, tokens: list[int], positions: list[int]) -> tuple:
    """A decode step's inputs (ids [rows, 1], mask [rows, max_length], positions [rows, 1], int64) from the host:
    row ``r`` the token ``tokens[r]`` at ``positions[r]``, the mask's slots ``0..positions[r]``; rows past
    ``tokens`` token 0 at position 0 (slot 0 unmasked: a row the batch does not use)."""
    ids = np.zeros((rows, 1), np.int64)
    pos = np.zeros((rows, 1), np.int64)
    mask = np.zeros((rows, max_length), np.int64)
    mask[:, 0] = 1
    for r, (t, p) in enumerate(zip(tokens, positions)):
        ids[r, 0], pos[r, 0] = t, p
        mask[r, :p + 1] = 1
    return ids, mask, pos


class StepFeed:
    """Feeds an executor of a decode step (inputs ``input_ids [rows, 1]``, ``attention_mask [rows, max_length]``,
    ``position_ids [rows, 1]``; output 0 ``next_ids [rows, 1]``), every copy done before the call returns."""

    def __init__(self, executor):
        self.ex = executor
        self.ids, self.mask, self.positions = executor.input_views()
        self.next_ids = executor.output_views()[0]
        self.rows, self.max_length = (int(d) for d in self.mask.shape)
        self._tokens: dict[int, np.ndarray] = {}

    def first(self, tokens: list[int], positions: list[int]) -> None:
        """The first step's inputs from the host (:func:`decode_inputs`)."""
        ids, mask, pos = decode_inputs(self.rows, self.max_length, tokens, positions)
        for view, value in ((self.ids, ids), (self.mask, mask), (self.positions, pos)):
            view.copyfrom(value)
        self._mask = mask

    def advance(self, step: int, positions: list[int]) -> None:
        """The inputs of the step to be launched as ``step`` from the one before: its next ids as the token ids,
        ``positions`` (one per row that generates), the mask's slot at each of them set."""
        self.next_ids.copyto(self.ids)
        pos = np.zeros((self.rows, 1), np.int64)
        for r, p in enumerate(positions):
            pos[r, 0] = p
            self._mask[r, p] = 1
        self.positions.copyfrom(pos)
        self.mask.copyfrom(self._mask)

    def launch(self, step: int) -> None:
        """Run the step on the inputs made so far; its next ids become :meth:`tokens` ``(step)``."""
        self.ex.replay()
        self._tokens[step % RING] = self.next_ids.numpy()

    def tokens(self, step: int) -> list[int]:
        """The next token id of each row from the step launched as ``step`` (waits for it)."""
        return [int(x) for x in self._tokens[step % RING][:, 0]]

    def finish(self) -> None:
        """Wait until every step launched has run (the executor is idle after)."""

    def close(self) -> None:
        pass


class CudaStepFeed(StepFeed):
    """:class:`StepFeed` with every copy queued on the executor's CUDA stream: the positions and the mask's ones
    from page-locked host memory, the ids from the step before on the device, each step's next ids into a host slot
    and an event after them. Only :meth:`tokens` waits."""

    def __init__(self, executor):
        from . import cuda_graph as cg

        super().__init__(executor)
        self._cg = cg
        self.stream = executor.main_stream
        self._ids_bytes = self.rows * 8
        self._positions = cg.PinnedArray((RING, self.rows), np.int64)
        self._next = cg.PinnedArray((RING, self.rows), np.int64)
        self._one = cg.PinnedArray((1,), np.int64)
        self._one.array[0] = 1
        self._events = cg.create_events(RING)

    # first(): the base class's synchronous copies (the executor is idle between requests)

    def advance(self, step, positions) -> None:
        cg = self._cg
        cg.copy_async(self.ids.data_ptr(), self.next_ids.data_ptr(), self._ids_bytes, self.stream)
        slot = step % RING
        host = self._positions.array[slot]
        host[:] = 0
        host[:len(positions)] = positions
        cg.copy_async(self.positions.data_ptr(), self._positions.address(slot * self.rows), self._ids_bytes,
                      self.stream)
        base = self.mask.data_ptr()
        for r, p in enumerate(positions):
            cg.copy_async(base + 8 * (r * self.max_length + p), self._one.address(), 8, self.stream)

    def launch(self, step: int) -> None:
        cg = self._cg
        slot = step % RING
        self.ex.enqueue()
        cg.copy_async(self._next.address(slot * self.rows), self.next_ids.data_ptr(), self._ids_bytes, self.stream)
        cg.record(self._events[slot], self.stream)

    def tokens(self, step: int) -> list[int]:
        slot = step % RING
        self._cg.wait_event(self._events[slot])
        return [int(x) for x in self._next.array[slot]]

    def finish(self) -> None:
        self.ex.sync()

    def close(self) -> None:
        self._cg.destroy_events(self._events)
        for buf in (self._positions, self._next, self._one):
            buf.close()


def feed_for(executor) -> StepFeed:
    """The feed for ``executor``: queued CUDA copies on a GPU, TVM tensor copies on the CPU."""
    return CudaStepFeed(executor) if executor.main_stream is not None else StepFeed(executor)


def greedy(feed: StepFeed, tokens: list[int], positions: list[int], steps: int, deliver) -> None:
    """Up to ``steps`` decode steps after the prefill: the first on ``tokens`` (one per generating row) at
    ``positions``, each next one on the step before's tokens at one position more, queued before that step's tokens
    are read. ``deliver(tokens)`` gets each step's tokens in order (one per generating row) and says whether the
    request goes on; the loop stops at ``False`` or after ``steps``, and returns once the device is idle."""
    if steps < 1:
        return
    feed.first(tokens, positions)
    feed.launch(0)
    launched = 1
    try:
        for step in range(steps):
            if launched < steps:  # the next step queued before this one's tokens are read
                positions = [p + 1 for p in positions]
                feed.advance(launched, positions)
                feed.launch(launched)
                launched += 1
            if not deliver(feed.tokens(step)):
                return
    finally:
        feed.finish()
