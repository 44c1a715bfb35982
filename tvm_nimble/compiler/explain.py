"""``tvm-nimble explain``: what Nimble does to a model (streams, syncs, width, memory, plan, DOT).

It formats a :class:`BuildResult`: the plan's numbers, with the build's :class:`~.report.BuildReport` (what it
chose and measured) among them; nothing is lowered or scheduled a second time.
"""
from __future__ import annotations

from tvm_nimble.codegen.lower_plan import tvm_static_plan_bytes
from tvm_nimble.relay_passes.explain import format_summary, summarize, to_dot
from tvm_nimble.relay_passes.providers import TVM, provider_of

from . import accuracy
from .build import BuildResult, build_with
from .options import BuildOptions
from .profile_report import check_profilable, profile_build


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
    report = result.report
    lines.extend(report.lines(detail=True))  # merges, kernel choice, stream cap, precision, accuracy, layout
    fixed = {k: sum(s.nbytes for s in plan.storages if s.kind == k) for k in ("input", "output", "const")}
    lines.append(f"memory: inputs {_size(fixed['input'])}, outputs {_size(fixed['output'])}, "
                 f"constants {_size(fixed['const'])}, plus the pool below")
    mem = plan.memory
    lines.append(f"memory pool: {mem['pool_bytes_concurrent_safe'] / 1024:.1f} KiB concurrency-safe, "
                 f"{mem['pool_bytes_sequential'] / 1024:.1f} KiB sequential plan, "
                 f"{tvm_static_plan_bytes(result.lowered) / 1024:.1f} KiB TVM StaticPlanBlockMemory (incl. outputs), "
                 f"{mem['pool_bytes_no_reuse'] / 1024:.1f} KiB without reuse")
    phases = report.phases_line()
    if phases:
        lines.append(phases)
    if dot_path:
        with open(dot_path, "w") as f:
            f.write(to_dot(len(program.kernels), edges, assignment, labels=labels, title="tvm-nimble streams"))
        lines.append(f"wrote {dot_path}")
    if show_plan:
        lines.append(plan.format_table())
    if show_ir:
        lines.append(result.annotated_mod["main"].script())
    return "\n".join(lines)


def _kernels_by_provider(result: BuildResult) -> str:
    """One line: how many launches of the plan each kernel provider runs (TVM: tuned or default schedules)."""
    counts: dict[str, int] = {}
    tvm_label = "tvm-tuned" if result.report.options.tuning_db else "tvm-default"
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
