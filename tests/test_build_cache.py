"""The compiled-kernel cache (compiler/kernel_cache.py) and the stream choice kept in the timing cache: a second
build of a model loads its lowered module and kernel library instead of lowering and compiling again, makes
only the chosen schedule, and gives the same plan, outputs and artifact; a damaged entry is one note and a
correct rebuild. No GPU: llvm builds run here; the sm_90 builds (nvcc compiles, nothing runs) measure with
test_timing_cache's deterministic PlanCostTimer."""
import dataclasses
import hashlib
import json
import os

import numpy as np
import pytest
import tvm

from tvm_nimble import load, zoo
from tvm_nimble.compiler import kernel_cache, stream_choice, timing_cache
from tvm_nimble.compiler.build import build, build_with
from tvm_nimble.compiler.notes import Notes
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.compiler.report import BuildReport
from tvm_nimble.compiler.session import CacheMemory
from tvm_nimble.errors import NimbleError
from tvm_nimble import NimbleExecutor
from tvm_nimble.runtime.module import NimbleModule
from tvm_nimble.runtime.timing import ReplayTimes

from test_timing_cache import SM90, PlanCostTimer, _need_vendor, nasnet  # noqa: F401 (nasnet: a fixture)
from test_timing_cache import _build as _best


def _outputs(module, model) -> list[np.ndarray]:
    out = NimbleExecutor(module, tvm.cpu())(**zoo.random_inputs(model, seed=0))
    return [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]


def _folders(directory) -> list[str]:
    root = os.path.join(directory, timing_cache.KERNELS_FOLDER)
    return sorted(os.path.join(root, d) for d in os.listdir(root)
                  if not d.startswith(".") and d != kernel_cache.WEIGHTS_FOLDER) if os.path.isdir(root) else []


def _weights(directory) -> dict[str, int]:
    """The weights kept under the cache ``directory``: file name -> bytes."""
    root = os.path.join(directory, timing_cache.KERNELS_FOLDER, kernel_cache.WEIGHTS_FOLDER)
    return {e.name: e.stat().st_size for e in os.scandir(root) if not e.name.startswith(".")} if os.path.isdir(root) else {}


def _named(folder) -> set[str]:
    with open(os.path.join(folder, "entry.json")) as f:
        return set(json.load(f)["weights"].values())


def _initializer_bytes(model) -> int:
    """The bytes of an ONNX model's weights, from the ONNX file (numpy_helper), not from the cache."""
    from onnx import numpy_helper

    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def _llvm(model, directory, memory: CacheMemory | None = None, **options):
    """An llvm build into the cache ``directory``; ``memory`` counts its loads and writes (``memory.kernels``)."""
    return build_with(model, BuildOptions.create("llvm", timing_cache=directory, **options), cache=memory)


@pytest.fixture(scope="module")
def inception():
    return zoo.get_model("inception")


@pytest.fixture(scope="module")
def cold(inception, tmp_path_factory):
    """A first llvm build into an empty cache: (directory, result, the counts it changed)."""
    directory = str(tmp_path_factory.mktemp("cache"))
    memory = CacheMemory()
    result = _llvm(inception, directory, memory)
    return directory, result, memory.kernels


def test_a_first_build_compiles_and_keeps_its_kernels(cold):
    directory, result, counts = cold
    assert result.report.kernel_cache == "stored" and counts["stored"] == 1 and counts["hit"] == 0
    (folder,) = _folders(directory)
    assert sorted(os.listdir(folder)) == ["entry.json", "kernels.so", "lowered.json"]
    kept = _weights(directory)  # each weight a file named by its sha256, named by the entry; not base64 in the JSON
    assert set(kept) == _named(folder) and min(kept.values()) > kernel_cache.WEIGHT_BYTES
    root = os.path.join(directory, timing_cache.KERNELS_FOLDER, kernel_cache.WEIGHTS_FOLDER)
    assert all(hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest() == name for name in kept)
    assert "export_library" not in vars(result.kernels)  # its own library: TVM exports it


def test_a_second_build_loads_them_and_gives_the_same_plan_outputs_and_artifact(inception, cold, tmp_path):
    directory, first, _ = cold
    memory = CacheMemory()
    again = _llvm(inception, directory, memory)
    assert again.report.kernel_cache == "hit" and memory.kernels["hit"] == 1 and memory.kernels["stored"] == 0
    assert again.plan.to_json() == first.plan.to_json()
    # the phases are those of a build; lowering and generating are now loading
    assert {"lower", "schedule", "generate"} <= set(again.report.phases)
    for a, b in zip(_outputs(again, inception), _outputs(first, inception)):
        np.testing.assert_array_equal(a, b)
    # the artifact of the loaded library (copied: TVM cannot export a library it loaded) loads and runs alike,
    # also where the kernels went into a module of the caller's
    loaded = load(again.export(str(tmp_path / "warm.nimble")))
    fresh = load(first.export(str(tmp_path / "cold.nimble")))
    theirs = load(NimbleModule(again.plan, again.kernels, again.params).export(str(tmp_path / "theirs.nimble")))
    for a, b, c in zip(_outputs(loaded, inception), _outputs(fresh, inception), _outputs(theirs, inception)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, b)
    again.kernels.export_library(str(tmp_path / "k.so"))
    assert tvm.runtime.load_module(str(tmp_path / "k.so")).implements_function(again.plan.launches[0].kernel)
    drop = lambda report: report.replace(phases=None, kernel_cache=None)  # noqa: E731
    assert drop(again.report) == drop(first.report)


def test_another_model_or_lowering_option_is_another_entry(inception, cold, tmp_path):
    directory, _, _ = cold
    copy = str(tmp_path / "cache")
    _copy(directory, copy)
    other_weights = build(zoo.get_model("inception", seed=1), "llvm", timing_cache=copy)
    no_concat = build(inception, "llvm", timing_cache=copy, concat_in_place=False)
    assert other_weights.report.kernel_cache == "stored" and no_concat.report.kernel_cache == "stored"
    assert len(_folders(copy)) == 3


@pytest.mark.parametrize("damage", ["library", "lowered", "entry", "truncated library", "weights"])
def test_a_damaged_entry_is_one_note_and_a_correct_rebuild(inception, cold, tmp_path, damage):
    directory, first, _ = cold
    copy = str(tmp_path / "cache")
    _copy(directory, copy)
    (folder,) = _folders(copy)
    if damage == "weights":  # one of the weights the entry names
        path = os.path.join(copy, timing_cache.KERNELS_FOLDER, kernel_cache.WEIGHTS_FOLDER, sorted(_named(folder))[0])
    else:
        name = {"library": "kernels.so", "truncated library": "kernels.so", "lowered": "lowered.json",
                "entry": "entry.json"}[damage]
        path = os.path.join(folder, name)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2] if damage == "truncated library" else b"\x7fELF not a library {")
    memory = CacheMemory()
    with pytest.warns(UserWarning, match="ignoring unreadable compiled-kernel cache entries") as caught:
        again = _llvm(inception, copy, memory)
    assert sum("compiled-kernel cache" in str(w.message) for w in caught) == 1
    assert again.report.kernel_cache == "stored" and memory.kernels["rejected"] == 1
    assert again.plan.to_json() == first.plan.to_json()
    for a, b in zip(_outputs(again, inception), _outputs(first, inception)):
        np.testing.assert_array_equal(a, b)
    third = build(inception, "llvm", timing_cache=copy)  # the entry was rewritten whole
    assert third.report.kernel_cache == "hit"


def test_the_cache_is_off_without_a_timing_cache_or_with_kernel_cache_false(inception, tmp_path):
    memory = CacheMemory()
    off = _llvm(inception, "off", memory)
    assert off.report.kernel_cache is None and set(memory.kernels.values()) == {0}
    no = build(inception, "llvm", timing_cache=str(tmp_path), kernel_cache=False)
    assert no.report.kernel_cache is None and _folders(str(tmp_path)) == []
    with pytest.raises(NimbleError, match="kernel_cache must be True or False"):
        BuildOptions.create("llvm", kernel_cache="yes")


def test_the_least_recently_used_entries_go_over_the_size_limit(inception, cold, tmp_path):
    directory, _, _ = cold
    copy = str(tmp_path / "cache")
    _copy(directory, copy)
    (old,) = _folders(copy)
    os.utime(os.path.join(old, "entry.json"), (1, 1))  # long unused
    new = build(zoo.get_model("inception", seed=2), "llvm", timing_cache=copy)
    (kept,) = [f for f in _folders(copy) if f != old]
    cache = kernel_cache.KernelCache(os.path.join(copy, timing_cache.KERNELS_FOLDER), CacheMemory().kernels, Notes())
    cache._prune(keep=kept, max_bytes=1)
    assert _folders(copy) == [kept] and new.report.kernel_cache == "stored"
    assert set(_weights(copy)) == _named(kept)  # the dropped entry's weights went with it (other weights: seed 2)


def test_weights_are_kept_once_for_every_entry_that_has_them_and_go_with_the_last(inception, cold, tmp_path):
    directory, _, _ = cold
    copy = str(tmp_path / "cache")
    _copy(directory, copy)
    (first,) = _folders(copy)
    before = _weights(copy)
    os.utime(os.path.join(first, "entry.json"), (1, 1))  # long unused
    other = build(inception, "llvm", timing_cache=copy, concat_in_place=False)  # another entry, the same weights
    (second,) = [f for f in _folders(copy) if f != first]
    assert other.report.kernel_cache == "stored" and _named(second) == _named(first) and _weights(copy) == before
    root = os.path.join(copy, timing_cache.KERNELS_FOLDER)
    # a weight no entry names, long unwritten and just written; an unfinished write, long ago and now
    orphans = {"0" * 64: (1, 1), "1" * 64: None, ".tmp-old": (1, 1), ".tmp-now": None}
    for name, when in orphans.items():
        with open(os.path.join(root, kernel_cache.WEIGHTS_FOLDER, name), "wb") as f:
            f.write(b"w")
        if when:
            os.utime(os.path.join(root, kernel_cache.WEIGHTS_FOLDER, name), when)
    cache = kernel_cache.KernelCache(root, CacheMemory().kernels, Notes())
    cache._prune(keep=second, max_bytes=1)
    assert _folders(copy) == [second] and set(_weights(copy)) == set(before) | {"1" * 64}  # the shared ones stay
    assert sorted(n for n in os.listdir(os.path.join(root, kernel_cache.WEIGHTS_FOLDER)) if n.startswith(".")) == [
        ".tmp-now"]
    again = build(inception, "llvm", timing_cache=copy, concat_in_place=False)
    assert again.report.kernel_cache == "hit"
    for a, b in zip(_outputs(again, inception), _outputs(other, inception)):
        np.testing.assert_array_equal(a, b)


def test_a_warm_bucketed_build_loads_each_buckets_kernels_and_exports_them(tmp_path):
    model = zoo.get_model("resnet")
    directory = str(tmp_path / "cache")
    first = build(model, "llvm", batch_sizes=[1, 2], timing_cache=directory)
    memory = CacheMemory()
    again = _llvm(model, directory, memory, batch_sizes=[1, 2])
    assert memory.kernels["hit"] == 2 and all(m.report.kernel_cache == "hit" for m in again.buckets.values())
    entries = _folders(directory)
    assert len(entries) == 2 and _named(entries[0]) == _named(entries[1])  # the buckets' weights, kept once:
    assert sum(_weights(directory).values()) < 1.05 * _initializer_bytes(model)  # about the ONNX model's bytes
    x = zoo.random_inputs(model, seed=0)
    name, arr = next(iter(x.items()))
    batch = np.concatenate([arr, arr])
    cold = NimbleExecutor(load(first.export(str(tmp_path / "cold.nimble"))))(**{name: batch})
    warm = NimbleExecutor(load(again.export(str(tmp_path / "warm.nimble"))))(**{name: batch})
    for a, b in zip(warm, cold):
        np.testing.assert_array_equal(a.numpy(), b.numpy())



def test_bfloat16_weights_come_back_from_the_cache_bit_for_bit(inception, tmp_path):
    """A bf16 build's weights (a dtype numpy lacks: ml_dtypes', copied where the others are taken without a copy)
    kept and loaded again: the warm build's constants are the cold build's, bit for bit, and so are its outputs."""
    directory = str(tmp_path / "cache")
    first = _llvm(inception, directory, precision="bf16")
    again = _llvm(inception, directory, precision="bf16")
    assert (first.report.kernel_cache, again.report.kernel_cache) == ("stored", "hit")
    assert "bfloat16" in {str(a.dtype) for a in again.params.values()}
    assert again.params.keys() == first.params.keys()
    for name, array in first.params.items():
        assert again.params[name].dtype == array.dtype
        np.testing.assert_array_equal(again.params[name].view(np.uint8), array.view(np.uint8))
    for a, b in zip(_outputs(again, inception), _outputs(first, inception)):
        np.testing.assert_array_equal(a, b)

# ---- sm_90, kernels="best", max_streams="auto" (the GPU build's path; nothing runs here) -------------------
def _plan_digest(result) -> str:
    return hashlib.sha256(result.plan.to_json().encode()).hexdigest()


def test_a_warm_gpu_build_measures_nothing_loads_its_kernels_and_schedules_once(nasnet, tmp_path, monkeypatch):
    """Cold: the model check compiles the kept module, and the build keeps that compile; warm: no measurement,
    the kernels loaded, and only the chosen stream schedule made (not every candidate's), with the cold plan."""
    _need_vendor()
    directory = str(tmp_path / "cache")
    cold_timer = PlanCostTimer()
    first = _best(nasnet, directory, cold_timer)
    assert first.report.kernel_choice.check.kept == "best"  # the model check's compile was reused
    assert first.report.kernel_cache == "stored" and "lower" not in first.report.phases
    assert first.plan.num_streams > 1 and len(first.report.stream_choice.candidates) > 2

    made = []
    real = stream_choice.rescheduled
    monkeypatch.setattr(stream_choice, "rescheduled", lambda *a, **k: made.append(a[1]) or real(*a, **k))
    memory = CacheMemory()
    timer = PlanCostTimer()
    again = _best(nasnet, directory, timer, memory)
    assert timer.total == 0 and again.report.kernel_cache == "hit" and memory.kernels["hit"] == 1
    assert len(made) <= 1  # the chosen cap's schedule (none when the widest won)
    assert _plan_digest(again) == _plan_digest(first)
    # the same choice; how long the cold build waited on the vendor units is this machine's state (whether an earlier
    # build in the run compiled them), and the warm build waits on none
    assert again.report.kernel_choice == dataclasses.replace(first.report.kernel_choice, extension_wait_s=0.0)
    assert again.report.stream_choice == first.report.stream_choice


def test_a_stream_choice_entry_that_no_longer_gives_its_plan_is_not_used(nasnet, tmp_path):
    """The entry records the digest of the plan chosen: a schedule that comes out otherwise (the entry edited,
    or damaged in a way that still parses) makes the build choose again from the cached replays."""
    _need_vendor()
    directory = str(tmp_path / "cache")
    first = _best(nasnet, directory, PlanCostTimer())
    (path,) = [os.path.join(d, f) for d, _, files in os.walk(directory) for f in files
               if os.path.basename(d) == "stream_choice"]
    with open(path) as f:
        entry = json.load(f)
    entry["value"]["plan"] = "0" * 32
    with open(path, "w") as f:
        json.dump(entry, f)
    timer = PlanCostTimer()
    again = _best(nasnet, directory, timer)
    assert timer.total == 0 and _plan_digest(again) == _plan_digest(first)
    assert again.report.stream_choice == first.report.stream_choice


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst, dirs_exist_ok=True)


class _CappedSlackTimer(PlanCostTimer):
    """PlanCostTimer whose replays favour two streams, the least-slack order and stream priorities, so that the
    stream choice keeps a capped, reordered, prioritized plan: the decision a warm build must rebuild exactly."""

    def replay_ms(self, results):
        self.calls["replay_ms"] += 1
        out = []
        for r in results:
            factor = {1: 1.0, 2: 0.6, 3: 0.7}.get(r.plan.num_streams, 0.8)
            factor -= 0.05 * (r.report.stream_order == "slack") + 0.05 * bool(r.plan.stream_priority)
            out.append(sum(self._cost(l.kernel) for l in r.plan.launches) * factor)
        return ReplayTimes([out])


def test_a_warm_build_finds_a_capped_prioritized_stream_choice_of_an_inception_net(inception, tmp_path):
    """The stream choice's measurements are keyed by the compiled-kernel cache's key: a warm build loads the lowered
    module from that cache, and that module's structural hash is not the one it had when built (keyed by it, a warm
    googlenet build on an H100 measured its streams again and chose another plan)."""
    _need_vendor()
    directory = str(tmp_path / "cache")
    first = _best(inception, directory, _CappedSlackTimer())
    choice = first.report.stream_choice
    assert (choice.chosen, choice.chosen_order, choice.priority.kept) == (2, "slack", True)
    # as an artifact keeps it (JSON) and reads it back: the measured candidates and the priority trial too
    assert BuildReport.from_dict(json.loads(json.dumps(first.info))) == first.report
    timer = _CappedSlackTimer()
    again = _best(inception, directory, timer)
    assert again.report.kernel_cache == "hit" and timer.total == 0
    assert _plan_digest(again) == _plan_digest(first)
