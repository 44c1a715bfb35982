"""The schedule simulator on hand-made plans whose best schedule is known: a chain, a fork-join where
one stream is best (kernels that each fill the GPU), and one where a cap of 2 streams is best."""
import pytest

from tvm_nimble.codegen.schedule_sim import GPUModel, best_schedule, simulate
from tvm_nimble.contract.plan import Launch, Plan, Storage, TensorSlot


def fork_join(streams_of_branches, n_branches=4):
    """k0 -> n branches -> join; branch b runs on stream streams_of_branches[b] (stream 0 holds k0 and the join)."""
    n_t = n_branches + 3
    tensors = [TensorSlot(i, f"t{i}", [4], "float32", "input" if i == 0 else "intermediate", i) for i in range(n_t)]
    storages = [Storage(i, 16, "input" if i == 0 else "pool") for i in range(n_t)]
    launches, events = [Launch(0, "k0", [0, 1], [1], 0)], 0
    fork_event = None
    if any(s != 0 for s in streams_of_branches):
        fork_event, events = 0, 1
        launches[0].records.append(fork_event)
    branch_records = []
    for b, s in enumerate(streams_of_branches):
        l = Launch(len(launches), f"b{b}", [1, 2 + b], [2 + b], s)
        if s != 0 and not any(x.stream == s for x in launches[1:]):
            l.waits.append(fork_event)
        launches.append(l)
    for s in sorted(set(streams_of_branches) - {0}):  # the last launch of each helper stream records
        last = [l for l in launches if l.stream == s][-1]
        last.records.append(events)
        branch_records.append(events)
        events += 1
    join = Launch(len(launches), "join", [2 + b for b in range(n_branches)] + [n_t - 1], [n_t - 1], 0,
                  waits=branch_records)
    launches.append(join)
    plan = Plan({"kind": "cuda", "arch": "sm_90"}, len(set(streams_of_branches) | {0}), events, tensors, storages,
                launches, [0], [n_t - 1], [])
    plan.validate()
    return plan


GPU = GPUModel(launch_us=2.0, wait_us=3.0)


def test_a_chain_takes_the_sum_of_its_kernels_plus_launches():
    plan = fork_join([0, 0, 0, 0])
    assert simulate(plan, [10] * 6, gpu=GPU) == pytest.approx(6 * 10 + 6 * 2)


def test_half_filling_branches_overlap_in_pairs():
    plan = fork_join([0, 1])  # 2 branches on 2 streams
    two = fork_join([0, 0])
    d = [10, 40, 40, 10]
    assert simulate(two, d, [0.5] * 4, GPU) == pytest.approx(10 + 40 + 40 + 10 + 4 * 2)
    # the branches overlap fully at half fill: 40 us instead of 80, minus the event costs
    assert simulate(plan, d, [0.5] * 4, GPU) == pytest.approx(10 + 2 + 3 + 2 + 40 + 3 + 2 + 10, abs=2.5)


def test_one_stream_is_best_when_every_kernel_fills_the_gpu():
    candidates = {"1 stream": fork_join([0, 0, 0, 0]), "4 streams": fork_join([0, 1, 2, 3]),
                  "2 streams": fork_join([0, 0, 1, 1])}
    best, pred = best_schedule(candidates, lambda p: [10, 30, 30, 30, 30, 10], lambda p: [1.0] * 6, GPU)
    assert best == "1 stream" and pred["4 streams"] > pred["1 stream"]


def test_a_cap_of_two_streams_is_best_when_branches_fill_half_the_gpu():
    candidates = {"1 stream": fork_join([0, 0, 0, 0]), "4 streams": fork_join([0, 1, 2, 3]),
                  "2 streams": fork_join([0, 0, 1, 1])}
    best, pred = best_schedule(candidates, lambda p: [10, 30, 30, 30, 30, 10], lambda p: [0.5] * 6, GPU)
    assert best == "2 streams"
    assert pred["2 streams"] < pred["4 streams"] < pred["1 stream"]


def test_the_memory_budget_is_honoured():
    small, big = fork_join([0, 0, 0, 0]), fork_join([0, 1, 2, 3])
    small.memory, big.memory = {"pool_bytes": 100}, {"pool_bytes": 400}
    best, pred = best_schedule({"small": small, "big": big}, lambda p: [10, 30, 30, 30, 30, 10],
                               lambda p: [0.25] * 6, GPU, memory_budget=200)
    assert best == "small" and set(pred) == {"small"}
    with pytest.raises(ValueError, match="no schedule's memory pool fits the budget of 50 bytes"):
        best_schedule({"small": small}, lambda p: [1] * 6, memory_budget=50)


def test_calibration_recovers_a_known_gpu_model_from_simulated_measurements():
    """Replays 'measured' with a known GPU model (and a known profiler bracket in the durations) are
    fitted back to predictions that match them: the fit, the grid and the per-case errors line up."""
    import random

    from tvm_nimble import zoo
    from tvm_nimble.codegen.schedule_sim import Case, calibrate, predict
    from tvm_nimble.compiler.build import build

    truth, bracket = GPUModel(launch_us=1.0, wait_us=2.0, contention=0.2, fill=0.55), 3.0
    rng = random.Random(0)
    cases = []
    for name in ("inception", "nasnet"):
        model = zoo.get_model(name)
        for cap in (1, None):
            plan = build(model, "llvm", max_streams=cap, compile_kernels=False).plan
            solo = [rng.uniform(2.0, 40.0) for _ in plan.launches]
            measured = simulate(plan, solo, None, truth)
            cases.append(Case(f"{name}/{cap}", plan, [d + bracket for d in solo], measured))
    assert any(c.plan.num_streams > 2 for c in cases)
    gpu, b, errors, points = calibrate(cases)
    assert all(abs(predict(c, gpu, b) - c.measured_us) <= 1e-6 * c.measured_us for c in cases)
    assert (gpu.launch_us, gpu.wait_us, gpu.contention, gpu.fill, b) == pytest.approx((1.0, 2.0, 0.2, 0.55, 3.0))
    assert len(points) == len(next(iter(errors.values())))


def test_the_planned_timeline_respects_stream_order_and_events():
    """Every launch starts after its stream's previous launch ends and after the launches whose events it
    waits on end; the last end is the predicted latency."""
    from tvm_nimble import zoo
    from tvm_nimble.codegen.schedule_sim import H100
    from tvm_nimble.compiler.build import build

    plan = build(zoo.get_model("nasnet"), "llvm", max_streams=None, compile_kernels=False).plan
    durations = [5.0 + (i * 7) % 13 for i in range(len(plan.launches))]
    trace = []
    latency = simulate(plan, durations, None, H100, trace=trace)
    assert len(trace) == len(plan.launches) and max(e for _, e in trace) == pytest.approx(latency)
    recorder = plan.recorder_of_event()
    last_on_stream = {}
    for pos, launch in enumerate(plan.launches):
        start, end = trace[pos]
        assert end >= start + durations[pos] - 1e-6  # sharing can only slow a kernel down
        if launch.stream in last_on_stream:
            assert start >= trace[last_on_stream[launch.stream]][1] - 1e-9
        for e in launch.waits:
            assert start >= trace[recorder[e]][1] - 1e-9
        last_on_stream[launch.stream] = pos
