"""The GPU issue sequence as data: every stream operation a run issues, in host order.

:func:`issue_sequence` builds, once per executor, the exact list that
:func:`tvm_nimble.runtime.cuda_graph.issue` executes (and that a CUDA graph captures):

  fork   the main stream records a start event; every helper stream waits on it
  launch per plan launch, on its stream: wait on its events, the kernel, record its events
  join   every helper stream records a final event; the main stream waits on each

The same list is what the CPU side checks, so nothing the GPU does is left untested on CPU:
:func:`check_sequence` proves from the list alone that it implements the plan (every
planned wait orders its launches, every stream is forked from and joined into the main
stream), and the race simulator (:mod:`tvm_nimble.runtime.race_check`) executes the list
in random legal orders. Drop a wait or the join from the list and both report it.

Semantics (CUDA's): a stream runs its operations in list order; ``cudaStreamWaitEvent``
binds, when it is issued, to the event's most recent record issued before it in host order
(none: the wait is a no-op), and blocks its stream until that record has executed.
"""
from __future__ import annotations

from typing import NamedTuple

WAIT = "wait"
LAUNCH = "launch"
RECORD = "record"
#: Virtual host operations on the main stream around a run (simulator and checker only):
#: the input copies before the sequence, the host's read of the outputs after it.
COPY_IN = "copy_inputs"
READ_OUT = "read_outputs"


class Op(NamedTuple):
    """One stream operation. ``event`` indexes the executor's event list (see :func:`event_count`);
    ``launch`` is the plan launch it belongs to (-1 for fork/join); ``role`` is ``"fork"``,
    ``"sync"`` (a planned event) or ``"join"`` for waits and records."""

    kind: str
    stream: int
    event: int = -1
    launch: int = -1
    role: str = ""

    @property
    def label(self) -> str:
        """How the CUDA call for this op is named in an error."""
        what = "cudaStreamWaitEvent" if self.kind == WAIT else "cudaEventRecord"
        return f"{what}({self.role if self.role != 'sync' else f'launch {self.launch}'})"

    def __str__(self) -> str:
        if self.kind == LAUNCH:
            return f"s{self.stream}: launch {self.launch}"
        if self.kind in (COPY_IN, READ_OUT):
            return f"s{self.stream}: {self.kind}"
        return f"s{self.stream}: {self.kind} e{self.event} ({self.role}{'' if self.launch < 0 else f' of launch {self.launch}'})"


def num_streams(plan, single_stream: bool = False) -> int:
    """How many CUDA streams the sequence uses."""
    return 1 if single_stream else max(plan.num_streams, 1)


def event_count(plan, single_stream: bool = False) -> int:
    """Events the executor creates: the plan's, one join event per helper stream, the fork event last."""
    return plan.num_events + num_streams(plan, single_stream)


def issue_sequence(plan, single_stream: bool = False) -> list[Op]:
    """The operations a run issues, in host order (see the module docstring).

    With ``single_stream`` every launch goes on the main stream and no event is used (the
    baseline Nimble is compared with).
    """
    if single_stream:
        return [Op(LAUNCH, 0, launch=l.idx) for l in plan.launches]
    n = num_streams(plan)
    helpers = sorted({l.stream for l in plan.launches} - {0})
    fork = event_count(plan) - 1
    ops: list[Op] = []
    if n > 1:
        ops.append(Op(RECORD, 0, fork, -1, "fork"))
        ops += [Op(WAIT, s, fork, -1, "fork") for s in helpers]
    for l in plan.launches:
        ops += [Op(WAIT, l.stream, e, l.idx, "sync") for e in l.waits]
        ops.append(Op(LAUNCH, l.stream, -1, l.idx))
        ops += [Op(RECORD, l.stream, e, l.idx, "sync") for e in l.records]
    if n > 1:
        for j, s in enumerate(helpers):
            ops.append(Op(RECORD, s, plan.num_events + j, -1, "join"))
            ops.append(Op(WAIT, 0, plan.num_events + j, -1, "join"))
    return ops


def with_host_ops(ops: list[Op]) -> list[Op]:
    """``ops`` between the host's input copy and its read of the outputs (both on the main stream)."""
    return [Op(COPY_IN, 0)] + list(ops) + [Op(READ_OUT, 0)]


def bind_waits(ops: list[Op]) -> dict[int, int | None]:
    """For every wait (by position in ``ops``): the position of the record it waits for, or None."""
    last_record: dict[int, int] = {}
    bound: dict[int, int | None] = {}
    for k, op in enumerate(ops):
        if op.kind == WAIT:
            bound[k] = last_record.get(op.event)
        elif op.kind == RECORD:
            last_record[op.event] = k
    return bound


def ancestors(ops: list[Op]) -> list[int]:
    """``anc[k]``: bitmask of the ops that complete before op ``k`` starts, on any GPU schedule.

    Edges: stream order, and record -> the wait bound to it; both point forward in host order,
    so one pass in list order closes them transitively.
    """
    bound = bind_waits(ops)
    last_on_stream: dict[int, int] = {}
    anc: list[int] = []
    for k, op in enumerate(ops):
        mask = 0
        prev = last_on_stream.get(op.stream)
        if prev is not None:
            mask |= anc[prev] | (1 << prev)
        rec = bound.get(k)
        if rec is not None:
            mask |= anc[rec] | (1 << rec)
        anc.append(mask)
        last_on_stream[op.stream] = k
    return anc


def check_sequence(plan, ops: list[Op], single_stream: bool = False) -> list[str]:
    """Problems that make ``ops`` a wrong way to run ``plan`` (empty: it implements the plan).

    Checked on every GPU schedule the list allows (the plan itself is checked for races by
    ``codegen.checker``): each launch is issued once, on its stream, in the plan's stream order;
    every wait binds to an earlier record; every launch comes after the run's start (the input
    copies, the previous run) on the main stream; every launch a planned event orders before
    another is ordered before it; every stream's work is joined into the main stream before the
    run ends (the host reads outputs, a graph capture ends).
    """
    problems: list[str] = []
    full = with_host_ops(ops)
    start, end = 0, len(full) - 1
    for k, rec in bind_waits(full).items():
        if rec is None:
            problems.append(f"op {k - 1} ({full[k]}) waits on event e{full[k].event} before any record of it "
                            "is issued: it waits for nothing")
    anc = ancestors(full)
    pos: dict[int, int] = {}
    for k, op in enumerate(full):
        if op.kind == LAUNCH:
            if op.launch in pos:
                problems.append(f"launch {op.launch} is issued twice")
            pos[op.launch] = k
    recorder = plan.recorder_of_event()
    for l in plan.launches:
        want = 0 if single_stream else l.stream
        k = pos.get(l.idx)
        if k is None:
            problems.append(f"launch {l.idx} ({l.kernel}) is never issued")
            continue
        if full[k].stream != want:
            problems.append(f"launch {l.idx} is issued on stream {full[k].stream}, the plan puts it on {want}")
        if not anc[k] >> start & 1:
            problems.append(f"launch {l.idx} (stream {full[k].stream}) may start before the run begins: its stream "
                            "is not forked from the main stream (it may read inputs still being copied)")
        if not single_stream:
            for e in l.waits:
                j = pos.get(recorder.get(e, -1))
                if j is not None and not anc[k] >> j & 1:
                    problems.append(f"launch {l.idx} may start before launch {recorder[e]}, which it waits for "
                                    f"(event e{e}): the wait is missing")
    by_stream: dict[int, list[int]] = {}
    for k, op in enumerate(full):
        if op.kind == LAUNCH:
            by_stream.setdefault(op.stream, []).append(op.launch)
    for s, order in by_stream.items():
        if order != sorted(order):
            problems.append(f"stream {s} issues launches {order}, not in plan order")
    last: dict[int, int] = {}
    for k, op in enumerate(full[:-1]):
        last[op.stream] = k
    for s, k in sorted(last.items()):
        if s != 0 and not anc[end] >> k & 1:
            problems.append(f"stream {s} is not joined into the main stream: its last op ({full[k]}) may still "
                            "run when the host reads the outputs (and a CUDA graph capture is left unjoined)")
    return problems
