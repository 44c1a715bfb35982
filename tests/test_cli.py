"""Every `tvm-nimble` command on real files: through ``tvm_nimble.cli.main`` in this process (tests/cli_runner.py),
and as a user's shell runs it (a subprocess) where the entry point or a fresh process is what is checked."""
import os
import shutil
import subprocess

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from cli_runner import run_cli, run_cli_process
from tvm_nimble import zoo

cli = run_cli
cli_process = run_cli_process


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    model = zoo.get_model("inception", blocks=2)
    path = zoo.save(model, str(d / "incept.onnx"))
    x = zoo.random_inputs(model)["input"]
    np.save(d / "x.npy", x)
    return path, model, x, d


def test_compile_then_run_gives_the_reference_output(model_file):
    path, model, x, d = model_file
    art = str(d / "incept.nimble")
    r = cli_process("compile", path, "-o", art, "--target", "llvm")
    assert r.returncode == 0, r.stderr
    assert "stream(s)" in r.stdout
    r = cli_process("run", art, "--input", f"input={d / 'x.npy'}", "--output-dir", str(d / "out"))
    assert r.returncode == 0, r.stderr
    out = np.load(d / "out" / "output0.npy")
    np.testing.assert_allclose(out, ReferenceEvaluator(model).run(None, {"input": x})[0], rtol=1e-4, atol=1e-4)


def test_explain_writes_a_dot_file_graphviz_parses(model_file):
    path, _, _, d = model_file
    dot = str(d / "incept.dot")
    r = cli("explain", path, "--dot", dot, "--plan")
    assert r.returncode == 0, r.stderr
    assert "DAG width" in r.stdout and "streams:" in r.stdout and "idx  stream" in r.stdout
    assert open(dot).read().startswith("digraph")
    if not shutil.which("dot"):
        pytest.skip("Graphviz 'dot' is not installed (make test installs it where apt-get works)")
    p = subprocess.run(["dot", "-Tsvg", dot, "-o", str(d / "incept.svg")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_demo_runs_on_cpu():
    r = cli("demo", "--target", "llvm", "--iters", "5")
    assert r.returncode == 0, r.stderr
    assert "outputs match stock TVM" in r.stdout
    assert "Nimble AoT replay (CPU)" in r.stdout and "stock TVM VM" in r.stdout


def test_bench_writes_results(model_file, tmp_path):
    path, _, _, _ = model_file
    r = cli_process("bench", "--onnx", path, "--models", "", "--target", "llvm", "--rounds", "1", "--iters", "3",
            "--dtype", "float32,float16", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert {"results.csv", "RESULTS.md", "results.png"} <= set(os.listdir(tmp_path))
    # the three outputs parse and agree with what the run printed
    import csv

    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert sorted((r["dtype"], r["system"]) for r in rows) == sorted(
        (d, s) for d in ("float32", "float16") for s in ("tvm-vm", "nimble-aot-cpu"))
    assert all(float(r["build_s"]) > 0 for r in rows)  # every system's build was timed
    assert {r["model"] for r in rows} == {"incept.onnx"} and {r["batch"] for r in rows} == {"1"}
    printed = {tuple(line.split()[2:4]): line.split()[4] for line in r.stdout.splitlines()
               if line.startswith("incept.onnx")}
    assert printed == {(r["dtype"], r["system"]): r["median_ms"] for r in rows}
    md = open(tmp_path / "RESULTS.md").read()
    for row in rows:
        assert f"| {row['system']} | {row['median_ms']} | {row['p90_ms']} |" in md
    built = md[md.index("## Build time"):md.index("## All runs")]
    for dtype in ("float32", "float16"):  # one table per dtype, the builds' seconds as results.csv has them
        by = {r["system"]: float(r["build_s"]) for r in rows if r["dtype"] == dtype}
        lines = built[built.index(f", {dtype}**"):].splitlines()
        head = [c.strip() for c in next(l for l in lines if l.startswith("| model")).strip("|").split("|")]
        cells = [c.strip() for c in next(l for l in lines if l.startswith("| incept.onnx")).strip("|").split("|")]
        assert cells[head.index("TVM VM")] == f"{by['tvm-vm']:.1f}"
        assert cells[head.index("nimble-aot-cpu")] == f"{by['nimble-aot-cpu']:.1f}"
        assert float(row["p90_ms"]) >= float(row["median_ms"]) > 0
    assert open(tmp_path / "results.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # no TensorRT here (not installable on our machines): the report says so instead of a number
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        assert "TensorRT not installed" in md and "tensorrt" not in {row["system"] for row in rows}
    # regenerating the report from the CSV alone gives the same tables (the run's notes aside)
    r = cli_process("bench", "--report-only", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    tables = md[md.index("## All runs"):]
    assert open(tmp_path / "RESULTS.md").read().endswith(tables)


@pytest.mark.parametrize("args, message", [
    (("compile", "/no/such.onnx", "-o", "/tmp/x.nimble"), "ONNX file not found"),
    (("run", "/no/such.nimble"), "artifact not found"),
    (("explain", "/no/such.onnx"), "ONNX file not found"),
])
def test_failures_exit_1_with_one_line(args, message):
    r = cli(*args)
    assert r.returncode == 1
    lines = [l for l in r.stderr.splitlines() if l.startswith("tvm-nimble: error")]
    assert len(lines) == 1 and message in lines[0]
    assert "Traceback" not in r.stderr


def test_malformed_model_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf at all" * 3)
    r = cli("compile", str(bad), "-o", str(tmp_path / "o"))
    assert r.returncode == 1 and "not a valid ONNX model" in r.stderr and "Traceback" not in r.stderr


def test_usage_errors_exit_2():
    assert cli("compile").returncode == 2
    assert cli("frobnicate").returncode == 2
    r = cli("run", "x", "--input", "novalue")
    assert r.returncode in (1, 2)


@pytest.mark.parametrize("command", ["demo", "zoo", "compile", "run", "explain", "bench", "tune", "prepare"])
def test_help_has_examples(command):
    r = cli(command, "--help")
    assert r.returncode == 0 and "example" in r.stdout


def one_line_error(r, code=1):
    """The command failed with ``code`` and said why in exactly one line, no traceback."""
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    lines = [l for l in r.stderr.splitlines() if l.startswith("tvm-nimble:")]  # (progress and warnings aside)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


def test_a_data_dependent_shape_is_named_before_import(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["idx"], name="nz")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("idx", TensorProto.INT64, [2, None])])
    path = zoo.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "nz.onnx"))
    line = one_line_error(cli("compile", path, "-o", str(tmp_path / "o")))
    assert "NonZero (node 'nz')" in line and "depends on the input's values" in line and "static shapes" in line


def test_the_dynamic_shape_hint_shows_the_cli_flag(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    path = zoo.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "dyn.onnx"))
    assert "--shape x=1,8" in one_line_error(cli("compile", path, "-o", str(tmp_path / "o")))


def test_duplicate_flags_are_usage_errors(model_file, tmp_path):
    path, _, _, d = model_file
    line = one_line_error(cli("compile", path, "-o", str(tmp_path / "o"), "--shape", "input=1,3,16,16",
                              "--shape", "input=1,3,32,32"), code=2)
    assert "--shape input=... is given twice" in line
    art = str(d / "incept.nimble")
    if not os.path.isdir(art):
        assert cli("compile", path, "-o", art, "--target", "llvm").returncode == 0
    x = f"input={d / 'x.npy'}"
    assert "--input input=... is given twice" in one_line_error(cli("run", art, "--input", x, "--input", x), code=2)


@pytest.mark.parametrize("content", [b"", b"\x93NUMPY garbage", b"not numpy at all" * 4])
def test_a_bad_npy_input_is_named(model_file, tmp_path, content):
    path, _, _, d = model_file
    art = str(d / "incept.nimble")
    if not os.path.isdir(art):
        assert cli("compile", path, "-o", art, "--target", "llvm").returncode == 0
    bad = tmp_path / "bad.npy"
    bad.write_bytes(content)
    line = one_line_error(cli("run", art, "--input", f"input={bad}"))
    assert str(bad) in line and "not a valid .npy array" in line and "allow_pickle" not in line


def test_an_arch_nvcc_cannot_compile_for_is_one_line(model_file, tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed: the arch is checked against nvcc --list-gpu-arch")
    path, _, _, _ = model_file
    line = one_line_error(cli("compile", path, "-o", str(tmp_path / "o"), "--target", "cuda", "--arch", "sm_12",
                              "--kernels", "tvm"))
    assert "sm_12" in line and "sm_90" in line


def test_explain_counts_inputs_outputs_and_constants(model_file):
    path, _, _, _ = model_file
    r = cli("explain", path)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("memory: inputs"))
    assert "inputs 3.0 KiB" in line and "outputs 40 B" in line  # 1x3x16x16 and 1x10 float32
    assert "kernels by source: " in r.stdout and "tvm-default" in r.stdout


def test_zoo_writes_a_model_and_lists_names(tmp_path):
    """`tvm-nimble zoo`: the README's documented source of model.onnx."""
    r = cli("zoo", "--list")
    assert r.returncode == 0, r.stderr
    listed = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    assert listed == sorted(zoo.ZOO)  # one line per model
    r = cli("zoo", "inception", "-o", "model.onnx", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "float32[1, 3, 16, 16]" in r.stdout
    import onnx

    written = onnx.load(str(tmp_path / "model.onnx"))
    assert written.SerializeToString() == zoo.get_model("inception").SerializeToString()  # the zoo default, seeded
    r = cli("zoo", "resnet", "--batch", "2", "--hw", "8", cwd=str(tmp_path))  # default -o: NAME.onnx here
    assert r.returncode == 0, r.stderr
    assert zoo.input_shape(onnx.load(str(tmp_path / "resnet.onnx"))) == {"input": (2, 3, 8, 8)}


@pytest.mark.parametrize("args, code, message", [
    (("zoo", "alexnet"), 2, "valid names are densenet, inception, mobilenet, nasnet, random_dag, resnet, vit"),
    (("zoo",), 2, "--list"),
    (("zoo", "vit", "--hw", "10"), 1, "multiple of patch"),
    (("zoo", "resnet", "--batch", "0"), 1, "batch must be"),
])
def test_zoo_errors_are_one_line(tmp_path, args, code, message):
    line = one_line_error(cli(*args, cwd=str(tmp_path)), code)
    assert message in line
    assert not os.listdir(tmp_path)  # nothing written


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_prepare_compiles_the_vendor_units_and_intrinsics_once(tmp_path, monkeypatch):
    """`prepare` (what `make install` runs on a GPU machine) compiles the vendor units asked for and parses TVM's
    tensor intrinsics into the machine's caches; a second run has nothing to compile; bad input is one line."""
    monkeypatch.setenv("TVM_NIMBLE_CACHE_DIR", str(tmp_path / "cache"))
    r = cli("prepare", "--arch", "sm_90", "--kernels", "nimble.norm")
    assert r.returncode == 0, r.stderr
    assert "1 of 1 units compiled" in r.stdout and (tmp_path / "cache" / "tvmscript").is_dir()
    library = r.stdout.strip().splitlines()[-1].rsplit(": ", 1)[1]
    assert os.path.isfile(library) and library.startswith(str(tmp_path / "cache"))
    again = cli("prepare", "--arch", "sm_90", "--kernels", "nimble.norm")
    assert again.returncode == 0 and "0 of 1 units compiled" in again.stdout and library in again.stdout
    assert "registers nimble.nothing" in one_line_error(cli("prepare", "--arch", "sm_90", "--kernels", "nimble.nothing"))
    if not os.path.exists("/dev/nvidia0"):  # no GPU: the arch must be given
        assert "--arch" in one_line_error(cli("prepare"))
