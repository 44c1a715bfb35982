"""NimblePool: N executors of one model that threads share safely.

An executor's buffers, streams and captured CUDA graph are static, so one executor runs one
inference at a time (its calls serialize on a lock). A pool holds ``replicas`` executors of the
same loaded module (the kernels are loaded once; each replica has its own buffers, streams and
graph) and hands each call the next idle one::

    pool = NimblePool("model.nimble", replicas=4)
    outs = pool(x)                      # from any thread: outputs the caller owns
    with pool.executor() as ex:         # borrow one replica for the graph-executor calls
        ex.set_input("input", x); ex.run(); y = ex.get_output(0)
"""
from __future__ import annotations

import contextlib
import os
import queue
import threading

from tvm_nimble.errors import NimbleError

from .bucketed import BucketedExecutor
from .executor import Executor
from .loading import NimbleExecutor, load_module

#: Default upper bound on the replicas a pool creates when ``replicas`` is not given.
MAX_REPLICAS = 4
#: On GPU, the share of the free device memory that default-sized replicas may take.
GPU_MEMORY_SHARE = 0.5


def plan_bytes(plan) -> int:
    """Device bytes one executor of ``plan`` allocates (every storage block, constants included)."""
    return sum(max(s.nbytes, 1) for s in plan.storages)


def module_bytes(module) -> int:
    """Device bytes one executor of ``module`` allocates (a bucketed model: its weights once plus the
    buffers its buckets share)."""
    return module.device_bytes() if getattr(module, "buckets", None) else plan_bytes(module.plan)


def default_replicas(plan, device=None, max_replicas: int = MAX_REPLICAS, nbytes: int | None = None) -> int:
    """How many replicas fit: on GPU, half the free device memory over the plan's bytes (``nbytes`` when
    given); on CPU, the core count; at most ``max_replicas`` and at least 1."""
    if plan.target.get("kind") == "cuda":
        from .device import device_for

        dev = device_for(plan.target, device)
        try:
            free = int(dev.available_global_memory)
        except Exception:
            free = 0
        fit = int(free * GPU_MEMORY_SHARE) // max(nbytes or plan_bytes(plan), 1) if free else 1
    else:
        fit = os.cpu_count() or 1
    return max(1, min(max_replicas, fit))


class NimblePool:
    """``replicas`` executors (``tvm_nimble.NimbleExecutor``) of one model, shared by threads.

    ``pool(*inputs, **named)`` runs one inference on an idle replica (waiting for one when all
    are busy) and returns the outputs as tensors the caller owns. ``replicas`` defaults to
    :func:`default_replicas`. ``device``, ``mode``, ``check_inputs`` and ``check_finite`` are passed to every
    executor.
    """

    def __init__(self, module_or_artifact, replicas: int | None = None, device=None, mode: str | None = None,
                 max_replicas: int = MAX_REPLICAS, check_inputs: bool = True, check_finite: bool = False):
        self.module = load_module(module_or_artifact)
        self.plan = self.module.plan
        if replicas is None:
            replicas = default_replicas(self.plan, device, max_replicas, module_bytes(self.module))
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
        self._executors: list[Executor | BucketedExecutor] = []
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        try:
            for _ in range(replicas):
                ex = NimbleExecutor(self.module, device, mode, check_inputs=check_inputs, check_finite=check_finite)
                self._executors.append(ex)
                self._idle.put(ex)
        except BaseException:
            self.close()
            raise
        self.device = self._executors[0].device
        self.mode = self._executors[0].mode

    @property
    def replicas(self) -> int:
        return len(self._executors)

    def get_num_inputs(self) -> int:
        return len(self.plan.inputs)

    def get_num_outputs(self) -> int:
        return len(self.plan.outputs)

    @contextlib.contextmanager
    def executor(self, timeout: float | None = None):
        """Borrow one replica for this thread alone (e.g. for set_input/run/get_output)."""
        self._check_open()
        try:
            ex = self._idle.get(timeout=timeout)
        except queue.Empty:
            raise NimbleError(f"no idle replica within {timeout} s: all {self.replicas} are busy; "
                              "create the pool with more replicas") from None
        try:
            yield ex
        finally:
            ex.release_thread(threading.current_thread())
            self._idle.put(ex)

    @property
    def batch_sizes(self) -> list[int] | None:
        """The batch buckets of a model built with ``batch_sizes`` (each replica takes any batch), else None."""
        return getattr(self.module, "batch_sizes", None)

    def __call__(self, *inputs, split: bool | None = None, **named) -> list:
        """Run one inference on an idle replica; the outputs are copies the caller owns. ``split=False``
        (bucketed models) refuses a batch over the largest bucket instead of splitting it."""
        with self.executor() as ex:
            if split is not None:
                return ex(*inputs, copy=True, split=split, **named)
            return ex(*inputs, copy=True, **named)

    def _check_open(self) -> None:
        if self._closed:
            raise NimbleError("this NimblePool is closed; create a new one")

    def close(self) -> None:
        """Close every replica (frees their graphs, streams, events and buffers)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for ex in self._executors:
            ex.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        buckets = f", buckets={self.batch_sizes}" if getattr(self, "module", None) is not None and self.batch_sizes else ""
        return f"NimblePool({self.replicas} replicas, mode={getattr(self, 'mode', None)!r}{buckets})"
