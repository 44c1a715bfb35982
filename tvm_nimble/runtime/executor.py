"""The executor of one launch plan: replays it ahead of time (the graph-executor replacement).

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
calls ``set_input``/``run``/``get_output`` belong to one thread at a time (:mod:`.turns`).

Users open a model with ``tvm_nimble.NimbleExecutor(...)`` (:func:`tvm_nimble.runtime.loading.NimbleExecutor`),
which gives this :class:`Executor` for a model built for one batch size and a
:class:`~tvm_nimble.runtime.bucketed.BucketedExecutor` (one :class:`Executor` per bucket) for a model built
with ``batch_sizes``.
"""
from __future__ import annotations

import threading
from threading import current_thread

import numpy as np

from tvm_nimble.errors import NimbleError

from .device import Workspace, device_for
from .inputs import ChecksInputs, InputError, InputRules
from .module import BucketedModule, NimbleModule, resolve_kernels
from .turns import ConcurrentUseError, NotReadyError, Turns

__all__ = ["Executor", "InputError", "NotReadyError", "ConcurrentUseError", "MODES", "owned_copy"]

MODES = ("cuda-graph", "single-stream", "streams", "sequential")


def owned_copy(t, device):
    """A copy of the tensor ``t`` on ``device`` that the caller owns (no run overwrites it)."""
    import tvm

    fresh = tvm.runtime.empty(t.shape, t.dtype, device)
    t.copyto(fresh)
    return fresh


class Executor(ChecksInputs):
    """Runs one :class:`~tvm_nimble.runtime.module.NimbleModule` (one plan) on ``device``.

    Options (``tvm_nimble.NimbleExecutor`` takes the same):

    - ``mode``: see the module docstring (default: ``cuda-graph`` on a GPU, ``sequential`` on the CPU).
    - ``check_inputs`` (default on): inputs that index a table (Gather / take: an embedding's ids) are
      checked against the table's size when they are set, as ONNX Runtime does: an id out of range is an
      :class:`InputError`, where the kernel would read out of bounds (garbage, or the process crashes).
      Off: stock TVM's behaviour. It costs one pass over the index inputs per ``set_input`` / ``ex(...)``.
    - ``check_finite`` (default off): a NaN or an infinity in a floating-point input is an
      :class:`InputError` naming the input and the element. The kernels need not carry NaN through as
      ONNX Runtime or PyTorch do (on llvm a ReLU maps NaN to 0, so a NaN input can give a finite output).
      It costs one pass over every floating-point input (through the host for a device tensor).
    - ``carry`` (output index -> input index or name) makes those outputs the next run's inputs with no
      copy: the paired buffers trade roles every run (see :mod:`tvm_nimble.runtime.carry`). A training
      step carries its parameters this way; set them once with ``set_input``.
    - ``workspace``: the device buffers to run on (a :class:`~.device.Workspace` of the plan, constants
      loaded); default: allocated here. A bucketed executor's buckets share theirs.
    """

    def __init__(self, module: NimbleModule, device=None, mode: str | None = None, check_inputs: bool = True,
                 carry: dict | None = None, check_finite: bool = False, *, workspace: Workspace | None = None):
        from .carry import storage_swap

        if isinstance(module, BucketedModule):
            raise NimbleError("this model was built with batch_sizes: open it with tvm_nimble.NimbleExecutor(...), "
                              "which gives a BucketedExecutor")
        if not isinstance(module, NimbleModule):
            raise TypeError(f"Executor runs a loaded NimbleModule, not {type(module).__name__}; open an artifact "
                            "path or an executable with tvm_nimble.NimbleExecutor(...)")
        self._closed = True  # until the buffers exist (close() before then frees nothing)
        self.module = module
        self.plan = module.plan
        self.device = device_for(self.plan.target, device)
        is_gpu = self.plan.target.get("kind") == "cuda"
        mode = mode or ("cuda-graph" if is_gpu else "sequential")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if (mode == "sequential") == is_gpu:
            raise ValueError(f"mode {mode!r} does not apply to a {self.plan.target.get('kind')} artifact")
        self.mode = mode
        self._rules = InputRules(self.plan, self.device, check_inputs, check_finite)
        self._lock = threading.RLock()
        self._turns = Turns(self.plan.input_names)
        self._graphs: list = []
        self._streams = None
        self._events = []
        self._ops = []
        self._stream_ops = None  # cuda_graph.CudaStreamOps: how _ops reach the GPU
        self._funcs = resolve_kernels(self.plan, module.kernels)
        swap = storage_swap(self.plan, carry or {})
        self._ws = workspace if workspace is not None else Workspace(self.plan, module.params, self.device)
        self._closed = False
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
    def _prepare_gpu(self):
        from . import cuda_graph as cg
        from .issue import event_count, issue_sequence, num_streams

        single = self.mode == "single-stream"
        self._ops = issue_sequence(self.plan, single_stream=single)
        self._streams = cg.StreamSet(num_streams(self.plan, single), () if single else self.plan.stream_priority)
        self._events = cg.create_events(event_count(self.plan, single))
        self._stream_ops = cg.CudaStreamOps(self.device, self._streams, self._events)
        # one live run first: lazy CUDA module loading and first-launch set-up stay out of the capture; it
        # reads zeros (see Workspace.zero: in a shared arena the other plans' live runs wrote over the inputs)
        self._ws.zero()
        self._issue()
        cg.synchronize(self._streams)
        if self.mode != "streams":
            self._graphs = [cg.CapturedGraph(lambda p=p: self._issue(parity=p, in_capture=True), self._streams)
                            for p in range(len(self._arg_sets))]
            if len(self._graphs) == 1:  # (not with carried state: a launch would advance it)
                # launched once now: a graph's first launch uploads it to the device (milliseconds for a
                # large graph), which no request should pay; it reads what the live run above read
                self._graphs[0].launch()
                cg.synchronize(self._streams)

    def _issue(self, timing_events=None, in_capture=False, parity=None):
        from . import cuda_graph as cg

        args = self._arg_sets[self._parity if parity is None else parity]
        if timing_events is None and not in_capture:
            stream_ops = self._stream_ops
        else:  # a capture's TVM kernels are made programmatic dependents where the plan allows it
            stream_ops = cg.CudaStreamOps(self.device, self._streams, self._events, timing_events, in_capture,
                                          dependent=self.plan.dependent_launches)
        cg.issue(self._ops, self._funcs, args, stream_ops)

    # ---- graph-executor API ------------------------------------------------------------------
    def get_num_inputs(self) -> int:
        return len(self.plan.inputs)

    def get_num_outputs(self) -> int:
        return len(self.plan.outputs)

    def _copy_in(self, i: int, src) -> None:
        dst = self._views[self._parity][self.plan.inputs[i]]
        if isinstance(src, np.ndarray):
            dst.copyfrom(src)
        else:
            src.copyto(dst)

    def set_input(self, key, value) -> None:
        """Copy ``value`` (numpy array, TVM tensor or any DLPack tensor) into the input buffer."""
        self._take_input(key, value, self._copy_in)

    def run(self) -> None:
        """Execute once. On GPU this only enqueues (get_output synchronizes)."""
        self._check_open()
        me = current_thread()
        with self._lock:
            self._turns.check_run(me)
            self._launch()
            self._turns.ran(me)

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
            self._turns.check_output(me)
            out = self._output(index, copy)
            self._turns.release(me)  # its sequence is complete; its outputs stay its own until the next run
            return out

    def release_thread(self, thread) -> None:
        """``thread`` is done with this executor (a pool takes it back): end its open
        ``set_input``/``run``/``get_output`` sequence, so that the next thread to use it is not refused."""
        with self._lock:
            self._turns.release(thread)

    def _output(self, index: int, copy: bool):
        self.sync()
        out = self._views[self._last_parity][self.plan.outputs[index]]
        return owned_copy(out, self.device) if copy else out

    def __call__(self, *inputs, copy: bool = True, **named):
        """Set inputs (positional in model order, or by name), run, return the list of outputs.

        Thread-safe: the whole call holds the executor's lock, and the outputs are copies the
        caller owns. ``copy=False`` returns zero-copy views of the static output buffers, which
        the next run (from any thread) overwrites.
        """
        self._check_open()
        prepared = self._rules.prepare_all(inputs, named)
        me = current_thread()
        with self._lock:
            for i, src in enumerate(prepared):
                self._copy_in(i, src)
                self._turns.input_set(i, me)
            self._launch()
            self._turns.ran(me)
            self._turns.release(me)
            return [self._output(i, copy) for i in range(len(self.plan.outputs))]

    # ---- for a caller that fills the buffers itself (a bucketed executor) ----------------------
    def input_views(self) -> list:
        """The input buffers the next run reads (zero-copy views, in the model's input order)."""
        return [self._views[self._parity][t] for t in self.plan.inputs]

    def output_views(self) -> list:
        """The output buffers the last run wrote (zero-copy views, in the model's output order)."""
        return [self._views[self._last_parity][t] for t in self.plan.outputs]

    def replay(self) -> None:
        """Run once on what :meth:`input_views` hold and wait for the run, outside the
        ``set_input``/``run``/``get_output`` bookkeeping: for a caller that fills the input buffers
        itself and serializes its runs (a :class:`~tvm_nimble.runtime.bucketed.BucketedExecutor`)."""
        self._check_open()
        with self._lock:
            self._launch()
            self.sync()

    def enqueue(self) -> None:
        """:meth:`replay` without the wait: on a GPU the run is queued on :attr:`main_stream` (copies the caller
        queues there before and after it are ordered with it), on the CPU it runs now."""
        self._check_open()
        with self._lock:
            self._launch()

    @property
    def main_stream(self):
        """The CUDA stream a run begins and ends on (None on the CPU)."""
        return self._streams.streams[0] if self._streams is not None else None

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
