"""``tvm-nimble explain``: what Nimble does to a model (streams, syncs, width, memory, plan, DOT).

It formats a :class:`BuildResult`; nothing is lowered or scheduled a second time.
"""
from __future__ import annotations

from tvm_nimble.codegen.lower_plan import tvm_static_plan_bytes
from tvm_nimble.relay_passes.explain import format_summary, summarize, to_dot
from tvm_nimble.relay_passes.providers import TVM, provider_of

from . import accuracy
from .build import BuildResult, build_with
from .gemm_algorithms import summarize as summarize_gemm_algorithms
from .merge_choice import summarize as summarize_merge
from .options import BuildOptions
from .profile_report import check_profilable, profile_build
from .kernel_choice import from_info as kernel_choice_of, summarize as summarize_kernel_choice, summarize_not_taken
from .stream_choice import summarize as summarize_streams


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def explain_build(result: BuildResult, dot_path=None, show_plan=False, show_ir=False) -> str:
    program, assignment, plan = result.program, result.assignment, result.plan
    edges = program.dependency_edges()
    labels = [k.func for k in program.kernels]
    lines = [format_summary(summarize(len(program.kernels), edges, assignment, labels=labels))]
    lines.append(_kernels_by_provider(result))
    lines.extend(summarize_merge(result.info.get("merge_choice")))
    choice, check = kernel_choice_of(result.info)
    if choice:
        lines.append(summarize_kernel_choice(choice, check, result.info.get("kernel_choice_operators"),
                                             result.info.get("kernel_choice_check_skipped", "")))
        lines.append(f"  {'ops':>4s} {'provider':>9s} {'its ms':>8s} {'tvm ms':>8s}  ran on    operators -> provider call")
        for c in sorted(choice, key=lambda c: -c.count * max(c.vendor_ms, c.tvm_ms)):
            chosen = c.taken_by or ((c.provider or "vendor") if c.kernel == "vendor" else "tvm")
            lines.append(f"  {c.count:4d} {c.provider or 'vendor':>9s} {c.vendor_ms:8.4f} {c.tvm_ms:8.4f}  "
                         f"{chosen:8s}  {c.signature}")
    if result.info.get("gemm_algorithms"):
        lines.extend(summarize_gemm_algorithms(result.info["gemm_algorithms"]))
    lines.extend(summarize_not_taken(result.info.get("not_taken", [])))
    if "streams_choice" in result.info:
        lines.append(summarize_streams(result.info["streams_choice"]))
    lines.extend(_precision_lines(result))
    if result.info.get("layout") == "nhwc":
        lines.append("layout: NHWC inside the build (convolutions and pools channels-last; inputs and outputs keep "
                     "the model's layout)")
    fixed = {k: sum(s.nbytes for s in plan.storages if s.kind == k) for k in ("input", "output", "const")}
    lines.append(f"memory: inputs {_size(fixed['input'])}, outputs {_size(fixed['output'])}, "
                 f"constants {_size(fixed['const'])}, plus the pool below")
    mem = plan.memory
    lines.append(f"memory pool: {mem['pool_bytes_concurrent_safe'] / 1024:.1f} KiB concurrency-safe, "
                 f"{mem['pool_bytes_sequential'] / 1024:.1f} KiB sequential plan, "
                 f"{tvm_static_plan_bytes(result.lowered) / 1024:.1f} KiB TVM StaticPlanBlockMemory (incl. outputs), "
                 f"{mem['pool_bytes_no_reuse'] / 1024:.1f} KiB without reuse")
    if result.info.get("phases"):
        lines.append(summarize_phases(result.info["phases"]))
    if dot_path:
        with open(dot_path, "w") as f:
            f.write(to_dot(len(program.kernels), edges, assignment, labels=labels, title="tvm-nimble streams"))
        lines.append(f"wrote {dot_path}")
    if show_plan:
        lines.append(plan.format_table())
    if show_ir:
        lines.append(result.annotated_mod["main"].script())
    return "\n".join(lines)


def summarize_phases(phases: dict[str, float]) -> str:
    """One line: the seconds of each phase the build ran, in order, and their sum."""
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    return f"build phases: {parts} (total {sum(phases.values()):.1f} s)"


def _precision_lines(result: BuildResult) -> list[str]:
    """The precision, its policy and the accuracy report (for precisions other than fp32)."""
    opts = result.options
    if opts is None or opts.precision == "fp32":
        return []
    lines = [f"precision: {opts.precision}" + (f" ({opts.policy.describe()})" if opts.compute_dtype != "float32"
                                               else " (TF32 tensor cores in cuDNN/cuBLASLt)")]
    if "accuracy" in result.info:
        lines.append(accuracy.describe(result.info["accuracy"]))
    return lines


def _kernels_by_provider(result: BuildResult) -> str:
    """One line: how many launches of the plan each kernel provider runs (TVM: tuned or default schedules)."""
    counts: dict[str, int] = {}
    tvm_label = "tvm-tuned" if result.info.get("tuning_db") else "tvm-default"
    for launch in result.plan.launches:
        name = provider_of(launch.kernel).name
        label = tvm_label if name == TVM else name
        counts[label] = counts.get(label, 0) + 1
    return "kernels by source: " + ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))


def explain_model(model, target="llvm", *, shape_dict=None, dot_path=None, show_plan=False, show_ir=False,
                  profile_png: str | None = None, **options) -> str:
    """Schedule ``model`` and explain the result; ``options`` are :func:`.build.build`'s. Without
    ``profile_png`` no kernel code is generated, so ``auto`` streams cannot measure and keep the widest
    schedule that fits the memory budget; with it the model is built and run on this machine's GPU
    (see :mod:`.profile_report`)."""
    opts = BuildOptions.create(target, **options)
    # kernels are compiled only to run something: a profile, or the accuracy of a reduced precision
    measure_accuracy = opts.precision != "fp32" and accuracy.unmeasurable(opts) is None
    opts = opts.replace(compile_kernels=bool(profile_png) or measure_accuracy)
    if profile_png:  # checked before the build, not after it
        check_profilable(opts.target)
    result = build_with(model, opts, shape_dict=shape_dict)
    if getattr(result, "buckets", None):  # batch_sizes: the buckets, then the largest in full
        from .buckets import describe_buckets

        lines = describe_buckets(result)
        result = result.buckets[max(result.buckets)]
        text = "\n".join(lines + [explain_build(result, dot_path=dot_path, show_plan=show_plan, show_ir=show_ir)])
    else:
        text = explain_build(result, dot_path=dot_path, show_plan=show_plan, show_ir=show_ir)
    if profile_png:
        text += "\n" + "\n".join(profile_build(result, profile_png))
    return text
