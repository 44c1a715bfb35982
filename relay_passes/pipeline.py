"""The one builder of TVM's pass lists, for Nimble's build, the stock-TVM baseline and tuning.

We reuse TVM's per-target pipeline pieces (library dispatch, legalization + fusion, DLight
default schedules on GPUs, dataflow lowering) so Nimble runs exactly the kernels stock TVM
would. Memory planning is left to codegen: TVM's ``StaticPlanBlockMemory`` assumes one
sequential order, which is unsafe once kernels run on several streams.

- :func:`fusion_passes`: up to fused, unscheduled kernels (what tuning extracts its tasks from);
- :func:`kernel_passes`: fused and scheduled kernels as explicit calls (``CallTIRRewrite``), with
  concatenations built in place when asked: what Nimble schedules onto streams;
- :func:`finalize_passes`: TVM's VM finalization (stock TVM's memory planning included);
- :func:`run_passes`: a list applied under the target and the tuning database.
"""
from __future__ import annotations

import contextlib
import sys

import tvm
from tvm import relax

from .concat_in_place import ConcatInPlace, FlattenConcats
from .merge_siblings import SplitViews
from .fold_constants import BatchedFoldConstant
from .fusible_gathers import fusible_gathers
from .precision import round_once_per_kernel, widen_elementwise
from .schedules import guarded_rules, tolerant_default_schedule
from .tvm_compat import TENSOR_INTRIN, cheap_tvmscript_stacks

#: the pass that ends TVM's GPU legalization: DLight's default schedules (the CPU backend has none)
DEFAULT_SCHEDULE = "ApplyDefaultSchedule"


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


def _legalize(target: tvm.target.Target) -> tuple[list, list]:
    """(library dispatch + legalize + fuse, default schedule) of TVM's backend pipeline for ``target``, after
    the mixed-precision policy's fp32 element-wise chains (``precision.widen_elementwise``, and
    ``round_once_per_kernel`` after FuseOps: no-ops for a module ``to_precision`` did not mark). Each
    ``FoldConstant`` is preceded by :func:`.fold_constants.BatchedFoldConstant`, which evaluates the same
    calls with one build per round instead of one per call (the module that comes out is the same)."""
    backend = backend_for(target)
    legalize = list(backend.legalize_passes(target))
    schedule = [tolerant_default_schedule(p) for p in legalize if p.info.name == DEFAULT_SCHEDULE]
    fuse = [p for p in legalize if p.info.name != DEFAULT_SCHEDULE]
    fuse = [q for p in fuse for q in ([p, round_once_per_kernel] if p.info.name == "FuseOps" else
                                      [BatchedFoldConstant(), p] if p.info.name == "FoldConstant" else
                                      [p, fusible_gathers] if p.info.name == "AnnotateTIROpPattern" else [p])]
    return [widen_elementwise] + list(backend.library_dispatch_passes(target)) + fuse, schedule


def default_schedule_rules(target: tvm.target.Target, stock: tuple[str, ...]) -> tuple[list, tuple]:
    """(DLight's default rules of ``target``'s GPU pipeline, guarded as the pipeline applies them, and the key naming
    them: :func:`.schedules.guarded_rules`); ``stock``: which of our schedules DLight's own replace."""
    with target:
        passes = [p for p in backend_for(target).legalize_passes(target) if p.info.name == DEFAULT_SCHEDULE]
    if len(passes) != 1:
        raise ValueError(f"{len(passes)} {DEFAULT_SCHEDULE} passes in the pipeline of {target.kind.name}")
    return guarded_rules(passes[0], stock)


def fusion_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Passes that produce the fused, not yet scheduled kernels: what tuning extracts its tasks from."""
    return _legalize(target)[0]


def kernel_passes(target: tvm.target.Target, tuning_database=None,
                  concat_in_place: bool = False, split_views: bool = False) -> list[tvm.transform.Pass]:
    """Passes that produce the kernels: legalize, fuse, schedule (tuned database or DLight), lower the
    dataflow to explicit calls; with ``concat_in_place``, nested concatenations are flattened first and
    the kernels feeding a concatenation write into its slices (:mod:`.concat_in_place`); with
    ``split_views``, the contiguous parts of a split are read as slices of its input, no copy
    (:func:`.merge_siblings.split_views`: only for Nimble's plan, whose memory planner sees the views;
    TVM's VM planner does not, so the builds it runs keep their split kernels)."""
    passes, schedule = _legalize(target)
    if tuning_database is not None:
        # Tuned kernels replace the default schedule: apply the database right after fusion,
        # before DLight schedules the rest.
        with target:  # the pass reads the target when it is created
            schedule.insert(0, relax.transform.MetaScheduleApplyDatabase(enable_warning=False))
    # Scheduling may tensorize fp16/int8 matmuls, which imports TVM's tensor-core intrinsics.
    passes += [_with_cheap_tvmscript_stacks(p) for p in schedule]
    passes += list(backend_for(target).dataflow_lower_passes(target))
    if concat_in_place:
        passes = [FlattenConcats()] + passes + [ConcatInPlace()]
    if split_views:
        passes = [SplitViews()] + passes
    return passes


def finalize_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """TVM's VM finalization for ``target``."""
    return list(backend_for(target).finalize_passes(target))


def run_passes(passes: list, mod: tvm.IRModule, target: tvm.target.Target, tuning_database=None) -> tvm.IRModule:
    """``passes`` applied to ``mod`` within ``target`` and ``tuning_database`` (MetaSchedule reads both
    from the context)."""
    # an empty Database is falsy: compare with None
    with target, (tuning_database if tuning_database is not None else contextlib.nullcontext()):
        return tvm.transform.Sequential(passes)(mod)
