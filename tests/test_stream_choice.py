"""max_streams='auto' and memory_budget on CPU: candidates, the budget, the one-line errors, and the rule the
measured choice decides by.

Measuring needs a GPU (tests/gpu checks the measured choice); without one, auto keeps the widest
schedule that fits the budget, which is what is checked here against schedules built with each cap. The rule
(:func:`~tvm_nimble.compiler.stream_choice.decide`: the simplest schedule unless a more complex one is faster
beyond the rounds' noise) is checked on hand-computed rounds, and through a build whose timer is the test's.
"""
import dataclasses
import shutil

import pytest

from tvm_nimble import zoo
from tvm_nimble.compiler.build import build
from tvm_nimble.compiler.report import StreamChoice
from tvm_nimble.compiler.stream_choice import Decision, _try_edges, _try_priorities, decide
from tvm_nimble.errors import NimbleError
from tvm_nimble.runtime.timing import ReplayTimes, interleaved_rounds, paired_gain


def _pool(model, cap):
    return build(model, "llvm", max_streams=cap, compile_kernels=False).plan.memory["pool_bytes"]


@pytest.mark.parametrize("name", ["inception", "nasnet"])
def test_auto_keeps_the_widest_schedule_that_fits_the_budget(name):
    model = zoo.get_model(name)
    widest = build(model, "llvm", max_streams=None, compile_kernels=False)
    auto = build(model, "llvm", compile_kernels=False)
    assert auto.plan.num_streams == widest.plan.num_streams and widest.plan.num_streams > 2
    record = auto.report.stream_choice
    assert record.how.startswith("widest") and record.chosen == widest.plan.num_streams
    pools = {c.max_streams: c.pool_bytes for c in record.candidates}
    assert pools[1] == _pool(model, 1) and pools[2] == _pool(model, 2)  # candidates are the capped schedules
    budget = min(pools.values())
    fitting = [cap for cap, b in pools.items() if b <= budget]
    chosen = build(model, "llvm", compile_kernels=False, memory_budget=budget)
    assert chosen.plan.memory["pool_bytes"] <= budget
    assert chosen.report.stream_choice.chosen == max(fitting)


def test_budgets_that_nothing_fits_are_one_clear_error():
    model = zoo.get_model("inception")
    with pytest.raises(NimbleError, match="no schedule's memory pool fits the budget of 16 bytes.*--memory-budget"):
        build(model, "llvm", compile_kernels=False, memory_budget=16)
    with pytest.raises(NimbleError, match="over the budget of 16: use max_streams='auto'"):
        build(model, "llvm", max_streams=2, compile_kernels=False, memory_budget=16)
    with pytest.raises(NimbleError, match="max_streams must be an integer >= 1, None or 'auto'"):
        build(model, "llvm", max_streams="fast", compile_kernels=False)


def test_cli_memory_budget_and_max_streams(tmp_path):
    path = zoo.save(zoo.get_model("inception"), tmp_path / "incept.onnx")

    from cli_runner import run_cli as cli

    r = cli("explain", path, "--memory-budget", "1K")
    assert r.returncode == 1 and "no schedule's memory pool fits the budget of 1024 bytes" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("explain", path, "--max-streams", "0")
    assert r.returncode == 2 and "expected a positive integer, 'max' or 'auto'" in r.stderr
    r = cli("explain", path, "--max-streams", "1")
    assert r.returncode == 0 and "streams: 1" in r.stdout
    r = cli("explain", path, "--memory-budget", "1G")
    assert r.returncode == 0 and "stream cap: " in r.stdout


# ---- the measured choice's rule: the simplest schedule unless a more complex one is faster beyond noise ---------
def _rounds(*series):
    """ReplayTimes from each candidate's ms per round (the simplest candidate first)."""
    return ReplayTimes([list(r) for r in zip(*series)])


def test_paired_gain_is_the_median_and_scaled_mad_of_the_round_by_round_gains():
    base, other = [1.0, 2.0, 1.0, 4.0, 1.0], [0.9, 1.9, 1.05, 3.0, 0.95]
    gains = [0.1, 0.05, -0.05, 0.25, 0.05]  # (base - other) / base, by hand
    g = paired_gain(_rounds(base, other), 0, 1)
    assert g.gain == pytest.approx(0.05) and g.wins == 4 and g.rounds == 5
    assert g.spread == pytest.approx(1.4826 * 0.05)  # |gains - 0.05| = .05 0 .1 .2 0: median 0.05
    assert sorted(gains)[2] == pytest.approx(g.gain)


def test_close_replays_get_more_rounds_until_the_two_fastest_are_apart_or_the_rounds_run_out():
    """:func:`~tvm_nimble.runtime.timing.interleaved_rounds` with scripted rounds (each module's ms): apart from the
    start, 5 rounds; tied, 15; noisy for 5 rounds then apart, the first count at which the two are apart (brute
    force over the counts, by the same comparison)."""
    def script(rows):
        it = iter(rows)
        return lambda: next(it)

    apart = [[1.0, 0.9, 2.0]] * 20
    assert interleaved_rounds(script(apart)).rounds == ((1.0, 0.9, 2.0),) * 5
    tied = [[1.0, 0.99, 2.0], [1.0, 1.01, 2.0]] * 10
    assert len(interleaved_rounds(script(tied)).rounds) == 15
    late = [[1.0, f, 2.0] for f in (0.97, 1.02, 0.975, 1.015, 0.98)] + [[1.0, 0.95, 2.0]] * 15
    expected = next(n for n in range(5, 16) if paired_gain(ReplayTimes(late[:n]), 0, 1).clear())
    assert 5 < expected < 15 and interleaved_rounds(script(late)).rounds == ReplayTimes(late[:expected]).rounds


def test_a_noisy_tie_keeps_the_simplest_schedule():
    """The complex plan's median is 2% lower, but it is faster in only 3 of 5 rounds: noise, so 1 stream."""
    simple = [1.00, 1.00, 1.00, 1.00, 1.00]
    noisy = [0.97, 1.02, 0.975, 1.015, 0.98]  # gains 3%, -2%, 2.5%, -1.5%, 2%: median 2%, MAD 1%
    d = decide(_rounds(simple, noisy), ["1 stream", "cap 2"])
    assert d.chosen == 0 and d.why == "cap 2 faster by only 2.0% ± 1.5% in 3/5 rounds, within noise: kept 1 stream"
    # consistent but under MIN_GAIN: kept too, and said so
    d = decide(_rounds(simple, [0.995, 0.996, 0.994, 0.995, 0.995]), ["1 stream", "cap 2"])
    assert d.chosen == 0 and "in 5/5 rounds, under the 1% a more complex schedule must gain" in d.why


def test_a_consistent_gain_picks_the_complex_schedule_but_not_a_more_complex_one_only_noisily_faster():
    """Cap 2 is 5% faster than 1 stream in every round (the clocks drift: round by round, not by medians); cap 3
    has the lowest median of all, but beats cap 2 in 3 of 5 rounds only: cap 2 is kept."""
    drift = [1.00, 1.04, 0.98, 1.06, 1.02]
    one = [d * 10 for d in drift]
    two = [d * 9.5 for d in drift]
    three = [t * f for t, f in zip(two, [0.97, 1.02, 0.975, 1.015, 0.98])]
    labels = ["1 stream", "cap 2", "cap 3"]
    assert decide(_rounds(one, two), labels[:2]) == Decision(1, "cap 2 faster than 1 stream by 5.0% ± 0.0% in 5/5 rounds")
    d = decide(_rounds(one, two, three), labels)
    assert d.chosen == 1 and d.why.startswith("cap 3 faster by only 2.0% ± 1.5% in 3/5 rounds, within noise: kept cap 2")
    # brute force: the kept one is the first, from the simplest, whose every round-by-round gain of the fastest
    # (cap 3 by median) does not hold in 4 of 5 rounds by more than max(1%, the spread)
    times = _rounds(one, two, three)
    assert [paired_gain(times, m, 2).clear(0.01) for m in range(3)] == [True, False, False]


def test_one_outlier_round_flips_neither_way():
    """5% faster in four rounds and 30% slower in one: still faster. Level in four rounds and 30% faster in one (a
    cap 3 beside a cap 2 that is 5% faster than 1 stream): not faster."""
    one = [10.0] * 5
    two = [9.5, 9.5, 13.0, 9.5, 9.5]
    d = decide(_rounds(one, two), ["1 stream", "cap 2"])
    assert d.chosen == 1 and d.why == "cap 2 faster than 1 stream by 5.0% ± 0.0% in 4/5 rounds"
    two = [9.5] * 5
    three = [9.48, 9.52, 6.65, 9.49, 9.51]
    d = decide(_rounds(one, two, three), ["1 stream", "cap 2", "cap 3"])
    assert d.chosen == 1 and "within noise: kept cap 2" in d.why


class _Rounds:
    """The stream choice's measurements (:class:`~tvm_nimble.compiler.stream_choice._Measured`'s ``replay_ms``) as
    given rounds: ``base`` ms for a plan without stream priorities, ``base`` times ``factors`` with them."""

    def __init__(self, base: float, factors: list[float]):
        self.base, self.factors = base, factors

    def replay_ms(self, results):
        return ReplayTimes([[self.base * (f if r.plan.stream_priority else 1.0) for r in results]
                            for f in self.factors])


@pytest.fixture(scope="module")
def widest_inception():
    return build(zoo.get_model("inception"), "llvm", max_streams=None, compile_kernels=False)


def test_priorities_are_kept_only_for_a_gain_beyond_noise(widest_inception):
    chosen = widest_inception
    costs = [1.0 + (k % 3) for k in range(len(chosen.assignment.order))]
    plan, trial = _try_priorities(chosen, costs, _Rounds(2.0, [0.97, 1.02, 0.975, 1.015, 0.98]))
    assert plan is chosen and not trial.kept and sum(trial.streams) >= 1
    assert (trial.base_ms, trial.measured_ms) == (2.0, pytest.approx(1.96))
    assert trial.why == ("critical-path priorities faster by only 2.0% ± 1.5% in 3/5 rounds, within noise: "
                         "kept no priorities")
    plan, trial = _try_priorities(chosen, costs, _Rounds(2.0, [0.95, 0.96, 0.95, 1.1, 0.95]))
    assert plan.plan.stream_priority == list(trial.streams) and trial.kept
    assert trial.why == "critical-path priorities faster than no priorities by 5.0% ± 0.0% in 4/5 rounds"


class _NoisyTieTimer:
    """The build's timer for a test: every multi-stream plan's replays are 2% faster by median than the one-stream
    plan's, but slower in 2 of the 5 rounds (a noisy tie); each launch costs 1 ms. Deterministic."""

    where = "the test's timer"
    FACTORS = (0.97, 1.02, 0.975, 1.015, 0.98)

    def arch(self):
        return "sm_90"

    def fingerprint(self):
        return {"name": "Test GPU", "arch": "sm_90"}

    def launch_ms(self, result, reps):
        return [1.0] * len(result.plan.launches)

    def replay_ms(self, results):
        return ReplayTimes([[len(r.plan.launches) * (f if r.plan.num_streams > 1 else 1.0) for r in results]
                            for f in self.FACTORS])


def test_auto_on_a_gpu_keeps_one_stream_when_the_others_are_within_noise():
    """max_streams='auto' through the build, measured by a timer whose candidates tie within noise: one stream,
    and the record says why (compile and explain print the summary)."""
    from test_timing_cache import SM90, _need_vendor

    from tvm_nimble.compiler.build import build_with
    from tvm_nimble.compiler.options import BuildOptions

    _need_vendor()
    result = build_with(zoo.get_model("inception", blocks=2, hw=8, channels=8), BuildOptions.create(SM90),
                        timer=_NoisyTieTimer())
    record = result.report.stream_choice
    assert len(record.candidates) > 2 and result.plan.num_streams == 1
    assert (record.chosen, record.chosen_order, record.priority) == (1, "program", None)
    assert record.why.endswith("in 3/5 rounds, within noise: kept 1 stream") and record.why in record.summary()
    assert StreamChoice.from_dict(record.to_dict()) == record


class _EdgeRounds:
    """The stream choice's measurements as given rounds: ``base`` ms for a plan whose edges are all full
    dependencies, ``base`` times ``factors`` for one with programmatic edges into TVM's kernels."""

    def __init__(self, base: float, factors: list[float]):
        self.base, self.factors = base, factors

    def replay_ms(self, results):
        return ReplayTimes([[self.base * (f if r.plan.dependent_launch else 1.0) for r in results]
                            for f in self.factors])


def test_programmatic_edges_are_kept_only_for_a_gain_beyond_noise(widest_inception):
    waiting = dataclasses.replace(widest_inception, plan=dataclasses.replace(widest_inception.plan,
                                                                             dependent_launch=True))
    # kernels that do not wait first: nothing to try
    assert _try_edges(widest_inception, _EdgeRounds(2.0, [0.5] * 5)) == (widest_inception, None)
    plan, trial = _try_edges(waiting, _EdgeRounds(2.0, [1.1, 1.12, 1.09, 1.1, 1.11]))  # the edges cost
    assert not plan.plan.dependent_launch and not plan.plan.dependent_launches and not trial.kept
    assert plan.plan.launches == waiting.plan.launches and plan.kernels is waiting.kernels
    assert (trial.full_ms, trial.programmatic_ms) == (2.0, pytest.approx(2.2))
    assert trial.why == "full edges measured fastest"
    plan, trial = _try_edges(waiting, _EdgeRounds(2.0, [0.97, 1.02, 0.975, 1.015, 0.98]))  # a noisy tie
    assert not plan.plan.dependent_launch and not trial.kept and "within noise: kept full edges" in trial.why
    plan, trial = _try_edges(waiting, _EdgeRounds(2.0, [0.95, 0.96, 0.95, 1.1, 0.95]))
    assert plan is waiting and trial.kept
    assert trial.why == "programmatic edges faster than full edges by 5.0% ± 0.0% in 4/5 rounds"
    # a gain under MIN_GAIN that holds in every round, beyond the rounds' noise: the edges are kept, where a stream
    # cap with the same gain is not
    steady = [0.992, 0.991, 0.993, 0.992, 0.992]
    plan, trial = _try_edges(waiting, _EdgeRounds(2.0, steady))
    assert plan is waiting and trial.kept and trial.why.startswith("programmatic edges faster than full edges by 0.8%")
    assert decide(ReplayTimes([[2.0, 2.0 * f] for f in steady]), ["1 stream", "cap 2"]).chosen == 0


class _SlowEdgesTimer:
    """The build's timer for a test: a launch costs 1 ms; a replay the plan's launches over its streams, 8% more
    with programmatic edges into TVM's kernels. Counts its calls."""

    where = "the test's timer"

    def __init__(self):
        self.calls = 0

    def arch(self):
        return "sm_90"

    def fingerprint(self):
        return {"name": "Test GPU", "arch": "sm_90"}

    def launch_ms(self, result, reps):
        self.calls += 1
        return [1.0] * len(result.plan.launches)

    def replay_ms(self, results):
        self.calls += 1
        return ReplayTimes([[len(r.plan.launches) / r.plan.num_streams * (1.08 if r.plan.dependent_launch else 1.0)
                             for r in results] for _ in range(5)])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (TVM's kernels compiled for sm_90)")
def test_a_build_whose_programmatic_edges_measure_slower_drops_them_and_a_warm_build_measures_nothing(tmp_path):
    """Kernels compiled for sm_90 begin by waiting (codegen/dependent_launch.py); max_streams='auto' replays the chosen
    plan both ways and, the edges measuring slower, keeps every edge full. The next build of the same model (a new
    session on the same cache) measures nothing and makes the same plan and record."""
    from test_timing_cache import SM90

    from tvm_nimble.compiler.build import build_with
    from tvm_nimble.compiler.options import BuildOptions

    model = zoo.get_model("inception", blocks=2, hw=8, channels=8)
    options = BuildOptions.create(SM90, kernels="tvm", timing_cache=str(tmp_path / "cache"))
    timer = _SlowEdgesTimer()
    result = build_with(model, options, timer=timer)
    record = result.report.stream_choice
    assert timer.calls and record.edges is not None and not record.edges.kept
    assert record.edges.programmatic_ms == pytest.approx(record.edges.full_ms * 1.08)
    assert not result.plan.dependent_launch and not result.plan.dependent_launches
    assert record.chosen_ms == record.edges.full_ms
    assert "programmatic edges into TVM's kernels" in record.summary() and "not kept" in record.summary()
    assert StreamChoice.from_dict(record.to_dict()) == record

    warm = _SlowEdgesTimer()
    again = build_with(model, options, timer=warm)
    assert warm.calls == 0
    assert again.plan.to_json() == result.plan.to_json() and again.report.stream_choice == record
