"""CUDA streams, events and graphs through ``cuda.bindings`` (cuda-python), for the executor.

Every call's status is checked and turned into a :class:`CudaError` that names the call.
TVM kernels launch on TVM's *current* stream, which :func:`tvm_ffi.use_raw_stream` sets; so
replaying a plan onto several streams is: for each launch, switch TVM's stream, wait on the
launch's events, call the kernel, record its events. That sequence is built as data by
:mod:`tvm_nimble.runtime.issue` (and checked there on CPU); :func:`issue` only executes it.
Captured once, it becomes one CUDA graph whose branches run concurrently.
"""
from __future__ import annotations

import contextlib

from tvm_nimble import env
from tvm_nimble.errors import NimbleError


class CudaError(NimbleError):
    """A CUDA runtime call failed."""


def cuda_runtime():
    try:
        from cuda.bindings import runtime
    except ImportError:
        raise CudaError("CUDA execution needs cuda-python: pip install 'tvm-nimble[cuda]' (cuda-bindings)") from None
    return runtime


def check(result, what: str):
    """Unpack a cuda.bindings result tuple, raising on a non-success status."""
    rt = cuda_runtime()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != rt.cudaError_t.cudaSuccess:
        _, name = rt.cudaGetErrorName(err)
        raise CudaError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class StreamSet:
    """The main stream (blocking: ordered with TVM's default-stream copies) plus helper streams.

    ``priorities`` (one 0/1 per stream, or empty) gives the streams marked 1 the device's greatest
    CUDA stream priority; a graph captured from them keeps it per kernel node (see :class:`CapturedGraph`)."""

    def __init__(self, count: int, priorities=()):
        rt = cuda_runtime()
        count = max(count, 1)
        self.prioritized = any(priorities)
        levels = [0] * count
        if self.prioritized:
            _least, greatest = check(rt.cudaDeviceGetStreamPriorityRange(), "cudaDeviceGetStreamPriorityRange")
            levels = [greatest if p else 0 for p in priorities]
        self.streams = []
        for i in range(count):
            flags = rt.cudaStreamDefault if i == 0 else rt.cudaStreamNonBlocking
            self.streams.append(check(rt.cudaStreamCreateWithPriority(flags, levels[i]), "cudaStreamCreateWithPriority"))

    def handle(self, i: int) -> int:
        return int(self.streams[i])

    def close(self):
        rt = cuda_runtime()
        for s in self.streams:
            rt.cudaStreamDestroy(s)
        self.streams = []


def create_events(count: int, timing: bool = False) -> list:
    rt = cuda_runtime()
    flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
    return [check(rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags") for _ in range(count)]


def destroy_events(events) -> None:
    rt = cuda_runtime()
    for e in events:
        rt.cudaEventDestroy(e)


def record_timing(event, stream, in_capture: bool) -> None:
    """Record a timing event; inside a capture it must be an *external* record to become a graph node."""
    rt = cuda_runtime()
    if in_capture:
        check(rt.cudaEventRecordWithFlags(event, stream, rt.cudaEventRecordExternal), "cudaEventRecordWithFlags")
    else:
        check(rt.cudaEventRecord(event, stream), "cudaEventRecord(timing)")


class CudaStreamOps:
    """The three stream operations :func:`issue` performs, on CUDA: wait on an event, record an event,
    launch a kernel on a stream. Each is one call (and its status check), so that every decision --
    which stream, which event, in what order -- stays in :func:`issue`, where a CPU test drives it with
    a recorder implementing the same three methods.

    ``events`` is the executor's event list (indexed by ``Op.event``). With ``timing_events`` (a pair
    per launch) each launch is bracketed for profiling; ``in_capture`` says the sequence is being
    captured into a graph (timing records then become event-record nodes of the graph)."""

    def __init__(self, device, streams: StreamSet, events, timing_events=None, in_capture: bool = False,
                 dependent=()):
        import tvm_ffi

        rt = cuda_runtime()
        self._wait, self._record, self._use_stream = rt.cudaStreamWaitEvent, rt.cudaEventRecord, tvm_ffi.use_raw_stream
        self.device, self.streams, self.events = device, streams, events
        self.timing_events, self.in_capture = timing_events, in_capture
        #: launches captured as programmatic dependents (``Plan.dependent_launches``), unless NIMBLE_PDL=0
        self.dependent = frozenset(dependent) if env.dependent_launch() else frozenset()

    def wait(self, stream: int, event: int, what: str) -> None:
        check(self._wait(self.streams.streams[stream], self.events[event], 0), what)

    def record(self, stream: int, event: int, what: str) -> None:
        check(self._record(self.events[event], self.streams.streams[stream]), what)

    def launch(self, stream: int, index: int, func, args) -> None:
        """``func(*args)`` (launch ``index`` of the plan) with TVM's current stream set to ``stream``."""
        cuda_stream = self.streams.streams[stream]
        if self.timing_events is not None:
            record_timing(self.timing_events[index][0], cuda_stream, self.in_capture)
        elif self.in_capture and index in self.dependent:
            programmatic_dependencies(cuda_stream)
        with self._use_stream(self.device, self.streams.handle(stream)):
            func(*args)
        if self.timing_events is not None:
            record_timing(self.timing_events[index][1], cuda_stream, self.in_capture)


def programmatic_dependencies(stream) -> None:
    """Make the edge into the next node captured on ``stream`` programmatic where it has one dependency and that is a
    kernel node: that kernel (one that begins with ``griddepcontrol.wait``) may then start while the one before it
    runs, as soon as it lets it (``griddepcontrol.launch_dependents``, or its end). A join of several dependencies
    and an edge from a copy or memset stay full dependencies."""
    rt = cuda_runtime()
    status, _id, _graph, deps, _data, count = check(rt.cudaStreamGetCaptureInfo(stream), "cudaStreamGetCaptureInfo")
    if status != rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive or count != 1:
        return
    node = deps[0]
    if check(rt.cudaGraphNodeGetType(node), "cudaGraphNodeGetType") != rt.cudaGraphNodeType.cudaGraphNodeTypeKernel:
        return
    edge = rt.cudaGraphEdgeData()
    edge.from_port = rt.cudaGraphKernelNodePortProgrammatic
    edge.type = rt.cudaGraphDependencyType.cudaGraphDependencyTypeProgrammatic
    check(rt.cudaStreamUpdateCaptureDependencies(stream, [node], [edge], 1,
                                                 rt.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies),
          "cudaStreamUpdateCaptureDependencies")


def issue(ops, funcs, args, stream_ops) -> None:
    """Execute the issue sequence ``ops`` (:func:`tvm_nimble.runtime.issue.issue_sequence`) through
    ``stream_ops`` (a :class:`CudaStreamOps` on a GPU).

    This only executes the list: which stream waits on which event, where each kernel runs and
    the fork/join of the helper streams are all decided there, once, and checked on CPU; that this
    loop issues exactly that list, op for op, is checked on CPU too (tests/test_planted_faults.py).
    """
    from .issue import LAUNCH, WAIT

    for op in ops:
        if op.kind == LAUNCH:
            stream_ops.launch(op.stream, op.launch, funcs[op.launch], args[op.launch])
        elif op.kind == WAIT:
            stream_ops.wait(op.stream, op.event, op.label)
        else:
            stream_ops.record(op.stream, op.event, op.label)


class CapturedGraph:
    """One CUDA graph holding the whole launch sequence; ``launch`` is the only per-run work."""

    def __init__(self, issue_fn, streams: StreamSet):
        rt = cuda_runtime()
        self.main = streams.streams[0]
        check(rt.cudaStreamBeginCapture(self.main, rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed),
              "cudaStreamBeginCapture")
        try:
            issue_fn()
        except BaseException:
            with contextlib.suppress(Exception):
                rt.cudaStreamEndCapture(self.main)
            raise
        self.graph = check(rt.cudaStreamEndCapture(self.main), "cudaStreamEndCapture")
        # kernel nodes carry the priority of the stream they were captured from; by default a graph runs
        # at the priority of the stream it is launched into, so per-node priorities must be asked for
        flags = int(rt.cudaGraphInstantiateFlags.cudaGraphInstantiateFlagUseNodePriority) if streams.prioritized else 0
        self.exec = check(rt.cudaGraphInstantiateWithFlags(self.graph, flags), "cudaGraphInstantiateWithFlags")
        self._launch = rt.cudaGraphLaunch

    def launch(self) -> None:
        err = self._launch(self.exec, self.main)[0]
        if err != 0:
            check((err,), "cudaGraphLaunch")

    def close(self) -> None:
        rt = cuda_runtime()
        if getattr(self, "exec", None) is not None:
            rt.cudaGraphExecDestroy(self.exec)
            rt.cudaGraphDestroy(self.graph)
            self.exec = None


class PinnedArray:
    """A numpy array in page-locked host memory (``cudaHostAlloc``): a copy between it and the device is a DMA that
    :func:`copy_async` queues on a stream without waiting; the host must not touch the array until the copy ran."""

    def __init__(self, shape, dtype):
        import ctypes

        import numpy as np

        rt = cuda_runtime()
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        self.ptr = check(rt.cudaHostAlloc(max(1, count * dtype.itemsize), rt.cudaHostAllocDefault), "cudaHostAlloc")
        raw = (ctypes.c_byte * (count * dtype.itemsize)).from_address(int(self.ptr))
        self.array = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)

    def address(self, element: int = 0) -> int:
        """The host address of the flat array's ``element``."""
        return int(self.ptr) + element * self.array.itemsize

    def close(self) -> None:
        if getattr(self, "ptr", None) is not None:
            self.array = None
            cuda_runtime().cudaFreeHost(self.ptr)
            self.ptr = None


def copy_async(dst: int, src: int, nbytes: int, stream) -> None:
    """Queue a copy of ``nbytes`` from address ``src`` to ``dst`` (device or page-locked host memory, the direction
    from the addresses) on ``stream``."""
    rt = cuda_runtime()
    check(rt.cudaMemcpyAsync(dst, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyDefault, stream), "cudaMemcpyAsync")


def record(event, stream) -> None:
    check(cuda_runtime().cudaEventRecord(event, stream), "cudaEventRecord")


def wait_event(event) -> None:
    """Block the host until ``event`` (and all queued before it on its stream) has happened."""
    check(cuda_runtime().cudaEventSynchronize(event), "cudaEventSynchronize")


def synchronize(streams: StreamSet) -> None:
    check(cuda_runtime().cudaStreamSynchronize(streams.streams[0]), "cudaStreamSynchronize")


def elapsed_ms(start, end) -> float:
    return check(cuda_runtime().cudaEventElapsedTime(start, end), "cudaEventElapsedTime")


def programmatic_edges(graph) -> int:
    """How many of ``graph``'s edges are programmatic dependencies (see :func:`programmatic_dependencies`)."""
    rt = cuda_runtime()
    *_, count = check(rt.cudaGraphGetEdges(graph, 0), "cudaGraphGetEdges")
    if not count:
        return 0
    _from, _to, data, count = check(rt.cudaGraphGetEdges(graph, count), "cudaGraphGetEdges")
    programmatic = int(rt.cudaGraphDependencyType.cudaGraphDependencyTypeProgrammatic)
    return sum(1 for e in data[:count] if int(e.type) == programmatic)
