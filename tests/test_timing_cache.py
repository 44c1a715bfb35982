"""The persistent timing cache (compiler/timing_cache.py), the build's phase times, and the build reusing
the model check's compile of the module it keeps.

No GPU here. The builds are for sm_90 with kernels='best' and max_streams='auto' (nvcc compiles the
kernels; nothing runs them), measured by :class:`PlanCostTimer`: a timer of the build's own timer
interface (compiler/timers.py: arch, fingerprint, launch_ms, replay_ms, gemm_us) whose times are a
deterministic function of the plans it is given (each kernel's cost from its name; more streams run a
plan faster), and which counts every call. With it, the kernel choice, the model check, the cuBLASLt
algorithm choice and the stream choice all run their measuring paths, so a second build that calls it
zero times measured nothing, and identical plans show the cached numbers decided as the measured ones did.
"""
import dataclasses
import hashlib
import json
import multiprocessing
import os
import re
import warnings

import pytest

from tvm_nimble import zoo
from tvm_nimble.compiler import timing_cache
from tvm_nimble.compiler.build import PHASES, build, build_with
from tvm_nimble.compiler.kernel_choice import select_kernels
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.compiler.report import BuildReport
from tvm_nimble.compiler.session import BuildSession, CacheMemory
from tvm_nimble.compiler.stages import apply_precision, import_model
from tvm_nimble.compiler.timers import LocalGPU
from tvm_nimble.errors import NimbleError
from tvm_nimble.runtime.timing import ReplayTimes

SM90 = {"kind": "cuda", "arch": "sm_90"}
GPU_A = {"name": "Test GPU", "arch": "sm_90", "driver": "1.0", "nvidia-cudnn-cu13": "9.0"}


def _need_vendor():
    from tvm_nimble.codegen.vendor_build import vendor_available

    ok, why = vendor_available()
    if not ok:
        pytest.skip(why)


class PlanCostTimer:
    """Times derived from the plans: a vendor launch costs 1, a TVM kernel 0.5-2 by its name's hash (so some
    chains go to TVM and the model check keeps the mix); a replay is the launches' sum over sqrt(streams)."""

    where = "the test's timer"

    def __init__(self, gpu=GPU_A):
        self.gpu = dict(gpu)
        self.calls = {"launch_ms": 0, "replay_ms": 0, "gemm_us": 0}
        self.launched: list[str] = []  # the digest of every plan launch_ms timed, in order

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def arch(self):
        return self.gpu["arch"]

    def fingerprint(self):
        return dict(self.gpu)

    @staticmethod
    def _cost(kernel: str) -> float:
        if kernel.startswith("nimble."):
            return 1.0
        # by what the kernel computes (its fused operators), not the number TVM appends to keep names unique in a
        # module: the same chain costs the same in every module it is built in
        return 0.5 + int(hashlib.sha256(re.sub(r"\d+$", "", kernel).encode()).hexdigest()[:4], 16) / 65536 * 1.5

    def launch_ms(self, result, reps):
        self.calls["launch_ms"] += 1
        self.launched.append(hashlib.sha256(result.plan.to_json().encode()).hexdigest())
        return [self._cost(l.kernel) for l in result.plan.launches]

    def replay_ms(self, results):
        self.calls["replay_ms"] += 1
        return ReplayTimes([[sum(self._cost(l.kernel) for l in r.plan.launches) / r.plan.num_streams ** 0.5
                             for r in results]])

    def gemm_us(self, timings_func, call, reps):
        self.calls["gemm_us"] += 1
        return [3.0, 2.0, 1.0]  # the third candidate wins: the GEMM's attrs change


@pytest.fixture(scope="module")
def nasnet():
    return zoo.get_model("nasnet")


def _build(model, cache, timer, memory=None):
    """A build in a session of its own (as in a new process), or sharing ``memory`` with earlier ones."""
    return build_with(model, BuildOptions.create(SM90, kernels="best", timing_cache=cache), timer=timer, cache=memory)


def _decisions(result) -> dict:
    """Everything the measurements decided, as the build reports it."""
    return {"plan": result.plan.to_json(), "kernel_choice": result.report.kernel_choice,
            "stream_choice": result.report.stream_choice}


def _entries(directory) -> list[str]:
    """The timing entries (the compiled-kernel cache's folder aside: tests/test_build_cache.py)."""
    kernels = os.path.join(directory, timing_cache.KERNELS_FOLDER)
    return sorted(os.path.join(d, f) for d, _, files in os.walk(directory) for f in files
                  if f.endswith(".json") and f != "gpu.json" and not d.startswith(kernels))


@pytest.fixture(scope="module")
def cold(nasnet, tmp_path_factory):
    """A first build, into an empty cache: (cache directory, timer, result)."""
    _need_vendor()
    directory = str(tmp_path_factory.mktemp("timings"))
    timer = PlanCostTimer()
    result = _build(nasnet, directory, timer)
    return directory, timer, result


def test_the_cold_build_measures_every_kind_and_writes_it(cold):
    directory, timer, result = cold
    assert timer.calls["launch_ms"] >= 3 and timer.calls["replay_ms"] >= 2 and timer.calls["gemm_us"] >= 1
    assert result.report.kernel_choice.check.kept == "best"  # a mix: the model check ran
    assert result.report.kernel_choice.gemm_algorithms[0].chosen == 2
    # as an artifact keeps it (JSON) and reads it back: the timings, the check, the GEMM algorithms
    assert BuildReport.from_dict(json.loads(json.dumps(result.info))) == result.report
    kinds = {os.path.basename(os.path.dirname(p)) for p in _entries(directory)}
    assert kinds == {"chain", "model_check", "gemm", "launch_ms", "replay_ms", "stream_choice"}
    (gpu_dir,) = [d for d in os.listdir(directory) if d != timing_cache.KERNELS_FOLDER]
    with open(os.path.join(directory, gpu_dir, "gpu.json")) as f:
        assert json.load(f) == GPU_A


def test_a_second_build_measures_nothing_and_gives_the_same_plan(nasnet, cold):
    directory, _, first = cold
    timer = PlanCostTimer()
    again = _build(nasnet, directory, timer)
    assert timer.calls == {"launch_ms": 0, "replay_ms": 0, "gemm_us": 0}
    assert _decisions(again) == _decisions(first)


def test_corrupt_entries_are_one_note_and_measured_again(nasnet, cold, tmp_path):
    directory, cold_timer, first = cold
    copy = str(tmp_path / "timings")
    _copy_tree(directory, copy)
    entries = _entries(copy)
    for i, path in enumerate(entries):  # bad JSON, truncated JSON, bad UTF-8, a value of the wrong shape
        with open(path, "rb") as f:
            data = f.read()
        bad = [b"{not json", data[: len(data) // 2], b"\xff\xfe", None][i % 4]
        if bad is None:
            entry = json.loads(data)
            entry["value"] = "seven"
            bad = json.dumps(entry).encode()
        with open(path, "wb") as f:
            f.write(bad)
    timer = PlanCostTimer()
    with pytest.warns(UserWarning, match="ignoring unreadable timing-cache entries") as caught:
        again = _build(nasnet, copy, timer)
    assert sum("timing-cache" in str(w.message) for w in caught) == 1  # one line, however many entries
    assert timer.calls == cold_timer.calls and _decisions(again) == _decisions(first)
    third = PlanCostTimer()
    _build(nasnet, copy, third)  # the entries were rewritten whole
    assert third.total == 0


def test_another_gpus_entries_are_ignored_with_a_note(nasnet, cold, tmp_path):
    directory, cold_timer, first = cold
    copy = str(tmp_path / "timings")
    _copy_tree(directory, copy)
    new_driver = {**GPU_A, "driver": "2.0"}
    timer = PlanCostTimer(new_driver)
    note = r"entries of 1 other GPU.*none of this build's \(Test GPU sm_90, driver 2.0\)"
    with pytest.warns(UserWarning, match=note):
        again = _build(nasnet, copy, timer)
    assert timer.calls == cold_timer.calls and _decisions(again) == _decisions(first)

    # entries of GPU A put where GPU B's belong (a directory renamed by hand): their recorded GPU is not B
    gpu_b = {**GPU_A, "name": "Other GPU"}
    b_dir = os.path.join(copy, timing_cache.TimingCache(copy, gpu_b, {}).gpu_id)
    (a_dir,) = [d for d in os.listdir(directory) if d != timing_cache.KERNELS_FOLDER]
    _copy_tree(os.path.join(directory, a_dir), b_dir)
    timer = PlanCostTimer(gpu_b)
    with pytest.warns(UserWarning, match="ignoring timing-cache entries .* that another GPU, driver, library"):
        again = _build(nasnet, copy, timer)
    assert timer.calls == cold_timer.calls and _decisions(again) == _decisions(first)


def test_entries_of_another_tvm_nimble_version_are_stale(nasnet, cold, tmp_path):
    directory, cold_timer, first = cold
    copy = str(tmp_path / "timings")
    _copy_tree(directory, copy)
    for path in _entries(copy):
        with open(path) as f:
            entry = json.load(f)
        entry["context"]["code"] = "an older tvm-nimble"
        with open(path, "w") as f:
            json.dump(entry, f)
    timer = PlanCostTimer()
    with pytest.warns(UserWarning, match="another GPU, driver, library, TVM or tvm-nimble version measured"):
        again = _build(nasnet, copy, timer)
    assert timer.calls == cold_timer.calls and _decisions(again) == _decisions(first)


def test_timing_cache_off_writes_nothing_and_the_default_follows_xdg(nasnet, tmp_path, monkeypatch):
    _need_vendor()
    monkeypatch.delenv("TVM_NIMBLE_CACHE_DIR", raising=False)  # (the run's cache folder: tests/conftest.py)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert BuildOptions.create("llvm").timing_cache == str(tmp_path / "xdg" / "tvm-nimble" / "timings")
    for off in (None, "off", "OFF", False):
        assert BuildOptions.create("llvm", timing_cache=off).timing_cache is None
    with pytest.raises(NimbleError, match="is a file, not a directory"):
        BuildOptions.create("llvm", timing_cache=__file__)
    with pytest.raises(NimbleError, match="timing_cache must be a directory path"):
        BuildOptions.create("llvm", timing_cache=3)
    monkeypatch.undo()  # the run's cache folder again: the vendor extension stays there
    timer = PlanCostTimer()
    result = _build(nasnet, None, timer)
    assert timer.total > 0 and result.report.kernel_choice.timings
    assert os.listdir(tmp_path) == []  # not the default directory, not anything else


def test_what_one_process_measured_is_not_measured_again_with_the_cache_off(nasnet):
    """The in-memory half: the stock-TVM baseline and other builds of a benchmark in one process."""
    _need_vendor()
    first, second, memory = PlanCostTimer(), PlanCostTimer(), CacheMemory()
    a = _build(nasnet, "off", first, memory)
    b = _build(nasnet, "off", second, memory)
    assert first.total > 0 and second.total == 0 and _decisions(a) == _decisions(b)


def test_the_model_checks_build_is_rescheduled_not_compiled_again(nasnet):
    """The kept module was compiled one-stream by the model check: the build reschedules it, and gets the
    plan and info a fresh compile of the same module gives."""
    _need_vendor()
    timer = PlanCostTimer()
    opts = BuildOptions.create(SM90, kernels="best", timing_cache=None, max_streams=None)
    selection = select_kernels(apply_precision(import_model(nasnet), opts), BuildSession(opts, timer))
    assert selection.check.kept == "best" and selection.built is not None and selection.algorithms
    reused = build_with(selection, opts, timer=timer)
    fresh = build_with(dataclasses.replace(selection, built=None), opts, timer=timer)
    assert "generate" not in reused.report.phases and "lower" not in reused.report.phases
    assert {"lower", "schedule", "generate"} <= set(fresh.report.phases)
    assert reused.plan.to_json() == fresh.plan.to_json() and reused.plan.num_streams > 1
    assert reused.report.replace(phases=None) == fresh.report.replace(phases=None)
    assert reused.kernels is selection.built.kernels and reused.options == fresh.options
    # other kernels or memory plan: compiled again
    other = build_with(selection, opts.replace(concat_in_place=False), timer=timer)
    assert "generate" in other.report.phases


def test_every_probe_is_compiled_and_timed_once_and_the_attention_probe_holds_the_attention_kernel():
    """The ViT's attention chain picks Q, K and V with Gather indices computed from constants: in the probe they
    stay constants, so the attention kernel takes the chain there (as a parameter the probe had TVM's kernels
    only: built and timed twice, the provider's "time" being TVM's). No probe plan is timed twice."""
    _need_vendor()
    timer = PlanCostTimer()
    result = _build(zoo.get_model("vit"), None, timer)
    (attention,) = [t for t in result.report.kernel_choice.timings if t.provider == "attention"]
    assert attention.vendor_ms == 1.0 and attention.tvm_ms > 1.0  # one vendor launch; TVM's several
    assert len(timer.launched) == len(set(timer.launched))


def test_a_schedule_with_one_candidate_is_replayed_only_for_its_edges():
    """A chain (densenet's dense layers) has one schedule whatever the cap: no cap to choose, and one replay of it
    with and without programmatic edges into its TVM kernels (sm_90: they wait first), which the test's timer
    times alike, so the simpler plan, every edge full, is kept."""
    timer = PlanCostTimer()
    result = build_with(zoo.densenet(), BuildOptions.create(SM90, kernels="tvm", timing_cache=None), timer=timer)
    record = result.report.stream_choice
    assert result.plan.num_streams == 1 and [c.max_streams for c in record.candidates] == [1]
    assert record.how == "the only candidate" and timer.calls == {"launch_ms": 0, "replay_ms": 1, "gemm_us": 0}
    assert record.edges is not None and not record.edges.kept and not result.plan.dependent_launch
    assert record.edges.why == "full edges measured fastest"


def test_phases_are_timed_in_info_explain_and_compile(tmp_path, capsys):
    from tvm_nimble.cli.main import main
    from tvm_nimble.compiler.explain import explain_model

    model = zoo.get_model("inception", blocks=1, hw=8)
    result = build(model, "llvm", precision="bf16")
    phases = result.report.phases
    assert list(phases) == [p for p in PHASES if p in phases]  # in the order they ran
    assert set(phases) == set(PHASES) and all(s >= 0 for s in phases.values())
    assert "build phases: import " in explain_model(model, "llvm")
    path = str(tmp_path / "m.onnx")
    zoo.save(model, path)
    capsys.readouterr()
    assert main(["compile", path, "-o", str(tmp_path / "m.nimble"), "--timing-cache", "off"]) == 0
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("build phases:")]
    assert len(line) == 1 and "kernel choice" in line[0] and "generate" in line[0] and "total" in line[0]


def test_cli_timing_cache_flag_reaches_the_options(tmp_path):
    from tvm_nimble.cli.main import build_parser
    from tvm_nimble.cli.options import build_options

    for command in ("compile", "explain"):
        extra = ["-o", "x"] if command == "compile" else []
        args = build_parser().parse_args([command, "m.onnx", *extra, "--timing-cache", str(tmp_path)])
        assert BuildOptions.create("llvm", **build_options(args)).timing_cache == str(tmp_path)
        args = build_parser().parse_args([command, "m.onnx", *extra])
        assert BuildOptions.create("llvm", **build_options(args)).timing_cache == timing_cache.default_directory()


def test_a_machine_without_a_gpu_has_an_empty_fingerprint_and_keeps_nothing_on_disk(tmp_path):
    assert LocalGPU().fingerprint() == {}  # no GPU here: no crash, nothing to key a file by
    session = BuildSession(BuildOptions.create(SM90, timing_cache=str(tmp_path)), LocalGPU())
    key = session.key("gemm", signature="k")
    session.keep(key, [1.0, 2.0])
    assert not key.persistent and os.listdir(tmp_path) == [] and session.cached(key) == [1.0, 2.0]


def _writer(directory, n):
    cache = timing_cache.TimingCache(directory, GPU_A, {"format": 1})
    for i in range(n):
        cache.put("replay_ms", ["same key"], [float(i)] * 2000)


def test_builds_writing_at_once_never_leave_a_partial_entry(tmp_path):
    """Two processes rewrite one entry while this one reads it: every read is a whole entry."""
    directory = str(tmp_path)
    reader = timing_cache.TimingCache(directory, GPU_A, {"format": 1})
    reader.put("replay_ms", ["same key"], [0.0] * 2000)
    # fork (where there is one) starts in milliseconds; the writers touch nothing but files
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    procs = [ctx.Process(target=_writer, args=(directory, 300)) for _ in range(2)]
    for p in procs:
        p.start()
    reads = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a note about an unreadable entry fails the test
        while any(p.is_alive() for p in procs) or reads < 50:
            value = reader.get("replay_ms", ["same key"])
            assert value is not None and len(value) == 2000 and len(set(value)) == 1
            reads += 1
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert [f for f in os.listdir(os.path.dirname(reader.path("replay_ms", ["same key"])))] == [
        os.path.basename(reader.path("replay_ms", ["same key"]))]  # no temporary file left behind


def test_an_rpc_server_reports_its_gpus_fingerprint(tmp_path):
    """What ``RemoteGPU.fingerprint`` asks a session for (registered in every session of
    ``tvm-nimble rpc-server``): JSON of the server's GPU, empty on a server without one."""
    import tvm_ffi

    from tvm_nimble.runtime.rpc_session import register_session_functions

    register_session_functions(str(tmp_path))
    assert json.loads(tvm_ffi.get_global_func("nimble.rpc.gpu_fingerprint")()) == {}


def _copy_tree(src, dst):
    import shutil

    shutil.copytree(src, dst, dirs_exist_ok=True)


def test_tvms_kernels_for_all_providers_chains_are_built_and_timed_once(nasnet):
    """The providers offer many of the same chains (cuDNN and our depthwise kernel the depthwise convolutions and
    pools, cuDNN and cuBLASLt / the SIMT GEMM the matrix products): TVM's kernels for all of them are one probe,
    built and timed once, not one per provider (TVM's candidates are most of a cold build's time)."""
    _need_vendor()

    class Recording(PlanCostTimer):
        def __init__(self):
            super().__init__()
            self.tvm_only: list[bool] = []  # per timed plan: TVM's kernels only (no provider call)

        def launch_ms(self, result, reps):
            self.tvm_only.append(not any(l.kernel.startswith("nimble.") for l in result.plan.launches))
            return super().launch_ms(result, reps)

    timer = Recording()
    result = build_with(nasnet, BuildOptions.create(SM90, kernels="best", timing_cache="off"), timer=timer)
    timings = result.report.kernel_choice.timings
    providers = {t.provider for t in timings}
    assert len(providers) >= 3 and timer.tvm_only.count(True) == 1, (providers, timer.tvm_only)
