"""NimbleExecutor: replays a launch plan ahead of time (the graph-executor replacement).

Modes:
  ``cuda-graph``    (default on GPU) the whole multi-stream launch sequence captured once as
                    one CUDA graph; a run is: copy inputs in, one ``cudaGraphLaunch``.
  ``single-stream`` the same, every kernel on one stream (the baseline Nimble is compared with).
  ``streams``       the multi-stream sequence issued live each run (debugging, profiling).
  ``sequential``    CPU (llvm) replay in launch order.

Threads. ``ex(*inputs)`` is thread-safe: one call sets the inputs, runs and copies the
outputs out under the executor's lock, and returns tensors the caller owns (``copy=False``
returns zero-copy views of the static output buffers instead, valid until the next run from
any thread). Calls from several threads serialize; for parallel inference use
:class:`tvm_nimble.runtime.pool.NimblePool` (or one executor per thread). The graph-executor
calls ``set_input``/``run``/``get_output`` keep state between calls, so they belong to one
thread at a time: a second thread calling them while another thread is between its
``set_input``/``run`` and its ``get_output`` gets a :class:`ConcurrentUseError`, and so does a
thread whose inputs or outputs another thread's run has overwritten meanwhile. Nothing is
read that no run produced: ``get_output`` before the first ``run``, or ``run`` before every
input was set once, raise :class:`NotReadyError`.
"""
from __future__ import annotations

import threading
from threading import current_thread

import numpy as np

from tvm_nimble.errors import NimbleError, ShapeError

from .buckets import SharedWorkspace, arena_layout, max_padding, row_view, shared_constant_storages
from .device import Workspace, device_for, tensor_at

MODES = ("cuda-graph", "single-stream", "streams", "sequential")

#: How a thread-safety error names the fix.
_FIX = ("use one executor per thread, tvm_nimble.runtime.pool.NimblePool, or ex(*inputs), which is thread-safe "
        "and returns outputs the caller owns")


class InputError(NimbleError):
    """An input does not match what the model was built for."""


class NotReadyError(NimbleError):
    """An output was read before any run, or a run started before every input was set."""


class ConcurrentUseError(NimbleError):
    """``set_input``/``run``/``get_output`` of one executor were interleaved across threads."""


def _thread_name(t) -> str:
    return f"thread {t.name!r}" if t is not None else "another thread"


def load_module(module_or_artifact):
    """The :class:`~tvm_nimble.runtime.module.NimbleModule` that executors of ``module_or_artifact`` run:
    a NimbleModule as it is, an artifact directory loaded, or the plan read out of an executable built
    with ``relax_pipeline="nimble"``. Load once to share the kernels among several executors (a pool)."""
    from .module import NimbleModule, load

    if isinstance(module_or_artifact, NimbleModule):
        return module_or_artifact
    if isinstance(module_or_artifact, str) or hasattr(module_or_artifact, "__fspath__"):
        return load(str(module_or_artifact))
    if hasattr(module_or_artifact, "export_library") or type(module_or_artifact).__name__ in ("Module", "Executable"):
        from .executable import module_from_executable  # built with relax_pipeline="nimble"

        return module_from_executable(module_or_artifact)
    raise TypeError(f"NimbleExecutor takes a NimbleModule (tvm_nimble.build), an artifact path or an executable "
                    f"from tvm.compile(..., relax_pipeline='nimble'), "
                    f"not {type(module_or_artifact).__name__}")


def _is_bucketed(module_or_artifact) -> bool:
    """Whether ``module_or_artifact`` holds batch buckets (a module, or an artifact directory whose manifest says so)."""
    if getattr(module_or_artifact, "buckets", None):
        return True
    if isinstance(module_or_artifact, str) or hasattr(module_or_artifact, "__fspath__"):
        import json
        import os

        manifest = os.path.join(os.fspath(module_or_artifact), "manifest.json")
        try:
            with open(manifest) as f:
                return isinstance(json.load(f).get("buckets"), list)
        except (OSError, ValueError, AttributeError):
            return False  # (loading names what is wrong)
    return False


def _owned_copy(t, device):
    """A copy of the tensor ``t`` on ``device`` that the caller owns (no run overwrites it)."""
    import tvm

    fresh = tvm.runtime.empty(t.shape, t.dtype, device)
    t.copyto(fresh)
    return fresh


class NimbleExecutor:
    def __new__(cls, module_or_artifact=None, *args, **kwargs):
        """A model built with ``batch_sizes`` gets a :class:`~tvm_nimble.runtime.buckets.BucketedExecutor`
        (a NimbleExecutor that takes any batch size)."""
        if cls is NimbleExecutor and _is_bucketed(module_or_artifact):
            cls = BucketedExecutor
        return super().__new__(cls)

    def __init__(self, module_or_artifact, device=None, mode: str | None = None, check_inputs: bool = True,
                 carry: dict | None = None):
        """Inputs that index a table (Gather / take: an embedding's ids) are checked against the
        table's size when they are set, as ONNX Runtime does: an id out of range is an
        :class:`InputError`, where the kernel would read out of bounds (garbage, or the process
        crashes). ``check_inputs=False`` skips the check (stock TVM's behaviour); it costs
        one pass over the index inputs per ``set_input`` / ``ex(...)``, none in ``run()``.

        ``carry`` (output index -> input index or name) makes those outputs the next run's inputs
        with no copy: the paired buffers trade roles every run (see :mod:`tvm_nimble.runtime.carry`).
        A training step carries its parameters this way; set them once with ``set_input``."""
        from .carry import storage_swap
        from .module import resolve_kernels

        self.check_inputs = check_inputs
        self.module = load_module(module_or_artifact)
        self.plan = self.module.plan
        self.device = device_for(self.plan.target, device)
        is_gpu = self.plan.target.get("kind") == "cuda"
        mode = mode or ("cuda-graph" if is_gpu else "sequential")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if (mode == "sequential") == is_gpu:
            raise ValueError(f"mode {mode!r} does not apply to a {self.plan.target.get('kind')} artifact")
        self.mode = mode
        self._lock = threading.RLock()
        self._closed = False
        self._graphs: list = []
        self._streams = None
        self._events = []
        self._ops = []
        self._stream_ops = None  # cuda_graph.CudaStreamOps: how _ops reach the GPU
        # what the buffers hold: who set each input last, whether any run produced the outputs
        self._setter: list = [None] * len(self.plan.inputs)
        self._inputs_by = None  # the thread that set every input, if one did
        self._has_result = False
        self._last_runner = None  # the thread whose run the outputs hold
        self._owner = None  # the thread between its set_input/run and its get_output, if any
        self._local = threading.local()  # per thread: set_any (it set an input), ran (it ran this executor)
        self._funcs = resolve_kernels(self.plan, self.module.kernels)
        swap = storage_swap(self.plan, carry or {})
        self._ws = self._workspace()
        # one set of tensor views and launch arguments per parity; two only when state is carried
        self._views = [self._ws.tensors] + ([self._ws.views(swap)] if swap else [])
        self._arg_sets = [self._ws.launch_args(v) for v in self._views]
        self._parity = self._last_parity = 0  # which set the next run uses / the last run used
        try:
            if is_gpu:
                self._prepare_gpu()
        except BaseException:
            self.close()
            raise

    # ---- preparation ---------------------------------------------------------------------
    def _workspace(self) -> Workspace:
        """The plan's device buffers (a bucket of a bucketed executor shares them with the other buckets)."""
        return Workspace(self.plan, self.module.params, self.device)

    def _prepare_gpu(self):
        from . import cuda_graph as cg
        from .issue import event_count, issue_sequence, num_streams

        single = self.mode == "single-stream"
        self._ops = issue_sequence(self.plan, single_stream=single)
        self._streams = cg.StreamSet(num_streams(self.plan, single), () if single else self.plan.stream_priority)
        self._events = cg.create_events(event_count(self.plan, single))
        self._stream_ops = cg.CudaStreamOps(self.device, self._streams, self._events)
        # one live run first: lazy CUDA module loading and first-launch set-up stay out of the capture
        self._issue()
        cg.synchronize(self._streams)
        if self.mode != "streams":
            self._graphs = [cg.CapturedGraph(lambda p=p: self._issue(parity=p), self._streams)
                            for p in range(len(self._arg_sets))]
            if len(self._graphs) == 1:  # (not with carried state: a launch would advance it)
                # launched once now: a graph's first launch uploads it to the device (milliseconds for a
                # large graph), which no request should pay; it reads what the live run above read
                self._graphs[0].launch()
                cg.synchronize(self._streams)

    def _issue(self, timing_events=None, in_capture=False, parity=None):
        from . import cuda_graph as cg

        args = self._arg_sets[self._parity if parity is None else parity]
        stream_ops = self._stream_ops if timing_events is None else cg.CudaStreamOps(
            self.device, self._streams, self._events, timing_events, in_capture)
        cg.issue(self._ops, self._funcs, args, stream_ops)

    # ---- graph-executor API ------------------------------------------------------------------
    def get_num_inputs(self) -> int:
        return len(self.plan.inputs)

    def get_num_outputs(self) -> int:
        return len(self.plan.outputs)

    def _input_index(self, key) -> int:
        names = self.plan.input_names
        if isinstance(key, str):
            if key not in names:
                raise InputError(f"unknown input {key!r}; the model's inputs are {names}")
            return names.index(key)
        if not 0 <= key < len(names):
            raise InputError(f"input index {key} out of range: the model has {len(names)} input(s) {names}")
        return key

    def _claim(self, me, what: str) -> None:
        """``me`` starts or continues a set_input/run/get_output sequence; refuse if another thread is mid-way."""
        owner = self._owner
        if owner is not None and owner is not me and owner.is_alive():
            raise ConcurrentUseError(f"{what} from {_thread_name(me)} while {_thread_name(owner)} is between its "
                                     f"set_input/run and get_output on the same NimbleExecutor: {_FIX}")
        self._owner = me

    def _prepare_input(self, key, value):
        i = self._input_index(key)
        slot = self.plan.tensors[self.plan.inputs[i]]
        src = self._as_tensor(value, slot.name)
        if list(src.shape) != slot.shape:
            raise ShapeError(f"input {slot.name!r} has shape {list(src.shape)}, the model was built for {slot.shape}")
        if str(src.dtype) != slot.dtype:
            raise InputError(f"input {slot.name!r} has dtype {src.dtype}, the model expects {slot.dtype}; cast it first")
        if self.check_inputs and slot.name in self.plan.index_bounds:
            self._check_indices(slot.name, src, self.plan.index_bounds[slot.name])
        return i, src

    @staticmethod
    def _check_indices(name, src, size) -> None:
        values = src if isinstance(src, np.ndarray) else src.numpy()
        if values.size and (values.min() < -size or values.max() >= size):
            bad = values[(values < -size) | (values >= size)].flat[0]
            raise InputError(f"input {name!r} indexes a table of {size} rows but holds {bad}; valid indices are "
                             f"{-size}..{size - 1}")

    def _copy_in(self, i, src, me) -> None:
        dst = self._views[self._parity][self.plan.inputs[i]]
        if isinstance(src, np.ndarray):
            dst.copyfrom(src)
        else:
            src.copyto(dst)
        self._setter[i] = me
        self._inputs_by = me if all(s is me for s in self._setter) else None
        self._local.set_any = True

    def set_input(self, key, value) -> None:
        """Copy ``value`` (numpy array, TVM tensor or any DLPack tensor) into the input buffer."""
        self._check_open()
        i, src = self._prepare_input(key, value)
        me = current_thread()
        with self._lock:
            self._claim(me, "set_input")
            self._copy_in(i, src, me)

    def _as_tensor(self, value, name):
        import tvm

        if isinstance(value, np.ndarray):
            return np.asarray(value, order="C")  # (ascontiguousarray would turn 0-d into 1-d)
        if isinstance(value, tvm.runtime.Tensor):
            tensor = value
        elif hasattr(value, "__dlpack__"):
            on_host = hasattr(value, "__dlpack_device__") and int(value.__dlpack_device__()[0]) == 1
            try:
                if on_host:  # numpy accepts any host DLPack tensor (strided, unaligned): copied in
                    return np.asarray(np.from_dlpack(value), order="C")
                tensor = tvm.runtime.from_dlpack(value)  # device tensor: no copy through the host
            except Exception as err:
                raise InputError(f"input {name!r}: cannot take it through DLPack ({str(err).splitlines()[0]}); "
                                 "pass a contiguous tensor or a numpy array") from None
        else:
            try:
                arr = np.asarray(value, order="C")
            except Exception:
                arr = None
            if arr is None or arr.dtype.kind in "OUSV":
                raise InputError(f"input {name!r}: expected a numpy array, TVM tensor or DLPack tensor, "
                                 f"got {type(value).__name__}")
            return arr
        if not tensor.is_contiguous():
            raise InputError(f"input {name!r} is not contiguous; call .contiguous() (torch) or np.ascontiguousarray")
        dev = tensor.device
        if dev.dlpack_device_type() not in (1, self.device.dlpack_device_type()):
            raise InputError(f"input {name!r} is on {dev}, the executor runs on {self.device}")
        return tensor

    def run(self) -> None:
        """Execute once. On GPU this only enqueues (get_output synchronizes)."""
        if self._closed:
            self._check_open()
        me = current_thread()
        with self._lock:
            if self._owner is not me:
                self._claim(me, "run")
            if self._inputs_by is not me:  # (fast path: this thread set every input)
                self._check_inputs(me)
            self._launch()
            if self._last_runner is not me:
                self._ran_by(me)
            self._has_result = True

    def _ran_by(self, me) -> None:
        """The outputs now hold ``me``'s run (another thread's earlier outputs are gone)."""
        self._last_runner = me
        self._local.ran = True

    def _check_inputs(self, me) -> None:
        setter = self._setter
        if None in setter:
            missing = [n for n, s in zip(self.plan.input_names, setter) if s is None]
            raise NotReadyError(f"run() before set_input: input(s) {missing} were never set, so the kernels would "
                                "read uninitialized memory; call set_input(name, value) for each input first "
                                "(or ex(*inputs))")
        if getattr(self._local, "set_any", False):  # this thread set inputs: all must still be its own
            other = next((s for s in setter if s is not me), None)
            if other is not None:
                self._owner = None
                raise ConcurrentUseError(f"run() from {_thread_name(me)}: the inputs it set were overwritten by "
                                         f"{_thread_name(other)} since; {_FIX}")

    def _launch(self) -> None:
        p = self._parity
        if self._graphs:
            self._graphs[p].launch()
        elif self._streams is not None:
            self._issue()
        else:
            for f, a in zip(self._funcs, self._arg_sets[p]):
                f(*a)
        self._last_parity, self._parity = p, (p + 1) % len(self._arg_sets)

    def sync(self) -> None:
        if self._streams is not None:
            from . import cuda_graph as cg

            cg.synchronize(self._streams)

    def get_output(self, index: int = 0, copy: bool = True):
        """Output ``index`` of the last run as a TVM tensor the caller owns (a copy).

        ``copy=False`` returns a zero-copy view of the static output buffer instead, as TVM's
        graph executor does: the next run, from any thread, overwrites it.
        """
        self._check_open()
        if not 0 <= index < len(self.plan.outputs):
            raise IndexError(f"output index {index} out of range: the model has {len(self.plan.outputs)} output(s)")
        me = current_thread()
        with self._lock:
            if not self._has_result:
                raise NotReadyError("get_output() before any run(): the output buffers hold no result yet; call "
                                    "set_input(...) for every input and run() first (or ex(*inputs))")
            owner = self._owner
            ran = self._last_runner is me or getattr(self._local, "ran", False)
            if ran and self._last_runner is not me:
                raise ConcurrentUseError(f"get_output() from {_thread_name(me)}: the outputs of its run() were "
                                         f"overwritten by a later run from {_thread_name(self._last_runner)}; {_FIX}")
            if not ran and owner is not None and owner is not me and owner.is_alive():
                raise ConcurrentUseError(f"get_output() from {_thread_name(me)}, which never ran this executor, while "
                                         f"{_thread_name(owner)} is between its set_input/run and get_output; {_FIX}")
            out = self._output(index, copy)
            if owner is me:
                self._owner = None  # this thread's sequence is complete; its outputs stay its own until the next run
            return out

    def release_thread(self, thread) -> None:
        """``thread`` is done with this executor (a pool takes it back): end its open
        ``set_input``/``run``/``get_output`` sequence, so that the next thread to use it is not refused."""
        with self._lock:
            if self._owner is thread:
                self._owner = None

    def _output(self, index: int, copy: bool):
        self.sync()
        out = self._views[self._last_parity][self.plan.outputs[index]]
        return _owned_copy(out, self.device) if copy else out

    def __call__(self, *inputs, copy: bool = True, **named):
        """Set inputs (positional in model order, or by name), run, return the list of outputs.

        Thread-safe: the whole call holds the executor's lock, and the outputs are copies the
        caller owns. ``copy=False`` returns zero-copy views of the static output buffers, which
        the next run (from any thread) overwrites.
        """
        self._check_open()
        if len(inputs) + len(named) != len(self.plan.inputs):
            raise InputError(f"the model takes {len(self.plan.inputs)} input(s) {self.plan.input_names}, "
                             f"got {len(inputs) + len(named)}")
        prepared = [self._prepare_input(i, v) for i, v in enumerate(inputs)]
        prepared += [self._prepare_input(k, v) for k, v in named.items()]
        if len({i for i, _ in prepared}) != len(self.plan.inputs):
            raise InputError(f"input(s) given twice: the model's inputs are {self.plan.input_names}")
        me = current_thread()
        with self._lock:
            for i, src in prepared:
                self._copy_in(i, src, me)
            self._launch()
            self._ran_by(me)
            self._has_result = True
            if self._owner is me:
                self._owner = None
            return [self._output(i, copy) for i in range(len(self.plan.outputs))]

    # ---- profiling ---------------------------------------------------------------------------
    def profile(self, graph: bool | None = None):
        """Per-launch GPU timeline: list of (launch idx, stream, kernel, start_ms, end_ms).

        A CUDA event brackets every launch. With ``graph`` (default in ``cuda-graph`` mode) the
        bracketed sequence is captured as its own CUDA graph and replayed, so the timeline shows
        what the deployed graph does: every kernel is already enqueued, and overlap is real. Live
        issue (``graph=False``) is paced by the host (tens of microseconds per launch from
        Python), which stretches small kernels' brackets and hides overlap.
        """
        from . import cuda_graph as cg

        if self._streams is None or self.mode == "single-stream":
            raise ValueError("profile() needs a multi-stream GPU executor (mode 'streams' or 'cuda-graph')")
        graph = self.mode == "cuda-graph" if graph is None else graph
        n = len(self.plan.launches)
        ev = cg.create_events(2 * n + 1, timing=True)
        pairs = [(ev[2 * i], ev[2 * i + 1]) for i in range(n)]
        captured = None
        try:
            with self._lock:
                def bracketed(in_capture):
                    cg.record_timing(ev[-1], self._streams.streams[0], in_capture)
                    self._issue(timing_events=pairs, in_capture=in_capture)

                if graph:
                    captured = cg.CapturedGraph(lambda: bracketed(True), self._streams)
                    captured.launch()  # first replay warms up; the second is measured
                    cg.synchronize(self._streams)
                    captured.launch()
                else:
                    bracketed(False)
                cg.synchronize(self._streams)
            return [(l.idx, l.stream, l.kernel, cg.elapsed_ms(ev[-1], a), cg.elapsed_ms(ev[-1], b))
                    for l, (a, b) in zip(self.plan.launches, pairs)]
        finally:
            if captured is not None:
                captured.close()
            cg.destroy_events(ev)

    # ---- lifetime ---------------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise NimbleError("this NimbleExecutor is closed; create a new one")

    def close(self) -> None:
        """Free the CUDA graph, streams, events and device buffers."""
        if self._closed:
            return
        self._closed = True
        from contextlib import suppress

        for g in self._graphs:
            with suppress(Exception):
                g.close()
        if self._events:
            from . import cuda_graph as cg

            with suppress(Exception):
                cg.destroy_events(self._events)
        if self._streams is not None:
            with suppress(Exception):
                self._streams.close()
        self._graphs, self._streams, self._events, self._arg_sets, self._views = [], None, [], [], []
        if getattr(self, "_ws", None) is not None:
            self._ws.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# ---- batch buckets (see runtime/buckets.py) ------------------------------------------------------
class _BucketRunner(NimbleExecutor):
    """The executor of one bucket, on buffers its :class:`BucketedExecutor` shares among the buckets."""

    def __init__(self, module, workspace, device, mode, check_inputs):
        self._shared_workspace = workspace
        super().__init__(module, device, mode, check_inputs)

    def _workspace(self):
        return self._shared_workspace


class BucketedExecutor(NimbleExecutor):
    """A :class:`NimbleExecutor` of a model built with ``batch_sizes``: ``ex(*inputs)`` takes any number of
    rows (see the module docstring). ``NimbleExecutor(bucketed model)`` returns one; a model built for one
    batch size becomes a one-bucket model (:func:`from_fixed`).

    ``ex(*inputs, split=False)`` refuses a batch over the largest bucket instead of splitting it;
    ``copy=False`` returns views of the bucket's output buffers (valid until the next run) when one run
    serves the batch. ``set_input`` / ``run`` / ``get_output`` work as on any executor (the inputs are kept
    until the run, which splits and pads like a call). ``stats`` counts runs, rows and padded rows (and
    :meth:`warm` 's runs apart).
    """

    def __init__(self, module_or_artifact, device=None, mode: str | None = None, check_inputs: bool = True,
                 carry: dict | None = None):
        import tvm

        self._closed = False
        self._runners: dict[int, _BucketRunner] = {}
        self._arena = None
        self._weights_dev: dict[str, object] = {}
        if carry:
            raise NimbleError("carry does not apply to a model with batch buckets")
        from .module import BucketedModule, from_fixed

        module = load_module(module_or_artifact)
        if not isinstance(module, BucketedModule):
            module = from_fixed(module)
        self.module = module
        self.plan = module.plan
        self.check_inputs = check_inputs
        self.batch_sizes = module.batch_sizes
        self.max_batch = module.max_batch
        self.device = device_for(self.plan.target, device)
        self._lock = threading.RLock()
        self._owner = None
        self._pending: dict[int, tuple] = {}  # input index -> (prepared value, thread that set it)
        self._results = None
        self._result_by = None
        self._local = threading.local()
        self.stats = {"calls": 0, "runs": 0, "rows": 0, "padded_rows": 0, "warm_runs": 0}
        self._pad_zeros: list = []  # per input: max_padding() zero rows on the device, what padding copies
        try:
            names, weights = module.shared_weights()
            layouts = {b: arena_layout(m.plan) for b, m in module.buckets.items()}
            self.pool_bytes = max(total for _, total in layouts.values())
            self._arena = tvm.runtime.empty((max(self.pool_bytes, 1),), "uint8", self.device)
            for b, bucket in module.buckets.items():
                self._runners[b] = self._runner(bucket, layouts[b][0], names[b], weights, mode)
            self.mode = self._runners[self.max_batch].mode
            # per bucket: each input's and output's bytes per row (what row views and padding need)
            self._row_bytes = {b: ([r.plan.tensors[t].nbytes // b for t in r.plan.inputs],
                                   [r.plan.tensors[t].nbytes // b for t in r.plan.outputs])
                               for b, r in self._runners.items()}
            pad = max_padding(self.batch_sizes)
            for t in self.plan.inputs if pad else ():
                slot = self.plan.tensors[t]
                zeros = tvm.runtime.empty((pad, *slot.shape[1:]), slot.dtype, self.device)
                zeros.copyfrom(np.zeros((pad, *slot.shape[1:]), dtype=slot.dtype))
                self._pad_zeros.append(zeros)
        except BaseException:
            self.close()
            raise

    def _runner(self, bucket, offsets: dict[int, int], names: dict[str, str], weights: dict, mode) -> _BucketRunner:
        import tvm

        plan = bucket.plan
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
        return _BucketRunner(bucket, ws, self.device, mode, self.check_inputs)

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

    def bucket(self, batch: int) -> NimbleExecutor:
        """The executor of one bucket (e.g. to ``profile()`` it); it shares this executor's buffers, so use
        it only while nothing else runs this executor."""
        if batch not in self._runners:
            raise InputError(f"no bucket for batch {batch}: the buckets are {self.batch_sizes}")
        return self._runners[batch]

    # ---- inputs ------------------------------------------------------------------------------------------
    def _prepare_one(self, i: int, value):
        slot = self.plan.tensors[self.plan.inputs[i]]
        src = self._as_tensor(value, slot.name)
        shape = list(src.shape)
        if len(shape) != len(slot.shape) or shape[1:] != slot.shape[1:]:
            raise ShapeError(f"input {slot.name!r} has shape {shape}; the model takes batches shaped "
                             f"[N, {', '.join(map(str, slot.shape[1:]))}] (any N, run in buckets of {self.batch_sizes})")
        if str(src.dtype) != slot.dtype:
            raise InputError(f"input {slot.name!r} has dtype {src.dtype}, the model expects {slot.dtype}; cast it first")
        if self.check_inputs and slot.name in self.plan.index_bounds:
            self._check_indices(slot.name, src, self.plan.index_bounds[slot.name])
        return src

    def _batch_of(self, prepared: list) -> int:
        rows = [int(src.shape[0]) for src in prepared]
        if len(set(rows)) != 1:
            names = self.plan.input_names
            raise InputError("the inputs disagree on the batch size: " +
                             ", ".join(f"{n!r} has {r} rows" for n, r in zip(names, rows)))
        if rows[0] < 1:
            raise InputError("the batch is empty (0 rows): give at least one row")
        return rows[0]

    def _prepare_all(self, inputs, named) -> list:
        names = self.plan.input_names
        if len(inputs) + len(named) != len(names):
            raise InputError(f"the model takes {len(names)} input(s) {names}, got {len(inputs) + len(named)}")
        values: list = list(inputs) + [None] * (len(names) - len(inputs))
        for key, value in named.items():
            i = self._input_index(key)
            if i < len(inputs) or values[i] is not None:
                raise InputError(f"input(s) given twice: the model's inputs are {names}")
            values[i] = value
        return [self._prepare_one(i, v) for i, v in enumerate(values)]

    # ---- runs --------------------------------------------------------------------------------------------
    def chunks(self, n: int) -> list[tuple[int, int, int]]:
        """(first row, rows, bucket) of each run that serves ``n`` rows: runs of the largest bucket while more
        rows than it remain, then the smallest bucket that holds the rest."""
        out, start = [], 0
        while n - start > self.max_batch:
            out.append((start, self.max_batch, self.max_batch))
            start += self.max_batch
        rest = n - start
        out.append((start, rest, min(b for b in self.batch_sizes if b >= rest)))
        return out

    def _copy_rows(self, runner: _BucketRunner, prepared: list, start: int, rows: int, batch: int) -> None:
        plan = runner.plan
        views = runner._views[runner._parity]
        for i, (src, row_bytes) in enumerate(zip(prepared, self._row_bytes[batch][0])):
            dst = views[plan.inputs[i]]
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
            runner = self._runners[batch]
            self._copy_rows(runner, prepared, start, rows, batch)
            runner._launch()
            runner.sync()
            self.stats["runs"] += 1
            self.stats["padded_rows"] += batch - rows
            last = runner._views[runner._last_parity]
            views = [last[t] for t in runner.plan.outputs]
            row_bytes = self._row_bytes[batch][1]
            if len(chunks) == 1:
                heads = [row_view(v, 0, rows, rb) for v, rb in zip(views, row_bytes)]
                return [_owned_copy(h, self.device) for h in heads] if copy else heads
            if outs is None:
                outs = [tvm.runtime.empty((n, *v.shape[1:]), v.dtype, self.device) for v in views]
            for v, o, rb in zip(views, outs, row_bytes):
                row_view(v, 0, rows, rb).copyto(row_view(o, start, rows, rb))
        return outs

    def __call__(self, *inputs, copy: bool = True, split: bool = True, **named):
        """Run any number of rows (see the class docstring); the outputs have exactly as many rows, in order."""
        self._check_open()
        prepared = self._prepare_all(inputs, named)
        n = self._batch_of(prepared)
        me = current_thread()
        with self._lock:
            self.stats["calls"] += 1
            self.stats["rows"] += n
            out = self._run_rows(prepared, n, copy, split)
            if self._owner is me:
                self._owner = None
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
        self._check_open()
        i = self._input_index(key)
        src = self._prepare_one(i, value)
        me = current_thread()
        with self._lock:
            self._claim(me, "set_input")
            self._pending[i] = (src, me)

    def run(self, split: bool = True) -> None:
        self._check_open()
        me = current_thread()
        with self._lock:
            self._claim(me, "run")
            missing = [n for i, n in enumerate(self.plan.input_names) if i not in self._pending]
            if missing:
                raise NotReadyError(f"run() before set_input: input(s) {missing} were never set; call "
                                    "set_input(name, value) for each input first (or ex(*inputs))")
            other = next((t for _, t in self._pending.values() if t is not me), None)
            if other is not None:
                self._owner = None
                raise ConcurrentUseError(f"run() from thread {me.name!r}: input(s) were set by thread "
                                         f"{getattr(other, 'name', '?')!r}; use one executor per thread, a NimblePool, "
                                         "or ex(*inputs)")
            prepared = [self._pending[i][0] for i in range(len(self.plan.inputs))]
            n = self._batch_of(prepared)
            self.stats["calls"] += 1
            self.stats["rows"] += n
            self._results = self._run_rows(prepared, n, copy=True, split=split)
            self._result_by = me

    def get_output(self, index: int = 0, copy: bool = True):
        """Output ``index`` of the last ``run()`` (a tensor the caller owns; ``copy=False``: the kept one)."""
        self._check_open()
        if not 0 <= index < len(self.plan.outputs):
            raise IndexError(f"output index {index} out of range: the model has {len(self.plan.outputs)} output(s)")
        me = current_thread()
        with self._lock:
            if self._results is None:
                raise NotReadyError("get_output() before any run(): call set_input(...) for every input and run() "
                                    "first (or ex(*inputs))")
            owner = self._owner
            if owner is not None and owner is not me and owner.is_alive():
                raise ConcurrentUseError(f"get_output() from thread {me.name!r} while thread {owner.name!r} is between "
                                         "its set_input/run and get_output; use one executor per thread, a NimblePool, "
                                         "or ex(*inputs)")
            out = _owned_copy(self._results[index], self.device) if copy else self._results[index]
            if owner is me:
                self._owner = None
            return out

    def sync(self) -> None:  # every run is synchronized before its outputs are read
        pass

    def profile(self, graph: bool | None = None):
        raise NimbleError(f"profile one bucket of a bucketed executor: ex.bucket(N).profile() with N among "
                          f"{self.batch_sizes}")

    def close(self) -> None:
        """Free every bucket's graph, streams and events, the shared buffers and the weights."""
        self._closed = True
        for r in list(getattr(self, "_runners", {}).values()):
            r.close()
        self._runners = {}
        self._arena = None
        self._weights_dev = {}
        self._pad_zeros = []
        self._results = None
        self._pending = {}

    def __repr__(self) -> str:
        return f"BucketedExecutor(buckets={self.batch_sizes}, mode={getattr(self, 'mode', None)!r})"
