"""The typed build report (tvm_nimble/compiler/report.py): what an artifact keeps of it, and reading it back.

An artifact's manifest keeps the report as the JSON dict ``info``, with the keys and values artifacts held before the
report was typed (the runtime reads it as that dict); :meth:`BuildReport.from_dict` gives back the build's report,
and reads an older artifact's info, which lacks keys, too.
"""
import json
import os

import pytest

from tvm_nimble import load, zoo
from tvm_nimble.compiler.build import build
from tvm_nimble.compiler.report import PHASES, BuildReport, KernelChoice, StreamChoice

#: the keys of an llvm build's info in fp16 with merge="on" and the automatic stream cap, as artifacts held them
#: before the report was typed (and tools reading an artifact's manifest expect them)
INFO_KEYS = {"max_streams", "kernels", "providers", "precision", "allow_tf32", "layout", "policy", "tuning_db", "merge",
             "concats_in_place", "splits_as_views", "kernel_cache", "streams_choice", "accuracy", "merge_choice",
             "phases"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An fp16, merged zoo Inception built on llvm and exported: (result, artifact path)."""
    tmp = tmp_path_factory.mktemp("report")
    result = build(zoo.get_model("inception", blocks=2), "llvm", precision="fp16", merge="on",
                   timing_cache=str(tmp / "cache"))
    return result, result.export(str(tmp / "model.nimble"))


def test_the_report_read_back_from_the_artifact_is_the_builds(built):
    result, path = built
    report = result.report
    # every section the build ran is there, typed
    assert report.accuracy is not None and 0 < report.accuracy.rel_l2 < 0.1 and report.accuracy.seeds == 2
    assert report.merge_choice.mode == "on" and report.merge_choice.merged_count == report.splits_as_views > 0
    assert isinstance(report.stream_choice, StreamChoice) and report.kernel_cache == "stored"
    assert list(report.phases) == [p for p in PHASES if p in report.phases]
    assert report.options.precision == "fp16" and report.options.layout == "nchw"
    loaded = BuildReport.from_dict(load(path).info)
    assert loaded == report
    assert loaded.format() == report.format()  # the phases in their order, though the manifest sorts its keys


def test_the_artifacts_info_is_the_reports_dict_with_the_keys_artifacts_always_held(built):
    result, path = built
    with open(os.path.join(path, "manifest.json")) as f:
        info = json.load(f)["info"]
    assert info == json.loads(json.dumps(result.report.to_dict())) == result.info
    assert set(info) == INFO_KEYS
    assert set(info["accuracy"]) == {"precision", "rel_l2", "seeds", "reference", "input_dependent",
                                     "reference_cached"}
    assert set(info["streams_choice"]) == {"memory_budget", "candidates", "chosen", "chosen_order", "how"}
    assert {k for c in info["streams_choice"]["candidates"] for k in c} == {"max_streams", "order", "streams",
                                                                           "pool_bytes"}
    assert set(info["merge_choice"]) == {"mode", "groups"}
    assert {k for g in info["merge_choice"]["groups"] for k in g} == {"group", "merged", "why"}
    assert info["providers"] is None and info["policy"] and info["max_streams"] is None
    with pytest.raises(AttributeError):
        result.info = {}  # read-only: the report is the build's record


def test_an_older_artifacts_info_reads_back_with_defaults():
    """An info written before later keys existed (no merge, layout, providers, candidate order, GEMM provider,
    check skipped): read back, the missing parts take their defaults, and it prints."""
    old = {"max_streams": None, "kernels": "best", "precision": "fp32", "tuning_db": None, "concats_in_place": 2,
           "streams_choice": {"candidates": [{"max_streams": 1, "streams": 1, "pool_bytes": 64, "measured_ms": 1.5},
                                             {"max_streams": 2, "streams": 2, "pool_bytes": 96, "measured_ms": 1.0}],
                              "chosen": 2, "how": "measured on this machine"},
           "kernel_choice": [{"signature": "conv", "count": 2, "vendor_ms": 0.1, "tvm_ms": 0.2, "kernel": "vendor"}],
           "gemm_algorithms": [{"signature": "gemm", "candidates_us": [3.0, 2.0], "chosen": 1}],
           "phases": {"schedule": 0.5, "import": 1.0}}
    report = BuildReport.from_dict(old)
    assert report.options.merge is None and report.options.layout is None and report.splits_as_views is None
    assert report.stream_choice.chosen_order == "program" and report.stream_choice.chosen_ms == 1.0
    assert report.kernel_choice.timings[0].provider == "" and report.kernel_choice.gemm_algorithms[0].provider is None
    assert list(report.phases) == ["import", "schedule"]
    text = report.format()
    assert "stream cap: 2 (measured on this machine)" in text and "1 run a faster one" in text
    assert text.endswith("build phases: import 1.0 s, schedule 0.5 s (total 1.5 s)")
    detail = report.format(detail=True)  # explain's: every chain timed, each GEMM run with another algorithm
    assert "  algorithm 1: 2.0 us (first: 3.0 us)  gemm" in detail and "algorithm 1:" not in text
    assert "     2    vendor   0.1000   0.2000  vendor    conv" in detail
    assert BuildReport.from_dict({}) == BuildReport() and KernelChoice.from_dict({}) == KernelChoice()
