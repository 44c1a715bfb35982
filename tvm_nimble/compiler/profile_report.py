"""``tvm-nimble explain --profile``: a GPU run's timeline, planned against measured, and its bound.

On the GPU the model was built for, the built plan and its one-stream variant (same kernels) are
replayed: unbracketed for their latencies, and with an event pair around every launch for the
per-launch timeline. The one-stream durations give the critical-path bound (the longest path
through the plan's dependencies) and the serial sum. The calibrated simulator
(``codegen.schedule_sim.H100``) gives the planned timeline of the same plan from those durations.
One picture shows both timelines per stream, the critical path marked.
"""
from __future__ import annotations

from tvm_nimble.codegen.critical_path import critical_path, serial_sum
from tvm_nimble.codegen.schedule_sim import H100, H100_BRACKET_US, simulate
from tvm_nimble.errors import NimbleError

from .stream_choice import rescheduled
from .target import local_gpu_arch
from .timers import LocalGPU, has_gpu_for

REPS = 5


def check_profilable(target) -> None:
    """One line unless ``target`` is CUDA and this machine has a GPU of its arch."""
    if target.kind.name != "cuda":
        raise NimbleError("explain --profile runs the model on a GPU: use --target cuda")
    if not has_gpu_for(LocalGPU(), target):
        local = local_gpu_arch()
        raise NimbleError(f"explain --profile runs the model on a {target.attrs['arch']} GPU and this machine has "
                          f"{'a ' + local if local else 'none'}; run it there")


def profile_build(result, png_path: str, reps: int = REPS) -> list[str]:
    """Profile ``result`` (a BuildResult with kernels) on this machine's GPU; write the picture; return text lines."""
    from tvm_nimble.runtime.timing import replay_ms, timeline

    t = result.tvm_target
    check_profilable(t)
    if result.kernels is None:
        raise NimbleError("explain --profile needs the compiled kernels (build with compile_kernels=True)")
    single = rescheduled(result, 1)
    if [l.kernel for l in single.plan.launches] != [l.kernel for l in result.plan.launches]:
        raise NimbleError("explain --profile: the one-stream plan launches in another order than the built one")
    multi_ms, single_ms = replay_ms([result, single]).median()
    measured, one_stream = timeline(result, reps), timeline(single, reps)
    durations = [end - start for _, start, end in one_stream]  # the same launch order in both plans
    bound, path = critical_path(result.plan, durations)
    serial = serial_sum(durations)
    planned: list = []
    predicted_us = simulate(result.plan, [max(0.1, d * 1e3 - H100_BRACKET_US) for d in durations], None, H100,
                            trace=planned)
    _draw(png_path, result.plan, measured, planned, set(path), multi_ms, predicted_us / 1e3)
    lines = [f"profile on this GPU: {result.plan.num_streams}-stream graph {multi_ms:.3f} ms, one-stream graph "
             f"{single_ms:.3f} ms ({single_ms / multi_ms:.2f}x)",
             f"critical-path bound {bound:.3f} ms (one-stream kernel durations along the plan's dependencies), "
             f"serial sum {serial:.3f} ms: measured / bound {multi_ms / bound:.2f}",
             f"planned (simulator, H100 calibration) {predicted_us / 1e3:.3f} ms: {predicted_us / 1e3 / multi_ms - 1:+.1%} "
             "against the measurement",
             f"wrote {png_path}"]
    return lines


def _draw(path, plan, measured, planned, on_path, measured_ms, planned_ms):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise NimbleError("explain --profile draws with matplotlib: pip install 'tvm-nimble[bench]'") from None
    origin = min(s for _, s, _ in measured)
    fig, axes = plt.subplots(2, 1, figsize=(14, 2 + 0.5 * plan.num_streams * 2), sharex=True)
    for ax, title, rows in ((axes[0], f"measured, {measured_ms:.3f} ms", [(st, s - origin, e - origin) for st, s, e in measured]),
                            (axes[1], f"planned (simulator), {planned_ms:.3f} ms",
                             [(l.stream, s / 1e3, e / 1e3) for l, (s, e) in zip(plan.launches, planned)])):
        for pos, (stream, start, end) in enumerate(rows):
            color = "tab:red" if pos in on_path else "tab:blue"
            ax.barh(stream, end - start, left=start, height=0.8, color=color, edgecolor="white", linewidth=0.3)
        ax.set_yticks(range(plan.num_streams))
        ax.set_yticklabels([f"stream {s}" for s in range(plan.num_streams)])
        ax.invert_yaxis()
        ax.set_title(title + " (red: the critical path of the one-stream durations)", fontsize=9)
    axes[1].set_xlabel("ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
