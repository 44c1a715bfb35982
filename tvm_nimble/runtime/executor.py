"""NimbleExecutor: replays a launch plan ahead of time (the graph-executor replacement).

Modes:
  ``cuda-graph``    (default on GPU) the whole multi-stream launch sequence captured once as
                    one CUDA graph; a run is: copy inputs in, one ``cudaGraphLaunch``.
  ``single-stream`` the same, every kernel on one stream (the baseline Nimble is compared with).
  ``streams``       the multi-stream sequence issued live each run (debugging, profiling).
  ``sequential``    CPU (llvm) replay in launch order.

Outputs are views of the executor's static output buffers, as in Nimble: the next ``run``
overwrites them. Pass ``copy=True`` to ``get_output``/``__call__`` for independent tensors.
One instance serializes its callers with a lock (static buffers are shared); for parallel
inference create one executor per thread.
"""
from __future__ import annotations

import threading

import numpy as np

from tvm_nimble.errors import NimbleError, ShapeError

from .device import Workspace, device_for

MODES = ("cuda-graph", "single-stream", "streams", "sequential")


class InputError(NimbleError):
    """An input does not match what the model was built for."""


def _load(module_or_artifact):
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


class NimbleExecutor:
    def __init__(self, module_or_artifact, device=None, mode: str | None = None):
        self.module = _load(module_or_artifact)
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
        self._graph = self._streams = None
        self._events = []
        self._funcs = [self.module.kernels[l.kernel] for l in self.plan.launches]
        self._ws = Workspace(self.plan, self.module.params, self.device)
        self._args = self._ws.launch_args()
        try:
            if is_gpu:
                self._prepare_gpu()
        except BaseException:
            self.close()
            raise

    # ---- preparation ---------------------------------------------------------------------
    def _prepare_gpu(self):
        from . import cuda_graph as cg

        n = 1 if self.mode == "single-stream" else self.plan.num_streams
        self._streams = cg.StreamSet(n)
        self._events = cg.create_events(self.plan.num_events + n)
        # one live run first: lazy CUDA module loading and first-launch set-up stay out of the capture
        self._issue()
        cg.synchronize(self._streams)
        if self.mode != "streams":
            self._graph = cg.CapturedGraph(lambda: self._issue(), self._streams)

    def _issue(self, timing_events=None, in_capture=False):
        from . import cuda_graph as cg

        cg.issue(self.plan, self._funcs, self._args, self.device, self._streams, self._events,
                 single_stream=self.mode == "single-stream", timing_events=timing_events, in_capture=in_capture)

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

    def set_input(self, key, value) -> None:
        """Copy ``value`` (numpy array, TVM tensor or any DLPack tensor) into the input buffer."""
        self._check_open()
        i = self._input_index(key)
        slot = self.plan.tensors[self.plan.inputs[i]]
        dst = self._ws.tensors[self.plan.inputs[i]]
        src = self._as_tensor(value, slot.name)
        if list(src.shape) != slot.shape:
            raise ShapeError(f"input {slot.name!r} has shape {list(src.shape)}, the model was built for {slot.shape}")
        if str(src.dtype) != slot.dtype:
            raise InputError(f"input {slot.name!r} has dtype {src.dtype}, the model expects {slot.dtype}; cast it first")
        with self._lock:
            if isinstance(src, np.ndarray):
                dst.copyfrom(src)
            else:
                src.copyto(dst)

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
        self._check_open()
        with self._lock:
            if self._graph is not None:
                self._graph.launch()
            elif self._streams is not None:
                self._issue()
            else:
                for f, a in zip(self._funcs, self._args):
                    f(*a)

    def sync(self) -> None:
        if self._streams is not None:
            from . import cuda_graph as cg

            cg.synchronize(self._streams)

    def get_output(self, index: int = 0, copy: bool = False):
        """Output ``index`` as a TVM tensor: a view of the static buffer, or a copy with ``copy=True``."""
        self._check_open()
        if not 0 <= index < len(self.plan.outputs):
            raise IndexError(f"output index {index} out of range: the model has {len(self.plan.outputs)} output(s)")
        self.sync()
        out = self._ws.tensors[self.plan.outputs[index]]
        if copy:
            import tvm

            fresh = tvm.runtime.empty(out.shape, out.dtype, self.device)
            out.copyto(fresh)
            return fresh
        return out

    def __call__(self, *inputs, copy: bool = False, **named):
        """Set inputs (positional in model order, or by name), run, return the list of outputs."""
        if len(inputs) + len(named) != len(self.plan.inputs):
            raise InputError(f"the model takes {len(self.plan.inputs)} input(s) {self.plan.input_names}, "
                             f"got {len(inputs) + len(named)}")
        with self._lock:
            for i, v in enumerate(inputs):
                self.set_input(i, v)
            for k, v in named.items():
                self.set_input(k, v)
            self.run()
            return [self.get_output(i, copy=copy) for i in range(self.get_num_outputs())]

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

        if self._graph is not None:
            with suppress(Exception):
                self._graph.close()
        if self._events:
            from . import cuda_graph as cg

            with suppress(Exception):
                cg.destroy_events(self._events)
        if self._streams is not None:
            with suppress(Exception):
                self._streams.close()
        self._graph, self._streams, self._events, self._args = None, None, [], []
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
