"""BucketedExecutor: a model built with ``buckets`` or ``batch_sizes`` served at any size (see :mod:`.buckets`).

It holds one :class:`~tvm_nimble.runtime.executor.Executor` per bucket, over buffers it allocates once: the
weights (each distinct constant once, shared by every bucket) and one allocation for the buckets' inputs,
outputs and memory pools (one bucket runs at a time). A call checks its inputs as a plain executor does
(names, dtypes, index ranges, ``check_finite``; any extent of the bucketed axes), picks the smallest bucket
that holds them, copies them into the bucket's input buffers with zeros past their extent, replays the
bucket, and returns the real extent of every output (rows of ``batch_sizes`` over the largest bucket run in
several runs).
"""
from __future__ import annotations

import math
import threading
from threading import current_thread

import numpy as np

from tvm_nimble.errors import NimbleError

from .buckets import SharedBuffers, padding_bytes, prefix_of, row_view
from .device import device_for
from .tvm_compat import tensor_view
from .executor import Executor, owned_copy
from .inputs import ChecksInputs, InputError, InputRules
from .module import BucketedModule, NimbleModule, from_fixed
from .turns import Turns


class BucketedExecutor(ChecksInputs):
    """The executor of a model built with ``buckets`` or ``batch_sizes``: ``ex(*inputs)`` takes any extent of
    the bucketed dimensions up to the largest bucket (``batch_sizes``: any number of rows, the leading
    dimension of every input) and returns every output at that extent, in order. ``module`` is a
    :class:`~tvm_nimble.runtime.module.BucketedModule`, or a module built for one batch size, which becomes
    a one-bucket model (:func:`~tvm_nimble.runtime.module.from_fixed`). ``tvm_nimble.NimbleExecutor(...)``
    of a bucketed model or artifact returns one. The options are :class:`Executor` 's.

    ``ex(*inputs, split=False)`` refuses a batch over the largest batch bucket instead of splitting it (an
    extent over a named dimension's largest bucket is always refused); ``copy=False`` returns views of the
    bucket's output buffers (valid until the next run) where one run serves the call and each output's real
    part is a prefix of its buffer. ``set_input`` / ``run`` / ``get_output`` work as on a plain executor (the
    inputs are kept until the run, which pads and splits like a call). ``stats`` counts calls, runs, rows
    and padded rows (batch buckets; and :meth:`warm` 's runs apart).
    """

    def __init__(self, module: NimbleModule, device=None, mode: str | None = None, check_inputs: bool = True,
                 check_finite: bool = False):
        import tvm

        self._closed = False
        self._buckets: dict[tuple, Executor] = {}
        self._shared = None
        self._zeros = None  # padding_bytes() zeros on the device, what padding after a real prefix copies
        self._staging: dict[int, object] = {}  # input index -> its page-locked host buffer (buckets on a GPU stream)
        if not isinstance(module, BucketedModule):
            module = from_fixed(module)
        self.module = module
        self.space = module.space
        self.plan = module.plan
        self.keys = list(module.buckets)
        self.batch_sizes = module.batch_sizes
        self.max_batch = module.max_batch
        self.device = device_for(self.plan.target, device)
        self._shared = SharedBuffers(self.device)
        self._rules = InputRules(self.plan, self.device, check_inputs, check_finite, self.space)
        self._lock = threading.RLock()
        self._turns = Turns(self.plan.input_names)
        self._pending: dict[int, object] = {}  # input index -> prepared value, until the run
        self._results: list | None = None
        self.stats = {"calls": 0, "runs": 0, "rows": 0, "padded_rows": 0, "warm_runs": 0}
        try:
            names, weights = module.shared_weights()
            workspaces = self._shared.workspaces({k: m.plan for k, m in module.buckets.items()}, names, weights)
            self.pool_bytes = self._shared.arena_bytes
            for k, bucket in module.buckets.items():
                self._buckets[k] = Executor(bucket, self.device, mode, check_inputs, None, check_finite,
                                            workspace=workspaces[k])
            self.mode = self._buckets[max(self.keys)].mode
            zeros = padding_bytes(self.space, {k: m.plan for k, m in module.buckets.items()})
            if zeros:
                self._zeros = tvm.runtime.empty((zeros,), "uint8", self.device)
                self._zeros.copyfrom(np.zeros(zeros, "uint8"))
        except BaseException:
            self.close()
            raise

    # ---- buffers -----------------------------------------------------------------------------------------
    @property
    def weight_buffers(self) -> int:
        """How many weight buffers this executor holds on the device (each distinct constant once)."""
        return len(self._shared.weights)

    def bucket(self, key) -> Executor:
        """The executor of bucket ``key`` (its sizes; an int for one dimension, e.g. a batch size); it shares
        this executor's buffers, so use it only while nothing else runs this executor."""
        k = self.space.key(key)
        if k not in self._buckets:
            raise InputError(f"no bucket {self.space.label(k)}: the buckets are "
                             f"{[self.space.label(b) for b in self.keys]} ({self.space.describe()})")
        return self._buckets[k]

    # ---- runs --------------------------------------------------------------------------------------------
    def get_num_inputs(self) -> int:
        return len(self.plan.inputs)

    def get_num_outputs(self) -> int:
        return len(self.plan.outputs)

    def chunks(self, n: int) -> list[tuple[int, int, int]]:
        """(first row, rows, bucket) of each run that serves ``n`` rows (batch buckets): runs of the largest
        bucket while more rows than it remain, then the smallest bucket that holds the rest."""
        out, start = [], 0
        while n - start > self.max_batch:
            out.append((start, self.max_batch, self.max_batch))
            start += self.max_batch
        out.append((start, n - start, self.bucket_for(n - start)))
        return out

    def bucket_for(self, extent) -> tuple | int:
        """The bucket a run of ``extent`` takes: the smallest that holds it (batch buckets: ``extent`` rows, the
        largest for more, as an int; named dimensions: one extent per dimension, the key)."""
        if self.space.rows:
            return self.space.key_for((extent,))[0]
        return self.space.key_for(self.space.key(extent))

    def _fill(self, bucket: Executor, srcs: list) -> None:
        """Copy the inputs ``srcs`` into ``bucket``'s input buffers, zeros past their extent: a host array padded on
        the host and copied once where the buffer is small (a prompt's ids and mask: :data:`HOST_PAD_BYTES`); on a
        GPU through page-locked memory, the copy queued on the bucket's stream ahead of its replay, so that the run's
        one wait covers it; a larger real prefix of the buffer is a copy and a device-to-device zero fill of the rest
        (whatever an earlier run left there); any other padding is made on the host."""
        for i, (src, dst) in enumerate(zip(srcs, bucket.input_views())):
            real, full, nbytes = list(src.shape), list(dst.shape), _nbytes(dst)
            small = isinstance(src, np.ndarray) and nbytes <= HOST_PAD_BYTES
            if small and bucket.main_stream is not None and self._stage(i, bucket, src, dst, nbytes):
                continue
            if real == full:
                _copy(src, dst)
            elif prefix_of(real, full) and not small:
                head = tensor_view(dst, real, str(dst.dtype), 0)
                _copy(src, head)
                used = _nbytes(head)
                tensor_view(self._zeros, (nbytes - used,), "uint8", 0).copyto(
                    tensor_view(dst, (nbytes - used,), "uint8", used))
            else:
                padded = np.zeros(full, str(dst.dtype))
                padded[tuple(slice(0, r) for r in real)] = src if isinstance(src, np.ndarray) else src.numpy()
                dst.copyfrom(padded)

    def _stage(self, index: int, bucket: Executor, src: np.ndarray, dst, nbytes: int) -> bool:
        """Pad ``src`` into input ``index``'s page-locked buffer and queue its copy into ``dst`` (``nbytes``) on
        ``bucket``'s stream, ahead of the replay that reads it (and waits: the buffer is free again when the run
        returns); False for a dtype numpy does not have (bfloat16), which the caller copies as before."""
        from . import cuda_graph as cg

        try:
            dtype = np.dtype(str(dst.dtype))
        except TypeError:
            return False
        stage = self._staging.get(index)
        if stage is None:
            stage = self._staging[index] = cg.PinnedArray((HOST_PAD_BYTES,), np.uint8)
        full = [int(d) for d in dst.shape]
        host = stage.array[:nbytes].view(dtype).reshape(full)
        if list(src.shape) != full:
            host[...] = 0
        host[tuple(slice(0, r) for r in src.shape)] = src
        cg.copy_async(dst.data_ptr(), stage.address(), nbytes, bucket.main_stream)
        return True

    def _outputs(self, bucket: Executor, extents: tuple) -> list:
        """The bucket's outputs cut to ``extents``: a view where the real part is a prefix of the buffer (or the
        whole), else a copy made through the host."""
        import tvm

        outs = []
        for view, axes in zip(bucket.output_views(), self.space.outputs):
            real, full = self.space.shape_at(view.shape, axes, extents), list(view.shape)
            if real == full:
                outs.append(view)
            elif prefix_of(real, full):
                outs.append(tensor_view(view, real, str(view.dtype), 0))
            else:
                outs.append(tvm.runtime.tensor(np.ascontiguousarray(view.numpy()[tuple(slice(0, r) for r in real)]),
                                               self.device))
        return outs

    def _run_once(self, srcs: list, extents: tuple, copy: bool) -> list:
        """One run of the bucket that holds ``extents`` on ``srcs`` (their extents): its outputs cut to them."""
        key = self.space.key_for(extents)
        bucket = self._buckets[key]
        self._fill(bucket, srcs)
        bucket.replay()
        self.stats["runs"] += 1
        if self.space.rows:
            self.stats["padded_rows"] += key[0] - extents[0]
        outs = self._outputs(bucket, extents)
        return [owned_copy(o, self.device) for o in outs] if copy else outs

    def _run(self, prepared: list, extents: tuple, copy: bool, split: bool) -> list:
        """Serve ``prepared`` inputs of ``extents`` (under the lock): one run, or (batch buckets) runs of the
        largest bucket and one for the rest, their rows concatenated."""
        import tvm

        if not self.space.rows or extents[0] <= self.max_batch:
            return self._run_once(prepared, extents, copy)
        n = extents[0]
        if not split:
            raise InputError(f"a batch of {n} rows is over the largest bucket ({self.max_batch}; buckets "
                             f"{self.batch_sizes}) and split=False: split it, or build with a larger batch size")
        outs = None
        for start, rows, _ in self.chunks(n):
            heads = self._run_once([_rows(src, start, rows) for src in prepared], (rows,), copy=False)
            if outs is None:
                outs = [tvm.runtime.empty((n, *h.shape[1:]), h.dtype, self.device) for h in heads]
            for h, o in zip(heads, outs):
                h.copyto(_rows(o, start, rows))
        return outs

    def __call__(self, *inputs, copy: bool = True, split: bool = True, **named):
        """Run inputs of any extent (see the class docstring); the outputs have exactly that extent, in order."""
        self._check_open()
        prepared = self._rules.prepare_all(inputs, named)
        me = current_thread()
        with self._lock:
            out = self._counted(prepared, copy, split)
            self._turns.release(me)
            return out

    def _counted(self, prepared: list, copy: bool, split: bool) -> list:
        """:meth:`_run`, counted in ``stats``."""
        extents = self.space.extents(self.plan.input_names, [list(src.shape) for src in prepared])
        self.stats["calls"] += 1
        if self.space.rows:
            self.stats["rows"] += extents[0]
        return self._run(prepared, extents, copy, split)

    def warm(self) -> None:
        """Run every bucket once on zeros, at the smallest extents it serves (padded as a request would be), and
        read its outputs back, so that no request pays a first use (a graph's first launch, a copy path's
        set-up); ``stats`` count these runs as ``warm_runs`` only. A :class:`~tvm_nimble.runtime.batcher.Batcher`
        warms its executors when it starts."""
        self._check_open()
        with self._lock:
            saved = dict(self.stats)
            try:
                for key in self.keys:
                    extents = self.space.smallest_extents(key)
                    inputs = [np.zeros(self.space.shape_at(self.plan.tensors[t].shape, axes, extents),
                                       self.plan.tensors[t].dtype)
                              for t, axes in zip(self.plan.inputs, self.space.inputs)]
                    for out in self._run_once(inputs, extents, copy=False):
                        out.numpy()
            finally:
                self.stats.update(saved)
            self.stats["warm_runs"] += len(self.keys)

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
            self._results = self._counted(prepared, copy=True, split=split)
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

    def profile(self, batch=None, graph: bool | None = None):
        """Per-launch GPU timeline (:meth:`Executor.profile`) of the bucket that runs ``batch`` (rows of batch
        buckets, the largest for more; or one extent per named dimension); ``batch=None``: of every bucket, as
        {bucket: timeline} (keyed by batch size for batch buckets). Each bucket profiles on the buffers the
        buckets share."""
        self._check_open()
        with self._lock:
            if batch is not None:
                return self.bucket(self.bucket_for(batch)).profile(graph)
            return {(k[0] if self.space.rows else k): ex.profile(graph) for k, ex in self._buckets.items()}

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
        if self._shared is not None:
            self._shared.release()
        self._zeros = None
        for stage in getattr(self, "_staging", {}).values():
            stage.close()
        self._staging = {}
        self._results = None
        self._pending = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        space = getattr(self, "space", None)
        buckets = self.batch_sizes if space is not None and space.rows else (space.describe() if space else None)
        return f"BucketedExecutor(buckets={buckets!r}, mode={getattr(self, 'mode', None)!r})"


#: an input buffer of at most this many bytes is padded on the host and copied once (one copy, where a prefix copy and
#: a device-side zero fill are two, and two tensor views made a call); a larger one (a batch of images) is not
#: padded through a host buffer of its bucket's size
HOST_PAD_BYTES = 1 << 16


def _nbytes(t) -> int:
    """Bytes of the contiguous tensor ``t``."""
    import tvm

    dtype = tvm.runtime.DataType(str(t.dtype))
    return math.prod(int(d) for d in t.shape) * ((dtype.bits * dtype.lanes + 7) // 8)


def _copy(src, dst) -> None:
    """``src`` (a numpy array or a TVM tensor of ``dst``'s shape) into ``dst``."""
    if isinstance(src, np.ndarray):
        dst.copyfrom(src)
    else:
        src.copyto(dst)


def _rows(t, start: int, rows: int):
    """Rows ``start:start+rows`` of ``t`` (a numpy array or a contiguous TVM tensor), sharing its memory."""
    if isinstance(t, np.ndarray):
        return t[start:start + rows]
    return row_view(t, start, rows, _nbytes(t) // t.shape[0])
