"""A small dynamic batcher: requests from many threads gathered into one bucketed run.

    batcher = Batcher("model.nimble", max_delay_ms=2)        # a model built with batch_sizes
    y = batcher(x)[0]                                         # from any thread: x's rows, x's outputs
    future = batcher.submit(x)                                # or asynchronously: future.result()

A request is any number of rows (the leading dimension of every input). A worker takes the oldest
waiting request, then gathers the ones behind it, in arrival order, until the batch holds the
largest bucket's rows or ``max_delay_ms`` have passed since that oldest request arrived, and runs
them as one batch (:class:`~tvm_nimble.runtime.bucketed.BucketedExecutor`: the smallest bucket that
holds it, padded). Each caller gets exactly its own rows of every output, in order. A request never
straddles two runs: one that would overflow the batch waits for the next, and one larger than the
largest bucket runs alone, split. Over a :class:`~tvm_nimble.runtime.pool.NimblePool` there is one
worker per replica, so batches run side by side; over one executor, one at a time. A worker gathers as
soon as its executor is free, so a backlog (requests whose delay is over) leaves at once in runs of the
largest bucket. Before the first request every bucket of every executor has run once (``warm``).

A model built for one batch size works too (a one-bucket model: every batch padded to it), which is
the fixed-batch baseline of a latency comparison. So does any function of stacked numpy inputs that
returns outputs with one row per input row (``Batcher(fn, max_batch=32)``: e.g. a PyTorch model
replayed as CUDA graphs, to compare engines behind the same batcher).
"""
from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future

import numpy as np

from tvm_nimble.errors import NimbleError, ShapeError

from .bucketed import BucketedExecutor
from .executor import Executor
from .inputs import InputError, refuse_non_finite
from .pool import NimblePool


class _Request:
    __slots__ = ("inputs", "rows", "future", "arrival")

    def __init__(self, inputs, rows, arrival):
        self.inputs = inputs
        self.rows = rows
        self.future = Future()
        self.arrival = arrival


class Batcher:
    """Gathers requests from many threads into bucketed runs (see the module docstring).

    ``model``: a :class:`NimblePool` (one worker per replica), an executor (``tvm_nimble.NimbleExecutor``), or
    what they load (a module or an artifact path; then ``replicas`` executors are made, default 1); or a function
    ``fn(*inputs) -> outputs`` of numpy arrays stacked along the first axis whose outputs have one row per
    input row (sliced per request with ``out[a:b]``, so they must not be reused buffers), called from one
    worker; it needs ``max_batch``.
    ``max_delay_ms``: the longest a request waits for others before its batch runs (0: run what has
    arrived). ``max_batch``: the most rows gathered into one run (default: the largest bucket).
    ``to_numpy``: each request's outputs as numpy arrays (one copy of the run's outputs to the host, then
    a slice per request) instead of TVM tensors on the model's device.
    ``warm``: before taking requests, run every bucket of every executor once (:meth:`BucketedExecutor.warm`),
    so that no request pays a bucket's first use (a function is the caller's to warm).
    ``check_inputs``: as the executor's (index inputs within their tables). ``check_finite``: a request
    holding a NaN or an infinity is refused in its caller's thread (the executor's option, checked per
    request, so that one bad request does not fail the others gathered with it).
    ``stats`` counts requests, rows and runs (``batches`` lists each run's rows).
    """

    def __init__(self, model, max_delay_ms: float = 2.0, max_batch: int | None = None, replicas: int | None = None,
                 check_inputs: bool = True, to_numpy: bool = False, warm: bool = True, check_finite: bool = False):
        if not isinstance(max_delay_ms, (int, float)) or isinstance(max_delay_ms, bool) or max_delay_ms < 0:
            raise ValueError(f"max_delay_ms must be a number >= 0, got {max_delay_ms!r}")
        self._owned = None
        self.to_numpy = bool(to_numpy)
        self.check_finite = bool(check_finite)
        self._fn = None
        self.plan = None
        if callable(model) and not isinstance(model, (NimblePool, Executor, BucketedExecutor)):
            if max_batch is None:
                raise ValueError("a Batcher over a function needs max_batch (the most rows it takes at once)")
            self._fn = model
        elif isinstance(model, (NimblePool, Executor, BucketedExecutor)):
            self._target = model
        else:
            self._target = self._owned = NimblePool(model, replicas=replicas or 1, check_inputs=check_inputs)
        if self._fn is not None:
            workers, probe = 1, None
        elif isinstance(self._target, NimblePool):
            workers = self._target.replicas
            probe = self._target._executors[0]
        else:
            workers, probe = 1, self._target
        if isinstance(probe, Executor):  # a model built for one batch: serve it as a one-bucket model
            if self._owned is not None:
                self._owned.close()
            pool = self._target if isinstance(self._target, NimblePool) else None
            module = (pool or probe).module
            from .module import from_fixed

            self._target = self._owned = NimblePool(from_fixed(module), replicas=workers, check_inputs=check_inputs)
            probe = self._target._executors[0]
        if probe is not None:
            self.plan = probe.plan
            if probe.batch_sizes is None:  # buckets over named dimensions (build(..., buckets=...))
                dims = ", ".join(d.name for d in probe.module.space.dims)
                raise NimbleError(f"this model's buckets are over named dimensions ({dims}), and a Batcher stacks "
                                  "requests as rows of one batch: build it with batch_sizes=[...] to batch requests, "
                                  "or call its executor once per request")
        self.batch_sizes = list(probe.batch_sizes) if probe is not None else None
        self.max_batch = probe.max_batch if max_batch is None else int(max_batch)
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        self.max_delay = max_delay_ms / 1000.0
        self._slots = None if self.plan is None else [
            (self.plan.tensors[t].shape[1:], self.plan.tensors[t].dtype, self.plan.tensors[t].name)
            for t in self.plan.inputs]
        self._queue: collections.deque[_Request] = collections.deque()
        self._queued = 0  # rows in the queue
        self._cv = threading.Condition()
        self._gather = threading.Lock()  # one worker gathers at a time
        self._closed = False
        self.stats = {"requests": 0, "rows": 0, "runs": 0, "batches": []}
        if warm and self._fn is None:
            for ex in (self._target._executors if isinstance(self._target, NimblePool) else [self._target]):
                ex.warm()
        self._workers = [threading.Thread(target=self._work, name=f"nimble-batcher-{i}", daemon=True)
                         for i in range(workers)]
        for w in self._workers:
            w.start()

    # ---- callers -------------------------------------------------------------------------------------
    def _inputs(self, inputs, named) -> tuple[list[np.ndarray], int]:
        if self._slots is None:  # a function: positional numpy inputs, any shapes
            if named or not inputs:
                raise InputError("a Batcher over a function takes its inputs positionally")
            arrays = [np.asarray(v) for v in inputs]
            return arrays, self._rows_of(arrays)
        names = [name for _, _, name in self._slots]
        if len(inputs) + len(named) != len(names):
            raise InputError(f"the model takes {len(names)} input(s) {names}, got {len(inputs) + len(named)}")
        values = list(inputs) + [None] * (len(names) - len(inputs))
        for key, value in named.items():
            if key not in names:
                raise InputError(f"unknown input {key!r}; the model's inputs are {names}")
            i = names.index(key)
            if values[i] is not None:
                raise InputError(f"input {key!r} given twice")
            values[i] = value
        arrays = []
        for value, (rest, dtype, name) in zip(values, self._slots):
            arr = value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else np.asarray(value)
            if arr.ndim != len(rest) + 1 or list(arr.shape[1:]) != list(rest):
                raise ShapeError(f"input {name!r} has shape {list(arr.shape)}; the model takes rows shaped {rest} "
                                 f"(a request is [N, {', '.join(map(str, rest))}])")
            if str(arr.dtype) != dtype:
                raise InputError(f"input {name!r} has dtype {arr.dtype}, the model expects {dtype}; cast it first")
            if self.check_finite:
                refuse_non_finite(name, arr)
            arrays.append(arr)
        return arrays, self._rows_of(arrays)

    @staticmethod
    def _rows_of(arrays) -> int:
        rows = {a.shape[0] if a.ndim else 0 for a in arrays}
        if len(rows) != 1 or 0 in rows:
            raise InputError(f"a request needs the same number of rows (at least one) in every input, got "
                             f"{[a.shape[0] if a.ndim else 0 for a in arrays]}")
        return rows.pop()

    def submit(self, *inputs, **named) -> Future:
        """Queue one request of N rows; the future's result is the list of its outputs (N rows each, TVM
        tensors the caller owns). Bad inputs raise here, in the caller's thread."""
        arrays, rows = self._inputs(inputs, named)
        req = _Request(arrays, rows, time.perf_counter())
        with self._cv:
            if self._closed:
                raise NimbleError("this Batcher is closed; create a new one")
            self._queue.append(req)
            before, self._queued = self._queued, self._queued + rows
            self.stats["requests"] += 1
            self.stats["rows"] += rows
            # the one gathering worker waits for a first request, then for a full batch (or its delay)
            if before == 0 or (before < self.max_batch <= self._queued):
                self._cv.notify()
        return req.future

    def __call__(self, *inputs, timeout: float | None = None, **named) -> list:
        """Run one request and wait for its outputs."""
        return self.submit(*inputs, **named).result(timeout)

    # ---- workers -------------------------------------------------------------------------------------
    def _next_batch(self) -> list[_Request] | None:
        """The oldest request and those behind it that fit, once the batch is full or its delay is over;
        None when the batcher is closed and nothing is left. The worker calls it as soon as its executor is
        free: a backlog (the oldest request's delay over, or a full batch queued) leaves at once, in runs of
        ``max_batch`` rows."""
        with self._cv:
            while not self._queue:
                if self._closed:
                    return None
                self._cv.wait()
            deadline = self._queue[0].arrival + self.max_delay
            while not self._closed and self._queued < self.max_batch:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cv.wait(left)
            batch = [self._queue.popleft()]
            rows = batch[0].rows
            while self._queue and rows + self._queue[0].rows <= self.max_batch:
                rows += self._queue[0].rows
                batch.append(self._queue.popleft())
            self._queued -= rows
            return batch

    def _work(self) -> None:
        staging: dict = {}  # this worker's host buffers for gathered inputs (max_batch rows each), made once
        while True:
            with self._gather:
                batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run(batch, staging)
            except BaseException as err:  # noqa: BLE001  (each caller gets the error)
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(err)

    def _gathered(self, batch: list[_Request], rows: int, staging: dict) -> list[np.ndarray]:
        """The batch's inputs stacked: one request's as they are; several copied into the worker's staging
        buffers (no allocation per run), which the executor copies to the device before the next run. A
        function gets fresh arrays (it may keep them)."""
        if len(batch) == 1:
            return batch[0].inputs
        out = []
        for i in range(len(batch[0].inputs)):
            parts = [r.inputs[i] for r in batch]
            if self._fn is not None:
                out.append(np.concatenate(parts))
                continue
            buf = staging.get(i)
            if buf is None:
                rest, dtype, _ = self._slots[i]
                buf = staging[i] = np.empty((self.max_batch, *rest), dtype)
            out.append(np.concatenate(parts, out=buf[:rows]))
        return out

    def _run(self, batch: list[_Request], staging: dict) -> None:
        import tvm

        from .buckets import row_view

        rows = sum(r.rows for r in batch)
        inputs = self._gathered(batch, rows, staging)
        if self._fn is not None:
            outs = list(self._fn(*inputs))
            results = [[] for _ in batch]
            for out in outs:
                if out.shape[0] != rows:
                    raise NimbleError(f"the batched function returned {out.shape[0]} rows for {rows}: it must "
                                      "return one row per input row")
                start = 0
                for k, r in enumerate(batch):
                    results[k].append(out[start:start + r.rows])
                    start += r.rows
            self._done(batch, rows, results)
            return
        with self._executor() as ex:
            outs = ex(*inputs, copy=False)  # views of the bucket's buffers until the next run of ``ex``
            results = [[] for _ in batch]
            if self.to_numpy:
                outs = [out.numpy() for out in outs]  # the run's rows, on the host once
                for out in outs:
                    start = 0
                    for k, r in enumerate(batch):
                        results[k].append(out[start:start + r.rows])
                        start += r.rows
                outs = []
            for out, t in zip(outs, self.plan.outputs):
                slot = self.plan.tensors[t]
                row_bytes = slot.nbytes // slot.shape[0]
                start = 0
                for k, r in enumerate(batch):
                    part = row_view(out, start, r.rows, row_bytes)
                    fresh = tvm.runtime.empty(part.shape, part.dtype, ex.device)
                    part.copyto(fresh)
                    results[k].append(fresh)
                    start += r.rows
        self._done(batch, rows, results)

    def _done(self, batch: list[_Request], rows: int, results: list) -> None:
        with self._cv:
            self.stats["runs"] += 1
            self.stats["batches"].append(rows)
        for r, res in zip(batch, results):
            r.future.set_result(res)

    def _executor(self):
        if isinstance(self._target, NimblePool):
            return self._target.executor()
        import contextlib

        @contextlib.contextmanager
        def held():
            with self._target._lock:  # the views stay this batch's until its rows are copied out
                yield self._target

        return held()

    # ---- lifetime ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop taking requests, finish the queued ones, stop the workers (and close a pool it made)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for w in self._workers:
            if w is not threading.current_thread():
                w.join()
        if self._owned is not None:
            self._owned.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"Batcher({'buckets=' + str(self.batch_sizes) if self.batch_sizes else 'a function'}, max_batch={self.max_batch}, "
                f"max_delay_ms={self.max_delay * 1000:g}, workers={len(self._workers)})")

