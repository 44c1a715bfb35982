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

from tvm_nimble.contract.markers import PARAMS_FUNC, PLAN_FUNC
from tvm_nimble.runtime.executable import register_markers

from .target import CUDA_LIMITS, resolve_target

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
    """The ``nimble`` Relax pipeline (see module docstring): TVM's kernels as they are (no providers, no
    measurement: TVM's pipeline hands over a module and a target, nothing else), Nimble's schedule."""
    from tvm_nimble.relay_passes.pipeline import finalize_passes

    from .options import BuildOptions
    from .stages import build_fixed

    @tvm.transform.module_pass(opt_level=0, name="nimble.Pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if target is None:
            raise ValueError("the nimble pipeline needs a target: tvm.compile(mod, target, relax_pipeline='nimble')")
        resolve_target(target)  # the checks tvm_nimble.build makes: a CUDA target without its arch is refused
        options = BuildOptions(target, kernels="tvm", max_streams=max_streams, tuning_db=tuning_db,
                               compile_kernels=False)
        result = build_fixed(mod, options)
        mod = attach_plan(result.annotated_mod, result.plan, result.params)
        with target:
            return tvm.transform.Sequential(finalize_passes(target))(mod)

    return _pipeline


def register() -> None:
    import tvm_ffi
    from tvm import relax

    from tvm_nimble import errors

    # an error raised in the pipeline crosses TVM's C++ on its way back to tvm.compile's caller, which would
    # get a RuntimeError: registered, it arrives as the NimbleError it is
    for cls in (errors.NimbleError, errors.ModelError, errors.ShapeError, errors.UnsupportedOperatorError):
        tvm_ffi.register_error(cls)

    if "nimble" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("nimble")(nimble_pipeline)
    existing = set(tvm.target.tag.list_tags())
    for name, config in TAGS.items():
        if name not in existing:
            tvm.target.tag.register_tag(name, config)
    register_markers()
