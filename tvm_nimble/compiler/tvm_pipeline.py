"""Make Nimble a TVM build option: ``tvm.compile(mod, target, relax_pipeline="nimble")``.

Importing ``tvm_nimble`` registers:
  * the Relax pipeline ``nimble``: TVM's kernel passes, Nimble's stream annotation, and the
    launch plan embedded in the executable (two extra Relax functions, ``__nimble_plan__``
    returning the plan JSON and ``__nimble_params__`` returning the constants), then TVM's
    usual VM finalization. The result is an ordinary TVM executable: ``export_library`` and
    ``tvm.runtime.load_module`` work as usual, the Relax VM can run it (sequentially, the
    markers are no-ops there), and ``NimbleExecutor`` replays it multi-stream.
  * the packed functions behind the ``nimble.*`` markers, so the VM can execute them;
  * target tags for the GPUs we run on: ``nimble/h100`` and ``nimble/h200`` (sm_90).
"""
from __future__ import annotations

import tvm

from tvm_nimble.runtime.executable import PARAMS_FUNC, PLAN_FUNC, register_markers

from .target import CUDA_LIMITS

TAGS = {
    "nimble/h100": {"kind": "cuda", "arch": "sm_90", **CUDA_LIMITS, "l2_cache_size_bytes": 52428800},
    "nimble/h200": {"kind": "cuda", "arch": "sm_90", **CUDA_LIMITS, "l2_cache_size_bytes": 62914560},
}


def attach_plan(mod: tvm.IRModule, plan, params: dict) -> tvm.IRModule:
    """Add ``__nimble_plan__`` (plan JSON) and ``__nimble_params__`` (constants) to ``mod``."""
    from tvm import relax

    bb = relax.BlockBuilder(mod)
    with bb.function(PLAN_FUNC, []):
        bb.emit_func_output(tvm.ir.StringImm(plan.to_json(indent=None)))
    with bb.function(PARAMS_FUNC, []):
        bb.emit_func_output(relax.Tuple([relax.const(params[f"c{c}"]) for c in plan.constants]))
    return bb.get()


def nimble_pipeline(max_streams: int | None = None, tuning_db: str | None = None):
    """The ``nimble`` Relax pipeline (see module docstring)."""
    from tvm_nimble.relay_passes.pipeline import backend_for

    from .build import lower, schedule
    from .tuning.database import open_tuning_database

    @tvm.transform.module_pass(opt_level=0, name="nimble.Pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if target is None:
            raise ValueError("the nimble pipeline needs a target: tvm.compile(mod, target, relax_pipeline='nimble')")
        database = open_tuning_database(tuning_db) if tuning_db else None
        annotated, _, _, plan, params = schedule(lower(mod, target, database), target, max_streams=max_streams)
        mod = attach_plan(annotated, plan, params)
        with target:
            return tvm.transform.Sequential(list(backend_for(target).finalize_passes(target)))(mod)

    return _pipeline


def register() -> None:
    from tvm import relax

    if "nimble" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("nimble")(nimble_pipeline)
    existing = set(tvm.target.tag.list_tags())
    for name, config in TAGS.items():
        if name not in existing:
            tvm.target.tag.register_tag(name, config)
    register_markers()
