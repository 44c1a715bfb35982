"""The Nimble lowering pipeline: TVM's own passes up to ``CallTIRRewrite``, then stream annotation.

We reuse TVM's per-target pipeline pieces (library dispatch, legalization + fusion, DLight
default schedules on GPUs, dataflow lowering) so Nimble runs exactly the kernels stock TVM
would. Memory planning is left to codegen: TVM's ``StaticPlanBlockMemory`` assumes one
sequential order, which is unsafe once kernels run on several streams.
"""
from __future__ import annotations

import sys

import tvm
from tvm import relax

from .annotate import AnnotateStreams
from .concat_in_place import ConcatInPlace, FlattenConcats
from .tvm_compat import TENSOR_INTRIN, cheap_tvmscript_stacks, tolerant_default_schedule

def _with_cheap_tvmscript_stacks(p: tvm.transform.Pass) -> tvm.transform.Pass:
    """``p`` run within :func:`cheap_tvmscript_stacks` until the tensor-core intrinsics are imported."""

    @tvm.transform.module_pass(opt_level=0, name=f"nimble.CheapTVMScriptStacks[{p.info.name}]")
    def _pass(mod, _ctx):
        if TENSOR_INTRIN in sys.modules:
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
    schedule = [tolerant_default_schedule(p) for p in schedule]
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
    """Everything stage 1 does: TVM lowering to explicit kernel calls, concatenations built in place,
    Nimble annotation."""
    passes = [FlattenConcats()] + kernel_passes(target, tuning_database) + [ConcatInPlace(), AnnotateStreams(max_streams)]
    seq = tvm.transform.Sequential(passes,
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
