"""DLight's default schedules computed in worker processes, a large module's kernels in parallel.

DLight's rules are Python and take tens of milliseconds a kernel: a cold fp16 build of a 200-kernel CNN spends
10-20 s of its kernel choice in them, one kernel after another, while the GPU machine's other cores wait for the
nvcc runs that follow. A schedule is a function of the PrimFunc, the target and the rules alone
(:class:`.schedules.ScheduleCache` keys it so), so a worker can compute it from the function's JSON and send the
scheduled function's JSON back: the same function this process's rules give (names included, so the CUDA source
and the compiled-kernel cache's keys are the same; a test compares the two).

    pool = process_pool()          # None where this machine has too few cores (or TVM_NIMBLE_JOBS says so)
    pool.warm()                    # workers start importing TVM while the build imports its model
    pool.schedule(texts, target, rules_key, stock, here=schedule_one)   # [PrimFunc or None], in order

The calling thread takes batches of kernels too (``here``), so a module met while the workers still start (each
imports TVM: 6-9 s for 15 of them on an H200's host) is never scheduled slower than in the process alone.

The workers are ``python -m tvm_nimble.relay_passes.schedule_worker`` processes reading one JSON request a line
on stdin and answering one line on stdout, not ``multiprocessing``'s: its spawn start method runs the user's main
script again in every worker (a script that builds at its top level would build again there). A worker that
fails (it died, it answered something else, the rules raised there) gives its share back: those kernels are
scheduled here, as without a pool, and the pool is closed for the rest of the process.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import subprocess
import sys
import threading

import tvm
from tvm_ffi.serialization import from_json_graph_str

from tvm_nimble import env

#: what each worker runs (``python -m``): it reads a request a line and answers a line (see its docstring)
WORKER_MODULE = "tvm_nimble.relay_passes.schedule_worker"
#: workers at most (the machine's cores less one, by ``TVM_NIMBLE_JOBS``); under 2 there is no pool
MAX_WORKERS = 16
#: fewer kernels than this to schedule are scheduled here: a round trip per kernel would not pay
MIN_PARALLEL = 8
#: kernels per request: fewer round trips, still enough requests to keep every worker busy
BATCH = 4


class WorkerError(RuntimeError):
    """A worker could not answer (it died, or answered what this process cannot read)."""


class _Worker:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def ask(self, request: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (OSError, ValueError) as e:
            raise WorkerError(f"schedule worker {self.proc.pid}: {e}") from e
        if not line:
            raise WorkerError(f"schedule worker {self.proc.pid} exited (code {self.proc.poll()})")
        try:
            return json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkerError(f"schedule worker {self.proc.pid} answered {line[:80]!r}") from e

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class SchedulePool:
    """``workers`` worker processes scheduling PrimFuncs with DLight's default rules (see the module's docstring).
    Thread-safe (one :meth:`schedule` at a time has the workers); the workers start on :meth:`warm` or the first
    :meth:`schedule`, and stop on :meth:`close` (at the latest when this process exits)."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"a schedule pool needs at least one worker, got {workers}")
        self.workers = workers
        self.pid = os.getpid()  # a forked child does not share the workers' pipes with its parent: it makes its own
        self._all: list[_Worker] = []
        self._lock = threading.Lock()  # the workers' list
        self._busy = threading.Lock()  # one call at a time
        #: stopped (:meth:`close`), and stopped because a worker failed
        self.closed = self.failed = False

    def warm(self) -> None:
        """Start the workers (each imports TVM and its tensor intrinsics, a second or two) if not started."""
        with self._lock:
            if self._all or self.closed:
                return
            self._all = [_Worker() for _ in range(self.workers)]
            atexit.register(self.close)

    def schedule(self, texts: list[str], target: tvm.target.Target, rules_key: tuple, stock: tuple[str, ...],
                 here=None) -> list:
        """Each of the PrimFuncs for ``target`` whose JSON ``texts`` holds (``tvm.ir.save_json``: the caller has it
        already, for its cache's keys) scheduled by the first of DLight's default rules for ``target`` that applies,
        guarded as :class:`.schedules.GuardedRule` does (``stock`` as there), and marked scheduled; None
        where no rule applies. ``rules_key`` names the rules this process would apply: a worker whose rules differ
        fails.

        ``here``: a function scheduling the PrimFunc of ``texts[i]`` in this process the same way, given ``i``. The
        calling thread then takes batches too, until none is left (while the workers start, it does all the work:
        never slower than scheduling here), and takes back the batches of a worker that fails. Without it, a
        worker's failure raises :class:`WorkerError`. Either way a failure closes the pool."""
        self.warm()
        if self.closed:
            raise WorkerError("the schedule pool is closed")
        payload = {"target": str(target), "rules": list(rules_key), "stock": list(stock)}
        pending: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(0, len(texts), BATCH):
            pending.put(range(i, min(i + BATCH, len(texts))))
        out: list = [None] * len(texts)
        errors: list[BaseException] = []

        def take():
            try:
                return pending.get_nowait()
            except queue.Empty:
                return None

        def drain(worker: _Worker) -> None:
            while (batch := take()) is not None:
                try:
                    reply = worker.ask({**payload, "funcs": [texts[i] for i in batch]})
                    if "error" in reply:
                        raise WorkerError(f"schedule worker {worker.proc.pid}: {reply['error']}")
                    # the worker's own TVM wrote them: parsed without tvm.ir.load_json's schema upgrade of older
                    # versions' JSON (a parse and an indented re-dump in Python, under the GIL; benchmarks/findings.md)
                    done = [None if text is None else from_json_graph_str(text) for text in reply["funcs"]]
                    if len(done) != len(batch):
                        raise WorkerError(f"schedule worker {worker.proc.pid} answered {len(done)} of {len(batch)}")
                except Exception as e:  # noqa: BLE001  (the batch goes back; the caller hears of it below)
                    errors.append(e if isinstance(e, WorkerError) else WorkerError(f"{type(e).__name__}: {e}"))
                    pending.put(batch)
                    return
                for i, after in zip(batch, done):
                    out[i] = after

        with self._busy:
            threads = [threading.Thread(target=drain, args=(w,), daemon=True) for w in self._all]
            for t in threads:
                t.start()
            try:
                while here is not None and (batch := take()) is not None:
                    for i in batch:
                        out[i] = here(i)
            finally:
                for t in threads:
                    t.join()
        if errors:
            self.failed = True
            self.close()
            if here is None:
                raise errors[0]
            logging.getLogger("tvm_nimble").warning("DLight's schedules in this process from now on: %s", errors[0])
            while (batch := take()) is not None:  # given back after this thread had run out of batches
                for i in batch:
                    out[i] = here(i)
        return out

    def close(self) -> None:
        """Stop the workers; :meth:`schedule` fails from then on."""
        with self._lock:
            self.closed = True
            workers, self._all = self._all, []
        for w in workers:
            w.close()


_PROCESS_POOL: SchedulePool | None = None
_PROCESS_LOCK = threading.Lock()


def pool_size() -> int:
    """The workers a process-wide pool gets: ``TVM_NIMBLE_JOBS`` (else the cores) less one, at most
    :data:`MAX_WORKERS`; 0 (no pool) under 2, or where ``NIMBLE_SCHEDULE_POOL=0``."""
    if not env.schedule_pool():
        return 0
    n = min(env.jobs() - 1, MAX_WORKERS)
    return n if n >= 2 else 0


def process_pool() -> SchedulePool | None:
    """This process's pool of :func:`pool_size` workers, or None where that is 0 or the pool failed. Made the first
    time; made again where the size changed (``TVM_NIMBLE_JOBS`` set since) or it was closed without failing."""
    global _PROCESS_POOL
    with _PROCESS_LOCK:
        n = pool_size()
        old = _PROCESS_POOL
        if old is not None and old.pid != os.getpid():
            old = _PROCESS_POOL = None  # made by the process this one was forked from: its workers are the parent's
        if old is not None and old.failed:
            return None
        if old is not None and (old.workers != n or old.closed):
            old.close()
            old = _PROCESS_POOL = None
        if n == 0:
            return None
        if old is None:
            _PROCESS_POOL = SchedulePool(n)
        return _PROCESS_POOL
