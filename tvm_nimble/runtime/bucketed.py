"""BucketedExecutor: a model built with ``batch_sizes`` served at any batch size (see :mod:`.buckets`).

It holds one :class:`~tvm_nimble.runtime.executor.Executor` per bucket, over buffers it allocates once: the
weights (each distinct constant once, shared by every bucket) and one allocation for the buckets' inputs,
outputs and memory pools (one bucket runs at a time). A call checks its inputs as a plain executor does
(names, dtypes, index ranges, ``check_finite``; any number of rows), copies each run's rows into the
bucket's input buffers, pads the rest of the bucket with zeros (a device-to-device copy from zero rows
kept there), replays the bucket, and returns the caller's rows of every output.
"""
from __future__ import annotations

import threading
from threading import current_thread

import numpy as np

from tvm_nimble.errors import NimbleError

from .buckets import SharedWorkspace, arena_layout, max_padding, row_view, shared_constant_storages
from .device import device_for, tensor_at
from .executor import Executor, owned_copy
from .inputs import ChecksInputs, InputError, InputRules
from .module import BucketedModule, NimbleModule, from_fixed
from .turns import Turns


class BucketedExecutor(ChecksInputs):
    """The executor of a model built with ``batch_sizes``: ``ex(*inputs)`` takes any number of rows (the
    leading dimension of every input) and returns that many rows of every output, in order. ``module`` is a
    :class:`~tvm_nimble.runtime.module.BucketedModule`, or a module built for one batch size, which becomes
    a one-bucket model (:func:`~tvm_nimble.runtime.module.from_fixed`). ``tvm_nimble.NimbleExecutor(...)``
    of a bucketed model or artifact returns one. The options are :class:`Executor` 's.

    ``ex(*inputs, split=False)`` refuses a batch over the largest bucket instead of splitting it;
    ``copy=False`` returns views of the bucket's output buffers (valid until the next run) when one run
    serves the batch. ``set_input`` / ``run`` / ``get_output`` work as on a plain executor (the inputs are
    kept until the run, which splits and pads like a call). ``stats`` counts runs, rows and padded rows
    (and :meth:`warm` 's runs apart).
    """

    def __init__(self, module: NimbleModule, device=None, mode: str | None = None, check_inputs: bool = True,
                 check_finite: bool = False):
        import tvm

        self._closed = False
        self._buckets: dict[int, Executor] = {}
        self._arena = None
        self._weights_dev: dict[str, object] = {}
        self._pad_zeros: list = []  # per input: max_padding() zero rows on the device, what padding copies
        if not isinstance(module, BucketedModule):
            module = from_fixed(module)
        self.module = module
        self.plan = module.plan
        self.batch_sizes = module.batch_sizes
        self.max_batch = module.max_batch
        self.device = device_for(self.plan.target, device)
        self._rules = InputRules(self.plan, self.device, check_inputs, check_finite, tuple(self.batch_sizes))
        self._lock = threading.RLock()
        self._turns = Turns(self.plan.input_names)
        self._pending: dict[int, object] = {}  # input index -> prepared value, until the run
        self._results: list | None = None
        self.stats = {"calls": 0, "runs": 0, "rows": 0, "padded_rows": 0, "warm_runs": 0}
        try:
            names, weights = module.shared_weights()
            layouts = {b: arena_layout(m.plan) for b, m in module.buckets.items()}
            self.pool_bytes = max(total for _, total in layouts.values())
            self._arena = tvm.runtime.empty((max(self.pool_bytes, 1),), "uint8", self.device)
            for b, bucket in module.buckets.items():
                ws = self._workspace(bucket.plan, layouts[b][0], names[b], weights)
                self._buckets[b] = Executor(bucket, self.device, mode, check_inputs, None, check_finite, workspace=ws)
            self.mode = self._buckets[self.max_batch].mode
            # per bucket: each input's and output's bytes per row (what row views and padding need)
            self._row_bytes = {b: ([ex.plan.tensors[t].nbytes // b for t in ex.plan.inputs],
                                   [ex.plan.tensors[t].nbytes // b for t in ex.plan.outputs])
                               for b, ex in self._buckets.items()}
            pad = max_padding(self.batch_sizes)
            for t in self.plan.inputs if pad else ():
                slot = self.plan.tensors[t]
                zeros = tvm.runtime.empty((pad, *slot.shape[1:]), slot.dtype, self.device)
                zeros.copyfrom(np.zeros((pad, *slot.shape[1:]), dtype=slot.dtype))
                self._pad_zeros.append(zeros)
        except BaseException:
            self.close()
            raise

    # ---- buffers -----------------------------------------------------------------------------------------
    def _workspace(self, plan, offsets: dict[int, int], names: dict[str, str], weights: dict) -> SharedWorkspace:
        """A bucket's buffers: its inputs, outputs and pool in the shared allocation, each whole-constant
        storage the shared weight buffer, other constant storages its own; constants loaded, inputs zeroed."""
        import tvm

        shared = shared_constant_storages(plan, names)
        storages = []
        for s in plan.storages:
            size = (max(s.nbytes, 1),)
            if s.id in offsets:
                storages.append(tensor_at(self._arena, size, "uint8", offsets[s.id]))
            elif s.id in shared:
                storages.append(self._weight_buffer(shared[s.id], s, plan, weights))
            else:  # a constant storage that is not one whole constant: the bucket's own, loaded below
                storages.append(tvm.runtime.empty(size, "uint8", self.device))
        ws = SharedWorkspace(plan, self.device, storages)
        for c in plan.constants:
            if plan.tensors[c].storage not in shared:
                ws.tensors[c].copyfrom(np.asarray(weights[names[f"c{c}"]], order="C"))
        for s in plan.storages:  # inputs read zeros, not another bucket's leftovers, in the GPU warm-up run
            if s.kind == "input":
                storages[s.id].copyfrom(np.zeros(max(s.nbytes, 1), "uint8"))
        return ws

    def _weight_buffer(self, name: str, storage, plan, weights: dict):
        """The device buffer of weight ``name``, allocated and loaded on first use."""
        import tvm

        if name not in self._weights_dev:
            buf = tvm.runtime.empty((max(storage.nbytes, 1),), "uint8", self.device)
            t = next(plan.tensors[c] for c in plan.constants if plan.tensors[c].storage == storage.id)
            tensor_at(buf, t.shape, t.dtype, 0).copyfrom(np.asarray(weights[name], order="C"))
            self._weights_dev[name] = buf
        return self._weights_dev[name]

    @property
    def weight_buffers(self) -> int:
        """How many weight buffers this executor holds on the device (each distinct constant once)."""
        return len(self._weights_dev)

    def bucket(self, batch: int) -> Executor:
        """The executor of the bucket for batch size ``batch``; it shares this executor's buffers, so use it
        only while nothing else runs this executor."""
        if batch not in self._buckets:
            raise InputError(f"no bucket for batch {batch}: the buckets are {self.batch_sizes}")
        return self._buckets[batch]

    # ---- runs --------------------------------------------------------------------------------------------
    def get_num_inputs(self) -> int:
        return len(self.plan.inputs)

    def get_num_outputs(self) -> int:
        return len(self.plan.outputs)

    def chunks(self, n: int) -> list[tuple[int, int, int]]:
        """(first row, rows, bucket) of each run that serves ``n`` rows: runs of the largest bucket while more
        rows than it remain, then the smallest bucket that holds the rest."""
        out, start = [], 0
        while n - start > self.max_batch:
            out.append((start, self.max_batch, self.max_batch))
            start += self.max_batch
        out.append((start, n - start, self.bucket_for(n - start)))
        return out

    def bucket_for(self, rows: int) -> int:
        """The bucket a run of ``rows`` rows takes: the smallest that holds them (the largest for more)."""
        return min((b for b in self.batch_sizes if b >= rows), default=self.max_batch)

    def _batch_of(self, prepared: list) -> int:
        rows = [int(src.shape[0]) for src in prepared]
        if len(set(rows)) != 1:
            raise InputError("the inputs disagree on the batch size: " +
                             ", ".join(f"{n!r} has {r} rows" for n, r in zip(self.plan.input_names, rows)))
        if rows[0] < 1:
            raise InputError("the batch is empty (0 rows): give at least one row")
        return rows[0]

    def _copy_rows(self, bucket: Executor, prepared: list, start: int, rows: int, batch: int) -> None:
        for i, (src, dst, row_bytes) in enumerate(zip(prepared, bucket.input_views(), self._row_bytes[batch][0])):
            head = row_view(dst, 0, rows, row_bytes)
            if isinstance(src, np.ndarray):
                head.copyfrom(src[start:start + rows])
            else:
                row_view(src, start, rows, row_bytes).copyto(head)
            if rows < batch:  # the padded rows: zeros (a device-to-device copy), whatever an earlier run left there
                row_view(self._pad_zeros[i], 0, batch - rows, row_bytes).copyto(
                    row_view(dst, rows, batch - rows, row_bytes))

    def _run_rows(self, prepared: list, n: int, copy: bool, split: bool) -> list:
        """Serve ``n`` rows of ``prepared`` inputs (under the lock): the outputs' first ``n`` rows."""
        import tvm

        if n > self.max_batch and not split:
            raise InputError(f"a batch of {n} rows is over the largest bucket ({self.max_batch}; buckets "
                             f"{self.batch_sizes}) and split=False: split it, or build with a larger batch size")
        chunks = self.chunks(n)
        outs = None
        for start, rows, batch in chunks:
            bucket = self._buckets[batch]
            self._copy_rows(bucket, prepared, start, rows, batch)
            bucket.replay()
            self.stats["runs"] += 1
            self.stats["padded_rows"] += batch - rows
            views = bucket.output_views()
            row_bytes = self._row_bytes[batch][1]
            if len(chunks) == 1:
                heads = [row_view(v, 0, rows, rb) for v, rb in zip(views, row_bytes)]
                return [owned_copy(h, self.device) for h in heads] if copy else heads
            if outs is None:
                outs = [tvm.runtime.empty((n, *v.shape[1:]), v.dtype, self.device) for v in views]
            for v, o, rb in zip(views, outs, row_bytes):
                row_view(v, 0, rows, rb).copyto(row_view(o, start, rows, rb))
        return outs

    def __call__(self, *inputs, copy: bool = True, split: bool = True, **named):
        """Run any number of rows (see the class docstring); the outputs have exactly as many rows, in order."""
        self._check_open()
        prepared = self._rules.prepare_all(inputs, named)
        n = self._batch_of(prepared)
        me = current_thread()
        with self._lock:
            self.stats["calls"] += 1
            self.stats["rows"] += n
            out = self._run_rows(prepared, n, copy, split)
            self._turns.release(me)
            return out

    def warm(self) -> None:
        """Run every bucket once on zero rows (padded as a request's rows would be) and read its outputs back,
        so that no request pays a first use (a graph's first launch, a copy path's set-up); ``stats`` count
        these runs as ``warm_runs`` only. A :class:`~tvm_nimble.runtime.batcher.Batcher` warms its executors
        when it starts."""
        self._check_open()
        inputs = [np.zeros((self.max_batch, *self.plan.tensors[t].shape[1:]), self.plan.tensors[t].dtype)
                  for t in self.plan.inputs]
        with self._lock:
            saved = dict(self.stats)
            try:
                for smaller, b in zip([0, *self.batch_sizes], self.batch_sizes):
                    for out in self._run_rows([x[:smaller + 1] for x in inputs], smaller + 1, copy=False, split=False):
                        out.numpy()
            finally:
                self.stats.update(saved)
            self.stats["warm_runs"] += len(self.batch_sizes)

    # ---- graph-executor API --------------------------------------------------------------------------------
    def set_input(self, key, value) -> None:
        """Keep ``value`` for input ``key`` (any number of rows) until :meth:`run`."""
        self._take_input(key, value, self._pending.__setitem__)

    def run(self, split: bool = True) -> None:
        """Run the inputs set (split and padded as a call is); :meth:`get_output` reads the result."""
        self._check_open()
        me = current_thread()
        with self._lock:
            self._turns.check_run(me)
            prepared = [self._pending[i] for i in range(len(self.plan.inputs))]
            n = self._batch_of(prepared)
            self.stats["calls"] += 1
            self.stats["rows"] += n
            self._results = self._run_rows(prepared, n, copy=True, split=split)
            self._turns.ran(me)

    def get_output(self, index: int = 0, copy: bool = True):
        """Output ``index`` of the last ``run()`` (a tensor the caller owns; ``copy=False``: the kept one)."""
        self._check_open()
        if not 0 <= index < len(self.plan.outputs):
            raise IndexError(f"output index {index} out of range: the model has {len(self.plan.outputs)} output(s)")
        me = current_thread()
        with self._lock:
            self._turns.check_output(me)
            out = owned_copy(self._results[index], self.device) if copy else self._results[index]
            self._turns.release(me)
            return out

    def release_thread(self, thread) -> None:
        """``thread`` is done with this executor (a pool takes it back): end its open sequence."""
        with self._lock:
            self._turns.release(thread)

    def sync(self) -> None:  # every run is synchronized before its outputs are read
        pass

    def profile(self, batch: int | None = None, graph: bool | None = None):
        """Per-launch GPU timeline (:meth:`Executor.profile`) of the bucket that runs a batch of ``batch``
        rows (the smallest bucket holding them; the largest for more); ``batch=None``: of every bucket, as
        {bucket: timeline}. Each bucket profiles on the buffers the buckets share."""
        self._check_open()
        with self._lock:
            if batch is not None:
                return self._buckets[self.bucket_for(batch)].profile(graph)
            return {b: ex.profile(graph) for b, ex in self._buckets.items()}

    # ---- lifetime ----------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise NimbleError("this NimbleExecutor is closed; create a new one")

    def close(self) -> None:
        """Free every bucket's graph, streams and events, the shared buffers and the weights."""
        self._closed = True
        for ex in list(getattr(self, "_buckets", {}).values()):
            ex.close()
        self._buckets = {}
        self._arena = None
        self._weights_dev = {}
        self._pad_zeros = []
        self._results = None
        self._pending = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"BucketedExecutor(buckets={self.batch_sizes}, mode={getattr(self, 'mode', None)!r})"
