"""The Nimble lowering pipeline: TVM's own passes up to ``CallTIRRewrite``, then stream annotation.

We reuse TVM's per-target pipeline pieces (library dispatch, legalization + fusion, DLight
default schedules on GPUs, dataflow lowering) so Nimble runs exactly the kernels stock TVM
would. Memory planning is left to codegen: TVM's ``StaticPlanBlockMemory`` assumes one
sequential order, which is unsafe once kernels run on several streams.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys

import tvm
from tvm import relax

from .annotate import AnnotateStreams

# TVMScript's decorator modules; each calls ``inspect.stack()`` once per parsed function.
_TVMSCRIPT_ENTRIES = ("tvm.tirx.script.parser.entry", "tvm.script.parser.ir.entry")
_TENSOR_INTRIN = "tvm.s_tir.tensor_intrin"


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

    The one place this matters: ``tvm.s_tir.tensor_intrin`` (TVM's tensor-core intrinsics), which
    DLight's GPU Matmul rule imports the first time it tensorizes a float16 (or int8) matmul.
    That import parses ~250 TVMScript functions, each taking ``inspect.stack()``, at a cost of
    (import frames on the stack) x ``len(sys.modules)`` each: the first fp16 CUDA build of
    googlenet spent over a minute there on a 2-core CPU, more with PyTorch loaded. Only the
    decorator modules' ``inspect`` name is swapped (the global module is untouched) and it is
    restored on exit; if TVM's internals move, this is a no-op.
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
    this makes that import cheap there too."""
    if _TENSOR_INTRIN in sys.modules:
        return
    with cheap_tvmscript_stacks():
        importlib.import_module(_TENSOR_INTRIN)


def _with_cheap_tvmscript_stacks(p: tvm.transform.Pass) -> tvm.transform.Pass:
    """``p`` run within :func:`cheap_tvmscript_stacks` until the tensor-core intrinsics are imported."""

    @tvm.transform.module_pass(opt_level=0, name=f"nimble.CheapTVMScriptStacks[{p.info.name}]")
    def _pass(mod, _ctx):
        if _TENSOR_INTRIN in sys.modules:
            return p(mod)
        with cheap_tvmscript_stacks():
            return p(mod)

    return _pass


def backend_for(target: tvm.target.Target):
    kind = target.kind.name
    if kind == "cuda":
        from tvm.relax.backend.cuda import pipeline as backend
    elif kind == "llvm":
        from tvm.relax.backend.cpu_generic import pipeline as backend
    elif "gpu" in target.keys:
        from tvm.relax.backend.gpu_generic import pipeline as backend
    else:
        raise ValueError(f"target kind '{kind}' is not supported by tvm-nimble (use cuda or llvm)")
    return backend


def _split_legalize(target: tvm.target.Target) -> tuple[list, list]:
    """(library dispatch + legalize + fuse, schedule) of TVM's backend pipeline for ``target``."""
    backend = backend_for(target)
    legalize = list(backend.legalize_passes(target))
    # The GPU backends end legalization with DLight's default schedule; the CPU backend has none.
    fuse, schedule = (legalize, []) if target.kind.name == "llvm" else (legalize[:-1], legalize[-1:])
    return list(backend.library_dispatch_passes(target)) + fuse, schedule


def fusion_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Passes that produce the fused, not yet scheduled kernels: what tuning extracts its tasks from."""
    return _split_legalize(target)[0]


def kernel_passes(target: tvm.target.Target, tuning_database=None) -> list[tvm.transform.Pass]:
    """Passes that produce the kernels: legalize, fuse, schedule (tuned database or DLight)."""
    backend = backend_for(target)
    passes, schedule = _split_legalize(target)
    if tuning_database is not None:
        # Tuned kernels replace the default schedule: apply the database right after fusion,
        # before DLight schedules the rest.
        with target:  # the pass reads the target when it is created
            schedule.insert(0, relax.transform.MetaScheduleApplyDatabase(enable_warning=False))
    # Scheduling may tensorize fp16/int8 matmuls, which imports TVM's tensor-core intrinsics.
    passes += [_with_cheap_tvmscript_stacks(p) for p in schedule]
    passes += list(backend.dataflow_lower_passes(target))
    return passes


def nimble_lowering(target: tvm.target.Target, max_streams: int | None = None,
                    tuning_database=None) -> tvm.transform.Pass:
    """Everything stage 1 does: TVM lowering to explicit kernel calls + Nimble annotation."""
    seq = tvm.transform.Sequential(kernel_passes(target, tuning_database) + [AnnotateStreams(max_streams)],
                                   name="nimble.lowering")

    @tvm.transform.module_pass(opt_level=0, name="nimble.Lower")
    def _pass(mod, _ctx):
        with target:
            if tuning_database is not None:
                with tuning_database:
                    return seq(mod)
            return seq(mod)

    return _pass


def lower_and_annotate(mod: tvm.IRModule, target, max_streams: int | None = None,
                       tuning_database=None) -> tvm.IRModule:
    """Convenience: run :func:`nimble_lowering` on ``mod`` for ``target`` (dict, str or Target)."""
    if not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    return nimble_lowering(target, max_streams, tuning_database)(mod)
