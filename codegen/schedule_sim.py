"""Predict a plan's latency on a GPU model, to choose between schedules before measuring them.

An event-driven simulation of one replay of the plan's CUDA graph:
  * each stream runs its launches in plan order; a launch starts once its stream is free and every
    event it waits on has been recorded, plus ``wait_us`` per cross-stream wait (an event edge in a
    CUDA graph is not free) and ``launch_us`` per kernel (graph node overhead);
  * kernels that run at the same time share the GPU: kernel ``i`` alone would fill ``fill[i]`` of it
    (1.0 = a kernel that keeps every SM busy); while the running kernels' fills add up to more than
    1, each advances at ``1 / sum(fills)`` of its solo speed (processor sharing) less a contention
    loss, so overlapping two kernels that each fill the GPU loses a little, and two that each fill
    half of it run in the time of one.
Durations come from a graph-mode profile of the one-stream replay (``scripts/experiments/kernel_profile.py``),
fills from the kernels' launch shapes or, lacking them, from a calibration against measured
multi-stream runs. Plain Python on a :class:`~tvm_nimble.contract.plan.Plan`: no GPU, no TVM.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GPUModel:
    launch_us: float = 2.0  # per kernel node of the graph
    wait_us: float = 1.0  # per cross-stream event wait
    #: throughput lost while running kernels over-fill the GPU (cache and block-scheduling interference):
    #: at a load of L > 1 each kernel advances at 1 / (L * (1 + contention))
    contention: float = 0.1
    #: the share of the GPU one kernel fills when the caller gives no per-kernel fills
    fill: float = 1.0


#: fitted to six multi-branch nets on an H100 (benchmarks/findings.md, scripts/experiments/calibrate_schedule_sim.py);
#: launch durations from a profile that brackets each launch carry H100_BRACKET_US each
H100 = GPUModel(launch_us=0.0, wait_us=1.0, contention=0.0, fill=0.4)
H100_BRACKET_US = 2.5


def simulate(plan, durations_us, fills=None, gpu: GPUModel | None = None, trace: list | None = None) -> float:
    """Predicted latency (us) of one replay of ``plan``; ``durations_us[i]`` is launch i's solo time.
    ``trace``, when given, receives (start, end) in us per launch position: the planned timeline."""
    gpu = gpu or GPUModel()
    n = len(plan.launches)
    if len(durations_us) != n:
        raise ValueError(f"{len(durations_us)} durations for {n} launches")
    fills = list(fills) if fills is not None else [gpu.fill] * n
    queues: dict[int, list[int]] = {}
    for pos, launch in enumerate(plan.launches):
        queues.setdefault(launch.stream, []).append(pos)
    recorded_at: dict[int, float] = {}  # event -> time it was recorded
    stream_free = {s: 0.0 for s in queues}
    running: dict[int, float] = {}  # launch position -> solo-time work left (us)
    started: dict[int, float] = {}
    now, done = 0.0, 0

    def startable():
        """(launch position, ready time) of every stream head that is not running and whose events are in."""
        out = []
        for s, q in queues.items():
            if not q or q[0] in running:
                continue
            l = plan.launches[q[0]]
            if all(e in recorded_at for e in l.waits):
                ready = max([stream_free[s]] + [recorded_at[e] + gpu.wait_us for e in l.waits]) + gpu.launch_us
                out.append((q[0], ready))
        return out

    while done < n:
        starts = startable()
        for pos, ready in starts:
            if ready <= now + 1e-9:
                running[pos] = float(durations_us[pos])
                started[pos] = now
        pending = [ready for pos, ready in starts if pos not in running]
        if not running:
            if not pending:
                raise RuntimeError("the plan deadlocks: a launch waits on an event that is never recorded")
            now = min(pending)
            continue
        load = sum(fills[p] for p in running)
        rate = 1.0 if load <= 1.0 + 1e-9 else 1.0 / (load * (1.0 + gpu.contention))
        step = min(min(work for work in running.values()) / rate, min(pending, default=float("inf")) - now)
        for p in running:
            running[p] -= step * rate
        now += step
        for p in [p for p, work in running.items() if work <= 1e-9]:
            del running[p]
            launch = plan.launches[p]
            queues[launch.stream].pop(0)
            stream_free[launch.stream] = now
            for e in launch.records:
                recorded_at[e] = now
            done += 1
            if trace is not None:
                trace.append((p, started[p], now))
    if trace is not None:
        trace.sort()
        trace[:] = [(s, e) for _, s, e in trace]
    return now


def best_schedule(candidates: dict, durations_of, fills_of=None, gpu: GPUModel | None = None,
                  memory_budget: int | None = None):
    """The name of the fastest predicted plan among ``candidates`` ({name: plan}) whose concurrency-safe
    pool fits ``memory_budget`` bytes, and every prediction. ``durations_of(plan)`` / ``fills_of(plan)``
    give per-launch solo times and fills in that plan's launch order. Ties go to fewer streams."""
    predictions = {}
    for name, plan in candidates.items():
        if memory_budget is not None and plan.memory.get("pool_bytes", 0) > memory_budget:
            continue
        predictions[name] = simulate(plan, durations_of(plan), fills_of(plan) if fills_of else None, gpu)
    if not predictions:
        raise ValueError(f"no schedule's memory pool fits the budget of {memory_budget} bytes; "
                         "raise the budget or use --max-streams 1")
    best = min(predictions, key=lambda k: (round(predictions[k], 6), candidates[k].num_streams))
    return best, predictions


@dataclass
class Case:
    """One measured replay: a plan, its launches' profiled durations (us, each with the profiler's
    per-launch bracket cost in it) and the measured latency (us) of the unbracketed replay."""

    name: str
    plan: object
    durations_us: list
    measured_us: float


#: the calibration grid: per-launch bracket cost of the profile, event wait, contention, uniform fill
GRID = {"bracket_us": (2.0, 2.5, 3.0, 3.5), "wait_us": (0.0, 1.0, 2.0, 4.0), "contention": (0.0, 0.1, 0.2, 0.4),
        "fill": (0.25, 0.4, 0.55, 0.7, 0.85, 1.0)}


def predict(case: Case, gpu: GPUModel, bracket_us: float) -> float:
    return simulate(case.plan, [max(0.1, d - bracket_us) for d in case.durations_us], None, gpu)


def calibrate(cases: list[Case], launch_us: float | None = None, grid: dict | None = None):
    """Fit a :class:`GPUModel` (and the profile's bracket cost) to measured replays by grid search.

    One-stream replays fix ``launch_us - bracket_us`` (a serial replay is the sum of its kernels plus
    one launch cost each); the rest of the grid is searched on all cases for the least mean absolute
    relative error. Returns (gpu, bracket_us, {case name: error per grid point index}, grid points)
    so callers can also score leave-one-out fits."""
    grid = grid or GRID
    serial = [c for c in cases if c.plan.num_streams == 1]
    if launch_us is None:
        per_launch = [(c.measured_us - sum(c.durations_us)) / len(c.plan.launches) for c in serial]
        offset = sum(per_launch) / len(per_launch) if per_launch else 0.0  # = launch_us - bracket_us
    points = []
    for b in grid["bracket_us"]:
        lu = launch_us if launch_us is not None else max(0.0, b + offset)
        for w in grid["wait_us"]:
            for c in grid["contention"]:
                for f in grid["fill"]:
                    points.append((GPUModel(launch_us=lu, wait_us=w, contention=c, fill=f), b))
    errors = {case.name: [abs(predict(case, g, b) - case.measured_us) / case.measured_us for g, b in points]
              for case in cases}
    best = min(range(len(points)), key=lambda i: sum(e[i] for e in errors.values()))
    return points[best][0], points[best][1], errors, points
