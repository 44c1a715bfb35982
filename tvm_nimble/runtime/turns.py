"""Whose turn it is: the graph-executor calls ``set_input``/``run``/``get_output`` of one executor belong
to one thread at a time.

``ex(*inputs)`` is thread-safe (one call sets, runs and reads under the executor's lock). The three
graph-executor calls keep state between calls, so a second thread calling them while another thread is
between its ``set_input``/``run`` and its ``get_output`` gets a :class:`ConcurrentUseError`, and so does a
thread whose inputs or outputs another thread's run has overwritten meanwhile. Nothing is read that no run
produced: ``get_output`` before the first ``run``, or ``run`` before every input was set once, raise
:class:`NotReadyError`. :class:`Turns` keeps that bookkeeping for both executors (one plan, batch buckets);
its methods are called under the executor's lock.
"""
from __future__ import annotations

import threading

from tvm_nimble.errors import NimbleError

#: How a thread-safety error names the fix.
FIX = ("use one executor per thread, tvm_nimble.runtime.pool.NimblePool, or ex(*inputs), which is thread-safe "
       "and returns outputs the caller owns")


class NotReadyError(NimbleError):
    """An output was read before any run, or a run started before every input was set."""


class ConcurrentUseError(NimbleError):
    """``set_input``/``run``/``get_output`` of one executor were interleaved across threads."""


def _thread_name(t) -> str:
    return f"thread {t.name!r}" if t is not None else "another thread"


class Turns:
    """Who set each of ``names`` (the inputs) last, who ran last, and which thread is mid-sequence."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.setter: list = [None] * len(names)
        self.inputs_by = None  # the thread that set every input, if one did
        self.has_result = False
        self.last_runner = None  # the thread whose run the outputs hold
        self.owner = None  # the thread between its set_input/run and its get_output, if any
        self.local = threading.local()  # per thread: set_any (it set an input), ran (it ran this executor)

    def claim(self, me, what: str) -> None:
        """``me`` starts or continues a set_input/run/get_output sequence; refuse if another thread is mid-way."""
        owner = self.owner
        if owner is not None and owner is not me and owner.is_alive():
            raise ConcurrentUseError(f"{what} from {_thread_name(me)} while {_thread_name(owner)} is between its "
                                     f"set_input/run and get_output on the same NimbleExecutor: {FIX}")
        self.owner = me

    def input_set(self, i: int, me) -> None:
        """``me`` has just (over)written input ``i``."""
        self.setter[i] = me
        self.inputs_by = me if all(s is me for s in self.setter) else None
        self.local.set_any = True

    def check_run(self, me) -> None:
        """Before ``me``'s ``run()``: every input set, and none that ``me`` set overwritten by another thread."""
        if self.owner is not me:
            self.claim(me, "run")
        if self.inputs_by is me:  # (fast path: this thread set every input)
            return
        if None in self.setter:
            missing = [n for n, s in zip(self.names, self.setter) if s is None]
            raise NotReadyError(f"run() before set_input: input(s) {missing} were never set, so the kernels would "
                                "read uninitialized memory; call set_input(name, value) for each input first "
                                "(or ex(*inputs))")
        if getattr(self.local, "set_any", False):  # this thread set inputs: all must still be its own
            other = next((s for s in self.setter if s is not me), None)
            if other is not None:
                self.owner = None
                raise ConcurrentUseError(f"run() from {_thread_name(me)}: the inputs it set were overwritten by "
                                         f"{_thread_name(other)} since; {FIX}")

    def ran(self, me) -> None:
        """The outputs now hold ``me``'s run (another thread's earlier outputs are gone)."""
        if self.last_runner is not me:
            self.last_runner = me
            self.local.ran = True
        self.has_result = True

    def check_output(self, me) -> None:
        """Before ``me``'s ``get_output()``: a run produced the outputs, and they are ``me``'s to read."""
        if not self.has_result:
            raise NotReadyError("get_output() before any run(): the output buffers hold no result yet; call "
                                "set_input(...) for every input and run() first (or ex(*inputs))")
        owner = self.owner
        ran = self.last_runner is me or getattr(self.local, "ran", False)
        if ran and self.last_runner is not me:
            raise ConcurrentUseError(f"get_output() from {_thread_name(me)}: the outputs of its run() were "
                                     f"overwritten by a later run from {_thread_name(self.last_runner)}; {FIX}")
        if not ran and owner is not None and owner is not me and owner.is_alive():
            raise ConcurrentUseError(f"get_output() from {_thread_name(me)}, which never ran this executor, while "
                                     f"{_thread_name(owner)} is between its set_input/run and get_output; {FIX}")

    def release(self, thread) -> None:
        """``thread``'s sequence is complete (it read its outputs, made a call, or a pool took the executor back)."""
        if self.owner is thread:
            self.owner = None
