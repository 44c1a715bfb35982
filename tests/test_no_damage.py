"""Commands do no damage (issue #33): they leave the repository's committed files alone, refuse to mix
tuning databases or to overwrite an artifact silently, and a path they cannot write is one line naming it
and the fix, never a traceback. Real runs on real files, on llvm: the commands through ``tvm_nimble.cli.main`` in
this process (tests/cli_runner.py), a benchmark run in a process of its own."""
import hashlib
import json
import os
import shutil
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_nimble
from cli_runner import run_cli, run_cli_process
from tvm_nimble.runtime.artifact import ArtifactError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED_DB = os.path.join(ROOT, "tuning", "sm_90", "incept6")  # a cuda sm_90 database of zoo:incept6


cli = run_cli
cli_process = run_cli_process


def one_line_error(r, code=1):
    """The command failed with ``code`` and said why in exactly one line, no traceback."""
    assert r.returncode == code, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    lines = [l for l in r.stderr.splitlines() if l.startswith("tvm-nimble:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


def tree_hashes(path):
    """{relative path: sha256} of every file under ``path``."""
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, path)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def conv_relu_model(channels=4):
    """Conv + Relu: one fused kernel, built in seconds."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, channels, 3, 3)) * 0.2).astype("float32"), "w")
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["output"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, channels, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 8, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(onnx path, artifact path, input .npy path) of the conv+relu model, compiled once."""
    from tvm_nimble import zoo

    d = tmp_path_factory.mktemp("tiny")
    path = zoo.save(conv_relu_model(), str(d / "tiny.onnx"))
    np.save(d / "x.npy", np.ones((1, 4, 8, 8), np.float32))
    art = str(d / "tiny.nimble")
    r = cli("compile", path, "-o", art, "--target", "llvm")
    assert r.returncode == 0, r.stderr
    return path, art, str(d / "x.npy")


@pytest.fixture(scope="module")
def built():
    """The conv+relu model built in this process (a loaded artifact's kernels cannot be exported again)."""
    return tvm_nimble.build(conv_relu_model(), "llvm")


# -- 1. bench writes to ./bench-results, not into the repository's benchmarks/ --------------------------

def test_bench_without_out_writes_bench_results_in_the_cwd_not_the_repository(tiny, tmp_path):
    path, _, _ = tiny
    before = tree_hashes(os.path.join(ROOT, "benchmarks"))
    r = cli_process("bench", "--onnx", path, "--models", "", "--target", "llvm", "--rounds", "1", "--iters", "3",
            cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert {"results.csv", "RESULTS.md", "results.png", "machines.json"} <= set(os.listdir(tmp_path / "bench-results"))
    assert "tiny.onnx" in (tmp_path / "bench-results" / "results.csv").read_text()
    assert tree_hashes(os.path.join(ROOT, "benchmarks")) == before  # nothing rewritten, nothing added
    # --report-only regenerates from an explicit --out (how maintainers regenerate benchmarks/RESULTS.md)
    r = cli("bench", "--report-only", "--out", "bench-results", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert tree_hashes(os.path.join(ROOT, "benchmarks")) == before


def test_bench_report_only_without_results_names_the_fix(tmp_path):
    line = one_line_error(cli("bench", "--report-only", cwd=str(tmp_path)))
    assert "no results.csv in bench-results" in line and "--out" in line
    assert not (tmp_path / "bench-results").exists()


def test_bench_out_on_a_file_is_one_line(tiny, tmp_path):
    path, _, _ = tiny
    (tmp_path / "f").write_text("x")
    line = one_line_error(cli("bench", "--onnx", path, "--models", "", "--target", "llvm", "--out",
                              str(tmp_path / "f")))
    assert str(tmp_path / "f") in line and "give --out a folder" in line
    line = one_line_error(cli("bench", "--onnx", path, "--models", "", "--target", "llvm", "--out",
                              str(tmp_path / "f" / "sub")))
    assert str(tmp_path / "f" / "sub") in line and "give --out a folder" in line


# -- 2. tuning databases: no mixing, and a database that applies to nothing is said ----------------------

def copy_of_committed_db(tmp_path):
    db = tmp_path / "db"
    shutil.copytree(COMMITTED_DB, db)
    return str(db), tree_hashes(db)


def test_tune_refuses_a_work_dir_of_another_target(tiny, tmp_path):
    path, _, _ = tiny
    db, before = copy_of_committed_db(tmp_path)
    line = one_line_error(cli("tune", path, "--target", "llvm", "--work-dir", db, "--trials", "1"))
    assert f"--work-dir {db} holds the tuning database for cuda, not model 'tiny' for llvm" in line
    assert "pick another --work-dir" in line
    assert tree_hashes(db) == before


def test_tune_refuses_a_work_dir_of_another_model(tiny, tmp_path):
    path, _, _ = tiny
    # a database whose summary names its model (what `tune` records now)
    db = tmp_path / "named"
    db.mkdir()
    (db / "tuning_summary.json").write_text(json.dumps({"model": "incept6", "target": "llvm", "tasks": []}))
    before = tree_hashes(db)
    line = one_line_error(cli("tune", path, "--target", "llvm", "--work-dir", str(db), "--trials", "1"))
    assert "holds the tuning database of model 'incept6' for llvm, not model 'tiny' for llvm" in line
    assert tree_hashes(db) == before
    # a database from before the model was recorded: told by its workloads (none of the model's kernels)
    db, before = copy_of_committed_db(tmp_path)
    line = one_line_error(cli("tune", path, "--target", "cuda", "--arch", "sm_90", "--work-dir", db, "--trials", "1"))
    assert "holds another model's tuning database (for cuda): none of the 1 kernels of model 'tiny'" in line
    assert tree_hashes(db) == before


NOTHING_APPLIES = "nothing in the tuning database"


def test_compile_with_a_database_that_matches_nothing_warns(tiny, tmp_path):
    path, _, _ = tiny
    before = tree_hashes(COMMITTED_DB)
    r = cli("compile", path, "-o", str(tmp_path / "o.nimble"), "--target", "llvm", "--tuning-db", COMMITTED_DB)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if NOTHING_APPLIES in l]
    assert len(lines) == 1 and COMMITTED_DB in lines[0] and "`tvm-nimble tune`" in lines[0]
    assert tree_hashes(COMMITTED_DB) == before  # the lookups wrote nothing into the database


def test_a_tiny_tuned_database_applies_records_its_owner_and_refuses_another_model(tmp_path):
    from tvm_nimble.compiler.tuning.tune import tune
    from tvm_nimble.errors import NimbleError

    model, other = conv_relu_model(4), conv_relu_model(6)
    db = str(tmp_path / "db")
    kw = dict(trials_per_task=1, trials_per_round=1, strategy="replay-trace", cost_model="random", progress=False)
    tune(model, "llvm", db, model_name="tiny", **kw)
    summary = json.load(open(os.path.join(db, "tuning_summary.json")))
    assert summary["model"] == "tiny" and summary["target"] == "llvm"
    before = tree_hashes(db)
    with pytest.raises(NimbleError, match="holds the tuning database of model 'tiny' for llvm, not model 'other'"):
        tune(other, "llvm", db, model_name="other", **kw)
    with pytest.raises(NimbleError, match="none of the 1 kernels of this model for llvm is in it"):
        tune(other, "llvm", db, **kw)  # no name given: told by the workloads
    assert tree_hashes(db) == before
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tvm_nimble.build(model, "llvm", tuning_db=db)  # its own database: no warning
        assert not [w for w in caught if NOTHING_APPLIES in str(w.message)]
        tvm_nimble.build(other, "llvm", tuning_db=db)
        assert len([w for w in caught if NOTHING_APPLIES in str(w.message)]) == 1


# -- 3. output paths that cannot be written: one line naming the path and the fix -----------------------

def test_compile_onto_a_file_or_under_a_file_is_one_line(tiny, tmp_path):
    path, _, _ = tiny
    f = tmp_path / "file.txt"
    f.write_text("keep me")
    line = one_line_error(cli("compile", path, "-o", str(f), "--target", "llvm"))
    assert str(f) in line and "is a file" in line and "choose another output path" in line
    line = one_line_error(cli("compile", path, "-o", str(f / "sub" / "m.nimble"), "--target", "llvm"))
    assert str(f / "sub" / "m.nimble") in line and f"{f} is a file, not a directory" in line
    assert f.read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_compile_into_a_read_only_directory_is_one_line(tiny, tmp_path):
    path, _, _ = tiny
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        line = one_line_error(cli("compile", path, "-o", str(ro / "m.nimble"), "--target", "llvm"))
        assert str(ro / "m.nimble") in line and "no write permission" in line
        line = one_line_error(cli("run", tiny[1], "--input", f"input={tiny[2]}", "--output-dir", str(ro / "out")))
        assert str(ro / "out") in line and "no write permission" in line
    finally:
        ro.chmod(0o755)


def test_run_output_dir_on_a_file_is_one_line(tiny, tmp_path):
    _, art, x = tiny
    f = tmp_path / "file.txt"
    f.write_text("keep me")
    for out in (f, f / "sub"):
        line = one_line_error(cli("run", art, "--input", f"input={x}", "--output-dir", str(out)))
        assert str(out) in line and "is a file, not a folder" in line and "give --output-dir a folder" in line
    assert f.read_text() == "keep me"


def test_export_to_an_unwritable_path_raises_a_one_line_artifact_error(built, tmp_path):
    module = built
    f = tmp_path / "file.txt"
    f.write_text("keep me")
    for target in (f, f / "m.nimble"):
        with pytest.raises(ArtifactError, match="is a file") as e:
            module.export(str(target))
        assert str(target) in str(e.value) and "\n" not in str(e.value)
    assert f.read_text() == "keep me"


# -- 4. an existing artifact is replaced only when asked ---------------------------------------------

def test_compile_onto_an_artifact_needs_force(tiny, tmp_path):
    path, art, _ = tiny
    out = tmp_path / "m.nimble"
    shutil.copytree(art, out)
    (out / "marker").write_text("the old artifact")
    line = one_line_error(cli("compile", path, "-o", str(out), "--target", "llvm"))
    assert str(out) in line and "already holds an artifact" in line and "--force" in line
    assert (out / "marker").exists()
    r = cli("compile", path, "-o", str(out), "--target", "llvm", "--force")
    assert r.returncode == 0, r.stderr
    assert not (out / "marker").exists() and (out / "manifest.json").is_file()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no staging folder left behind
    assert cli("run", str(out), "--input", f"input={tiny[2]}").returncode == 0


def test_export_onto_an_artifact_needs_overwrite(built, tmp_path):
    module = built
    path = str(tmp_path / "m.nimble")
    module.export(path)
    open(os.path.join(path, "marker"), "w").close()
    with pytest.raises(ArtifactError, match="already holds an artifact; pass overwrite=True"):
        module.export(path)
    assert os.path.exists(os.path.join(path, "marker"))
    assert module.export(path, overwrite=True) == path
    assert not os.path.exists(os.path.join(path, "marker"))
    assert tvm_nimble.load(path).plan == module.plan
