"""The compiler side's uses of TVM's private or unstable API, and nothing else.

Each function wraps one such use and says in one line why no public API does. They are pinned to
apache-tvm 0.27.0.post1 (see pyproject.toml); when TVM changes one of these internals, this file is the
one to update. What the project builds on them lives with its callers: the guarded DLight schedules in
``relay_passes.schedules``, the split CUDA compile in ``codegen.cuda_split``, tuning in
``tvm_nimble.compiler.tuning``. The runtime has its own, ``tvm_nimble.runtime.tvm_compat`` (the runtime never
imports the compiler side); ``tests/test_layout.py`` checks that no other module uses TVM's private API.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys

from tvm_nimble import env

# TVMScript's decorator modules; each calls ``inspect.stack()`` once per parsed function.
_TVMSCRIPT_ENTRIES = ("tvm.tirx.script.parser.entry", "tvm.script.parser.ir.entry")
TENSOR_INTRIN = "tvm.s_tir.tensor_intrin"


def _cheap_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` as TVMScript's decorators use it: every frame, source lines for the nearest three.

    ``inspect.stack()`` resolves the module of every frame on the stack, and for a frame
    without a source file (the ``<frozen importlib._bootstrap>`` frames of an import) that
    scans all of ``sys.modules``. TVMScript's decorators read ``.frame`` of the outer frames
    and ``code_context``/``lineno`` of ``stack[2]`` only, so deeper frames skip that lookup
    (their ``code_context`` is None).
    """
    frame, infos = sys._getframe(1), []
    while frame is not None:
        if len(infos) < 3:
            tb = inspect.getframeinfo(frame, context)
            extra = {"positions": tb.positions} if hasattr(tb, "positions") else {}  # Python >= 3.11
            infos.append(inspect.FrameInfo(frame, *tb[:5], **extra))
        else:
            code = frame.f_code
            infos.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
        frame = frame.f_back
    return infos


class _CheapStackInspect:
    """``inspect`` as TVMScript's decorator modules see it inside :func:`cheap_tvmscript_stacks`."""

    stack = staticmethod(_cheap_stack)

    def __getattr__(self, name):
        return getattr(inspect, name)


@contextlib.contextmanager
def cheap_tvmscript_stacks():
    """TVMScript's decorators take the call stack with :func:`_cheap_stack` within this context.

    Private: swaps the ``inspect`` name of TVMScript's decorator modules, which offer no option to
    skip the stack walk. The one place this matters: ``tvm.s_tir.tensor_intrin`` (TVM's tensor-core
    intrinsics), which DLight's GPU Matmul rule imports the first time it tensorizes a float16 (or int8)
    matmul. That import parses ~250 TVMScript functions, each taking ``inspect.stack()``, at a cost of
    (import frames on the stack) x ``len(sys.modules)`` each, which dominates a first fp16 CUDA build
    (``benchmarks/findings.md``). Only the decorator modules' ``inspect`` name is swapped (the global
    module is untouched) and it is restored on exit; if TVM's internals move, this is a no-op.
    """
    with contextlib.ExitStack() as restore:
        for name in _TVMSCRIPT_ENTRIES:
            try:
                entry = importlib.import_module(name)
            except ImportError:
                continue
            if getattr(entry, "inspect", None) is inspect:
                entry.inspect = _CheapStackInspect()
                restore.callback(setattr, entry, "inspect", inspect)
        yield


def import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics within :func:`cheap_tvmscript_stacks`, unless already imported.

    MetaSchedule imports them in every TuneContext and every builder worker before its first build;
    this makes that import cheap there too. Internal: ``TENSOR_INTRIN``, the module whose import registers them
    (TVM has no public call that does)."""
    if TENSOR_INTRIN in sys.modules:
        return
    with cheap_tvmscript_stacks():
        importlib.import_module(TENSOR_INTRIN)


def onnx_converter_map() -> dict:
    """The Relax ONNX importer's table of converters.

    Private: ``onnx_frontend._get_convert_map``; the importer offers no public list of the operators it takes."""
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()


def measure_callback(fn, mean_us):
    """A MetaSchedule measure callback calling fn(task_id in the call, [run us or None per trial],
    [the runner's error message or None per trial]).

    Unstable: MetaSchedule's Python-derived objects (``derived_object``, ``PyMeasureCallback``) and the fields of
    its runner results, which moved with ``tvm.meta_schedule`` -> ``tvm.s_tir.meta_schedule``."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class _Callback(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            fn(int(task_id), [mean_us(r.run_secs) for r in runner_results],
               [str(r.error_msg) if r.error_msg else None for r in runner_results])

    return _Callback()


def _build_in_worker(args):
    """One MetaSchedule build in a builder worker (runs there; pickled by reference).

    Private: ``local_builder._worker_func``, LocalBuilder's own build step, so that ours builds exactly as it does."""
    from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func  # pinned TVM

    import_tensor_intrinsics()  # cheaply, before _worker_func does it the slow way
    return _worker_func(*args)


#: the fewest builds a builder worker is started for: a worker's start (TVM and its tensor intrinsics imported)
#: costs the CPU of many candidates' builds (benchmarks/findings.md, 'Where the test suite's CPU goes'), so a batch
#: of a few builds gets one worker, not one a core
BUILDS_PER_WORKER = 4


def lasting_builder(timeout_sec: float):
    """MetaSchedule's LocalBuilder, but its worker processes live until ``close()``, not one build batch.

    Its first batch sizes the pool: a worker per ``BUILDS_PER_WORKER`` builds, at most one a core.
    LocalBuilder starts fresh workers for every batch (TVM's guard against a slow leak in long-lived
    workers) and each fresh worker imports TVM's tensor intrinsics before its first build (30-70 s on a
    2-core machine done plainly; see ``import_tensor_intrinsics``), paid once per MetaSchedule iteration.
    ``tuning.tune`` closes it every few rounds instead, so that rounds that start workers are known and timed apart.

    Private: ``local_builder._serialize_params`` and the worker step above; LocalBuilder has no option to keep its
    workers."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params  # pinned TVM
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    @derived_object
    class _Builder(PyBuilder):
        pool, batches = None, 0

        def build(self, build_inputs):
            if self.pool is None:
                # a worker imports TVM, whose tvm_ffi imports PyTorch and probes torch.cuda.is_available(),
                # initializing CUDA (seconds per worker on a GPU machine); builders need neither
                env.quiet_torch_interop()
                workers = -(-len(build_inputs) // BUILDS_PER_WORKER)
                self.pool = PopenPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, workers)),
                                              timeout=timeout_sec)
            self.batches += 1
            results = []
            for r in self.pool.map_with_error_catching(
                    _build_in_worker,
                    [(None, None, b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]):
                if r.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(r.value, None))
                elif r.status == StatusKind.TIMEOUT:
                    results.append(BuilderResult(None, f"LocalBuilder: Timeout, killed after {timeout_sec} seconds"))
                else:
                    results.append(BuilderResult(None, f"LocalBuilder: An exception occurred\n{r.value}"))
            return results

        def close(self):
            if self.pool is not None:
                self.pool.shutdown()
            self.pool, self.batches = None, 0

    return _Builder()


@contextlib.contextmanager
def unnamed_log_handlers_detached(name: str = "tvm.s_tir.meta_schedule"):
    """MetaSchedule's logging setup names its logger's current handlers in a dictConfig and fails on an
    unnamed one (pytest attaches its capture handlers to every non-propagating logger): keep them off.

    Internal: works around how TVM's MetaSchedule configures its logger, which it offers no option for."""
    logger = logging.getLogger(name)
    unnamed = [h for h in logger.handlers if h.get_name() is None]
    for h in unnamed:
        logger.removeHandler(h)
    try:
        yield
    finally:
        for h in unnamed:
            logger.addHandler(h)


def default_schedule_rules(schedule_pass) -> list | None:
    """The rules of DLight's ``ApplyDefaultSchedule`` pass ``schedule_pass``, or None for any other pass.

    Private: ``_inst``, the Python instance behind a pass made by ``module_pass`` on a class; a pass object
    offers its name, not its rules."""
    inst = getattr(schedule_pass, "_inst", None)
    rules = getattr(inst, "rules", None)
    if type(inst).__name__ != "ApplyDefaultSchedule" or not rules:
        return None
    return list(rules)


def dlight_apply_rules(func, target, rules: list):
    """The first of ``rules`` that schedules the PrimFunc ``func`` for ``target``, as DLight applies them:
    a list of schedules, or None where none applies.

    Private: ``dlight.base.transform._apply_rules``, the loop of ``ApplyDefaultSchedule`` (so that a pass
    replacing it applies rules exactly as DLight does)."""
    from tvm.s_tir.dlight.base.transform import _apply_rules

    return _apply_rules(func, target, rules, tunable=False)


def dlight_is_scheduled(func) -> bool:
    """Whether DLight counts the PrimFunc ``func`` as scheduled already (and leaves it alone).

    Private: ``dlight.base.transform._is_scheduled``: which attribute marks it is DLight's business."""
    from tvm.s_tir.dlight.base.transform import _is_scheduled

    return _is_scheduled(func)


def dlight_target(func):
    """The target DLight schedules the PrimFunc ``func`` for: its own ``target`` attribute, else the current one.

    Private: ``dlight.base.transform._get_target``."""
    from tvm.s_tir.dlight.base.transform import _get_target

    return _get_target(func)


def nvcc_ptxas_flags() -> list[str]:
    """The ptxas options TVM's nvcc compile passes (``--ptxas-options``), environment overrides included.

    Private: ``tvm.support.nvcc._ptxas_option_flags``; TVM's compile offers no way to read its options."""
    from tvm.support import nvcc

    return list(nvcc._ptxas_option_flags())
