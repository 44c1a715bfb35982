"""The rough edges a new user hit (issue #54), each as that user met it: the README's install, `tune`'s
defaults, a bad target, models the importer refuses, `run`'s inputs, what a build prints, the help."""
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib

import numpy as np
import pytest
from onnx import TensorProto, helper

import tvm_nimble
from tvm_nimble import NimbleError, zoo
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.errors import ShapeError

from cli_runner import run_cli
from test_user_errors import ROOT, cli, one_error_line, relu_model

FAST_TAKE_LOG = "Fast mode segfaults when there are out-of-bounds indices"


def usage_line(r) -> str:
    """The one ``tvm-nimble: usage error`` line of a command refused with exit code 2."""
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("tvm-nimble: usage error")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def model_of(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gather_model():
    """y = Gather(table, ids): one ONNX Gather, which TVM lowers to topi's take in "fast" mode."""
    return model_of([helper.make_node("Gather", ["table", "ids"], ["y"])],
                    [helper.make_tensor_value_info("table", TensorProto.FLOAT, [4, 3]),
                     helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A cache root of this test's own (no compiled kernel from another test, no tuning database)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TVM_NIMBLE_CACHE_DIR", str(root))
    return root


# ---- 1: the README's install ------------------------------------------------------------------
def test_the_install_section_says_how_to_reach_the_command():
    """After `make install`, `tvm-nimble` lives in the venv the Makefile creates: the Install section must say to
    activate that venv or call its tvm-nimble by path, in a line that is run or shown as a command."""
    venv = re.search(r"^VENV\s*:?=\s*(\S+)", open(os.path.join(ROOT, "Makefile")).read(), re.M).group(1)
    scripts = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]["scripts"]
    assert "tvm-nimble" in scripts
    readme = open(os.path.join(ROOT, "README.md")).read()
    install = readme[readme.index("## Install"):readme.index("\n## ", readme.index("## Install") + 1)]
    ways = (f". {venv}/bin/activate", f"source {venv}/bin/activate", f"{venv}/bin/tvm-nimble")
    commands = [line.strip() for block in re.findall(r"```bash\n(.*?)```", install, re.S)
                for line in block.splitlines()]
    assert any(line.startswith(ways) for line in commands), (ways, commands)


# ---- 2: tune ----------------------------------------------------------------------------------
def test_tune_builds_for_llvm_and_a_budget_the_setup_spent_is_an_error(tmp_path, fresh_cache):
    """No --target: llvm, as every other command (cuda asked this GPU-less machine for an arch). A budget gone
    before the first round ran no trial and exited 0; and nothing is written to the current folder."""
    work = tmp_path / "here"
    work.mkdir()
    model = zoo.save(relu_model(), str(tmp_path / "m.onnx"))
    line = one_error_line(cli("tune", model, "--time-budget", "0.001", cwd=str(work)))
    assert "0.001s time budget was spent before the first round" in line and "larger" in line, line
    assert not os.listdir(work), os.listdir(work)


def test_tune_keeps_its_database_under_the_cache_root_and_says_where(tmp_path, fresh_cache):
    from test_tuning import one_kernel_model

    work = tmp_path / "here"
    work.mkdir()
    model = zoo.save(one_kernel_model(), str(tmp_path / "m.onnx"))
    r = cli("tune", model, "--trials", "1", "--strategy", "replay-trace", "--cost-model", "random", cwd=str(work))
    assert r.returncode == 0, r.stderr[-3000:]
    db = fresh_cache / "tuning" / "cpu" / "m"
    assert os.path.isfile(db / "database_tuning_record.json")
    assert f"database: {db}" in r.stdout and f"--tuning-db {db}" in r.stdout, r.stdout
    assert not os.listdir(work), os.listdir(work)


def test_tune_refuses_an_arch_without_the_cuda_target(tmp_path):
    """--arch alone meant a GPU build while cuda was tune's default; now it would be ignored: refused."""
    r = cli("tune", "m.onnx", "--arch", "sm_90", cwd=str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    assert "--arch sm_90" in line and "--target cuda" in line, line


# ---- 3: an empty target -----------------------------------------------------------------------
@pytest.mark.parametrize("target", ["", "  ", "opencl"])
def test_a_target_that_is_no_target_names_the_accepted_ones(tmp_path, target):
    path = zoo.save(relu_model(), str(tmp_path / "m.onnx"))
    with pytest.raises(NimbleError) as info:
        tvm_nimble.build(path, target)
    msg = str(info.value)
    assert "\n" not in msg and "'llvm'" in msg and "'cuda'" in msg and "'sm_90'" in msg, msg


@pytest.mark.parametrize("level", ["0", "3"])
def test_the_llvm_optimization_level_reaches_cpu_builds_and_their_cache_keys(monkeypatch, level):
    """TVM_NIMBLE_LLVM_OPT_LEVEL (the test suite runs at 0): a CPU build's target carries it, the timing cache keeps
    its builds apart, a target that names its own level keeps it, the outputs are the ONNX reference's; a level
    that is none is one line."""
    from onnx.reference import ReferenceEvaluator

    from tvm_nimble import env
    from tvm_nimble.compiler.target import resolve_target
    from tvm_nimble.compiler.timing_cache import context_of

    monkeypatch.setenv(env.LLVM_OPT_LEVEL, level)
    assert int(resolve_target("llvm").attrs["opt-level"]) == int(level)
    assert int(resolve_target({"kind": "llvm", "opt-level": 2}).attrs["opt-level"]) == 2
    other = "3" if level == "0" else "0"
    with monkeypatch.context() as m:
        m.setenv(env.LLVM_OPT_LEVEL, other)
        assert context_of(resolve_target("llvm")) != context_of(resolve_target(f"llvm -opt-level={level}"))
    model = zoo.get_model("inception", blocks=1)
    inputs = zoo.random_inputs(model, seed=0)
    want = ReferenceEvaluator(model).run(None, inputs)[0]
    got = tvm_nimble.NimbleExecutor(tvm_nimble.build(model, "llvm"))(**inputs)[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    monkeypatch.setenv(env.LLVM_OPT_LEVEL, "fast")
    with pytest.raises(NimbleError, match="give an LLVM optimization level 0, 1, 2 or 3") as info:
        tvm_nimble.build(model, "llvm")
    assert "\n" not in str(info.value)


# ---- 4: every data-dependent operator -----------------------------------------------------------
def test_every_data_dependent_operator_is_named():
    model = model_of([helper.make_node("Unique", ["x"], ["u"], name="uniq"),
                      helper.make_node("NonZero", ["x"], ["nz"], name="where"),
                      helper.make_node("NonZero", ["x"], ["nz2"], name="where2")],
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                     [helper.make_tensor_value_info("u", TensorProto.FLOAT, [None]),
                      helper.make_tensor_value_info("nz", TensorProto.INT64, [1, None]),
                      helper.make_tensor_value_info("nz2", TensorProto.INT64, [1, None])])
    with pytest.raises(ShapeError) as info:
        from_onnx(model)
    msg = str(info.value)
    assert "Unique (node 'uniq')" in msg and "NonZero (2 nodes, e.g. 'where')" in msg and "\n" not in msg, msg
    assert "depends on the input's values" in msg


# ---- 5: a dimension of 0 or below ---------------------------------------------------------------
def relu_of(dims):
    return model_of([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])


@pytest.mark.parametrize("bad", [0, -3])
def test_a_declared_dimension_of_zero_or_below_is_invalid_not_dynamic(bad):
    with pytest.raises(ShapeError) as info:
        from_onnx(relu_of([1, bad, 4]))
    msg = str(info.value)
    assert f"dim 1 as {bad}, not a valid size" in msg and "dynamic" not in msg, msg
    assert "shape_dict={'x': (1, N, 4)}" in msg and "--shape x=1,N,4" in msg, msg  # no made-up size 1
    mod = from_onnx(relu_of([1, bad, 4]), shape_dict={"x": (1, 2, 4)})  # the real shape fixes it
    assert [int(d) for d in mod["main"].params[0].ty.shape] == [1, 2, 4]


def test_a_dynamic_and_an_invalid_dimension_are_told_apart():
    msg = str(pytest.raises(ShapeError, from_onnx, relu_of(["b", 0, 4])).value)
    assert "dim 1 as 0, not a valid size" in msg and "dynamic dim 0 ('b')" in msg and "(b, 0, 4)" in msg, msg


def test_a_given_dimension_of_zero_is_invalid(tmp_path):
    msg = str(pytest.raises(ShapeError, from_onnx, relu_of(["b", 2, 4]), shape_dict={"x": (1, 0, 4)}).value)
    assert "dim 1 = 0, which is not a valid size" in msg, msg
    path = zoo.save(relu_of(["b", 2, 4]), str(tmp_path / "m.onnx"))
    line = usage_line(run_cli("compile", path, "-o", str(tmp_path / "out"), "--shape", "x=1,0,4"))
    assert "--shape x=1,0,4" in line and "dimension 1 is 0, not a valid size" in line, line
    assert "shape_dict" not in line, line  # the command line's terms


# ---- 6: run's inputs ------------------------------------------------------------------------------
def test_run_names_an_input_the_model_does_not_have(tmp_path):
    model = gather_model()
    art = str(tmp_path / "m.nimble")
    tvm_nimble.build(model, "llvm").export(art)
    np.save(tmp_path / "t.npy", np.zeros((4, 3), np.float32))
    line = usage_line(run_cli("run", art, "--input", f"data={tmp_path / 't.npy'}"))
    assert "'data' is not an input of the model" in line and "'table', 'ids'" in line, line


# ---- 7: what a build prints -------------------------------------------------------------------
_STOCK_GATHER = """
import sys, onnx, tvm
from tvm.relax.frontend.onnx import from_onnx
tvm.compile(from_onnx(onnx.load(sys.argv[1])), tvm.target.Target("llvm"))
"""


def test_the_fast_take_log_is_left_out_of_a_build(tmp_path, fresh_cache):
    """TVM logs its fast-mode warning for every Gather, from C++, at every legalization; our import makes the takes
    clip their indices (relay_passes/take_indices.py; the executor checks the ids, test_check_inputs.py). The stock
    build shows the log is there to leave out."""
    path = zoo.save(gather_model(), str(tmp_path / "g.onnx"))
    stock = subprocess.run([sys.executable, "-c", _STOCK_GATHER, path], capture_output=True, text=True, timeout=600)
    assert stock.returncode == 0 and FAST_TAKE_LOG in stock.stderr, stock.stderr[-2000:]
    r = run_cli("compile", path, "-o", str(tmp_path / "g.nimble"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert FAST_TAKE_LOG not in r.stderr and "compiling g.onnx" in r.stderr, r.stderr


def test_a_note_is_one_line(tmp_path, fresh_cache):
    """Python's warning display adds the file, line number and source line of the warnings.warn call."""
    path = zoo.save(relu_model(99), str(tmp_path / "m.onnx"))  # an opset newer than the importer knows: a note
    r = run_cli("compile", path, "-o", str(tmp_path / "m.nimble"))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    (i,) = [i for i, line in enumerate(lines) if "opset 99" in line]
    assert lines[i].startswith("note: ") and "warnings.warn" not in r.stderr, r.stderr
    assert "UserWarning" not in r.stderr and ".py:" not in r.stderr, r.stderr


# ---- 8: the help ------------------------------------------------------------------------------
def test_version_names_tvm_nimble_and_its_tvm():
    r = run_cli("--version")
    assert r.returncode == 0, r.stderr[-2000:]
    tvm_version = importlib.metadata.version("apache-tvm")
    assert r.stdout.strip() == f"tvm-nimble {tvm_nimble.__version__} (TVM {tvm_version})", r.stdout


def test_run_help_shows_the_mode_default():
    text = " ".join(run_cli("run", "--help").stdout.split())
    assert "executor mode (default: cuda-graph for a CUDA artifact, sequential for an llvm one)" in text, text


def test_help_names_tensorrt_only_as_not_available():
    for text in (run_cli("--help").stdout, run_cli("bench", "--help").stdout):
        assert "usage:" in text
        for sentence in re.split(r"(?<=[.;:)])\s", " ".join(text.split())):
            if "TensorRT" in sentence:
                assert "not available" in sentence or "cannot be" in sentence, sentence
