"""The Nimble lowering pipeline: TVM's own passes up to ``CallTIRRewrite``, then stream annotation.

We reuse TVM's per-target pipeline pieces (library dispatch, legalization + fusion, DLight
default schedules on GPUs, dataflow lowering) so Nimble runs exactly the kernels stock TVM
would. Memory planning is left to codegen: TVM's ``StaticPlanBlockMemory`` assumes one
sequential order, which is unsafe once kernels run on several streams.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .annotate import AnnotateStreams


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


def kernel_passes(target: tvm.target.Target, tuning_database=None) -> list[tvm.transform.Pass]:
    """Passes that produce the kernels: legalize, fuse, schedule (tuned database or DLight)."""
    backend = backend_for(target)
    passes = list(backend.library_dispatch_passes(target))
    legalize = list(backend.legalize_passes(target))
    if tuning_database is not None:
        # Tuned kernels replace the default schedule: apply the database right after fusion,
        # before the GPU backends' DLight pass (their last legalize pass) schedules the rest.
        with target:  # the pass reads the target when it is created
            apply_db = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)
        if target.kind.name == "llvm":
            legalize = legalize + [apply_db]
        else:
            legalize = legalize[:-1] + [apply_db] + legalize[-1:]
    passes += legalize
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
