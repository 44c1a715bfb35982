"""``tvm-nimble explain``: what Nimble does to a model (streams, syncs, width, plan, DOT)."""
from __future__ import annotations

import tvm

from tvm_nimble.relay_passes.annotate import annotate_function
from tvm_nimble.relay_passes.explain import format_summary, summarize, to_dot
from tvm_nimble.relay_passes.lowered_ir import read_lowered_function
from tvm_nimble.relay_passes.pipeline import kernel_passes

from .builder import normalize_target


def explain_model(model, target, shape_dict=None, max_streams=None, dot_path=None, show_plan=False,
                  show_ir=False) -> str:
    from tvm_nimble.codegen.lower_plan import build_plan, tvm_static_plan_bytes

    from .builder import target_dict
    from .frontend import from_onnx

    t = normalize_target(target)
    mod = model if isinstance(model, tvm.IRModule) else from_onnx(model, shape_dict=shape_dict)
    with t:
        lowered = tvm.transform.Sequential(kernel_passes(t))(mod)
    program = read_lowered_function(lowered)
    edges = program.dependency_edges()
    func, assignment = annotate_function(lowered, max_streams=max_streams)
    labels = [k.func for k in program.kernels]
    summary = summarize(len(program.kernels), edges, assignment, labels=labels)
    annotated = lowered.clone() if hasattr(lowered, "clone") else tvm.IRModule(lowered.functions)
    annotated["main"] = func
    plan, _ = build_plan(annotated, target_dict(t))
    lines = [format_summary(summary)]
    mem = plan.memory
    lines.append(f"memory pool: {mem['pool_bytes_concurrent_safe'] / 1024:.1f} KiB concurrency-safe, "
                 f"{mem['pool_bytes_sequential'] / 1024:.1f} KiB sequential plan, "
                 f"{tvm_static_plan_bytes(lowered) / 1024:.1f} KiB TVM StaticPlanBlockMemory (incl. outputs), "
                 f"{mem['pool_bytes_no_reuse'] / 1024:.1f} KiB without reuse")
    if dot_path:
        with open(dot_path, "w") as f:
            f.write(to_dot(len(program.kernels), edges, assignment, labels=labels, title="tvm-nimble streams"))
        lines.append(f"wrote {dot_path}")
    if show_plan:
        lines.append(plan.format_table())
    if show_ir:
        lines.append(annotated["main"].script())
    return "\n".join(lines)
