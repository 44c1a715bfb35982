"""What a newcomer hits first (issue #33): each mistake or missing piece is one line naming the problem and the
fix, exit code 1, no traceback. A missing optional package is simulated by a ``None`` entry in ``sys.modules``
(``import`` then raises ImportError, as when it is not installed); TVM itself is always the real one."""
import logging
import os
import shutil
import subprocess
import sys
import tomllib

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper

import tvm_nimble
from tvm_nimble import NimbleError, UnsupportedOperatorError, zoo
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.runtime.device import gpu_arch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the CLI as `tvm-nimble ARGS...` runs it, with the modules named in argv[1] made unimportable
_WITHOUT = """
import sys
for name in filter(None, sys.argv[1].split(",")):
    sys.modules[name] = None
from tvm_nimble.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def cli(*args, without=(), cwd=None, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", _WITHOUT, ",".join(without), *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=timeout)


def one_error_line(r, code=1) -> str:
    """The one ``tvm-nimble: error`` line of a failed command (and nothing that looks like a traceback)."""
    assert r.returncode == code, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("tvm-nimble: error")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def relu_model(opset=17):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def if_model(condition_nodes):
    """y = If(c, Relu(x), Neg(x)), c computed by ``condition_nodes`` from x."""
    def branch(op, out):
        return helper.make_graph([helper.make_node(op, ["x"], [out])], op, [],
                                 [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 4])])

    nodes = condition_nodes + [helper.make_node("If", ["c"], ["y"], name="branch_on_x", then_branch=branch("Relu", "t"),
                                                else_branch=branch("Neg", "e"))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def scalar(name, value, dtype=TensorProto.FLOAT):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name + "_v", dtype, [], [value]))


# ---- 1, 6: tune --------------------------------------------------------------------------------
def one_kernel_model():
    from test_tuning import one_kernel_model as model

    return model()


def test_tune_without_the_tune_extra_names_it(tmp_path):
    """`make run` installs no [tune] extra: MetaSchedule's missing psutil was a 31-line traceback."""
    model = zoo.save(one_kernel_model(), str(tmp_path / "m.onnx"))
    r = cli("tune", model, "--target", "llvm", "--work-dir", str(tmp_path / "db"), without=["psutil"])
    line = one_error_line(r)
    assert "psutil" in line and "pip install -e '.[tune]'" in line
    assert "tune" in tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"][
        "optional-dependencies"], "the message names an extra pyproject.toml does not have"
    assert not os.path.exists(tmp_path / "db"), "the check comes before any work"


def test_a_one_minute_budget_tunes(tmp_path):
    """A budget under the prior's estimate of one round (about 75 s) ran 0 trials and stopped at once 'for the
    time budget': the first round always runs. MetaSchedule's log lines go to its files, not the terminal."""
    from tvm_nimble.compiler.tuning.tune import tune

    db = str(tmp_path / "db")
    report = tune(one_kernel_model(), "llvm", db, trials_per_task=1, time_budget=70, strategy="replay-trace",
                  cost_model="random", progress=False)
    assert report.trials_this_run == 1 and report.rounds == 1 and not report.stopped_for_time
    ms_log = logging.getLogger("tvm.s_tir.meta_schedule")
    assert not [h for h in ms_log.handlers if h.get_name() == "tvm.s_tir.meta_schedule.console"]
    assert os.path.isfile(os.path.join(db, "logs", "tvm.s_tir.meta_schedule.logging.task_scheduler.log"))


def test_the_time_budget_stop_says_why():
    from tvm_nimble.compiler.tuning.tune import TuneReport

    task = [{"name": "conv", "weight": 1, "trials": 5, "best_us": 3.0}]
    left = TuneReport(tasks=task, trials_this_run=5, rounds=2, stopped_for_time=True, time_budget=60, time_left=12,
                      round_s=30).summary().splitlines()[-1]
    assert "stopped with 12s of the 60s time budget left, too little for another round" in left
    assert "rounds take up to 30s here" in left and "run again to continue" in left
    # (a budget spent before the first round is an error: test_new_user.py)


# ---- 2, 7, 8: bench ----------------------------------------------------------------------------
def test_bench_of_a_torchvision_model_without_pytorch_names_the_install(tmp_path):
    r = cli("bench", "--models", "tv:resnet50", "--target", "llvm", "--out", str(tmp_path / "out"),
            without=["torch", "torchvision"])
    line = one_error_line(r)
    assert "tv:resnet50" in line and "pip install torch torchvision" in line


def test_bench_of_an_unknown_model_lists_the_names_bench_takes(tmp_path):
    line = one_error_line(cli("bench", "--models", "incept7", "--target", "llvm", "--out", str(tmp_path / "out")))
    assert "'incept7'" in line
    for name in [*zoo.BENCH_MODELS, *zoo.BENCH_ALIASES, *zoo.ZOO]:
        assert name in line
        zoo.bench_model_spec(name)  # each name listed is one bench takes


def test_the_onnxruntime_note_says_what_to_install(monkeypatch):
    from tvm_nimble.bench.onnxruntime_peer import onnxruntime_systems

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    systems, notes = onnxruntime_systems(relu_model(), {"x": np.zeros((1, 4), "float32")})
    assert systems == [] and len(notes) == 1
    assert "pip install onnxruntime-gpu" in notes[0] and "shared/" not in notes[0]


def test_a_model_over_protobufs_limit_gets_its_shapes_inferred_through_a_file():
    """The fp16 ORT peer of a 0.5B decoder in float32 (over 2 GB) crashed the bench: onnxconverter-common's converter
    serializes the model for ONNX's shape inference. Over the limit (here made small) the shapes are inferred through
    a file, as ``onnx.shape_inference.infer_shapes`` gives them in memory, the weights kept."""
    from onnx import numpy_helper, shape_inference

    from tvm_nimble.bench.onnxruntime_peer import _shapes_inferred_on_disk

    w = np.arange(64, dtype="float32").reshape(4, 16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert _shapes_inferred_on_disk(model) is None  # under the limit: the converter's own inference
    inferred = _shapes_inferred_on_disk(model, limit=64)
    expected = shape_inference.infer_shapes(model)
    assert ([helper.printable_value_info(v) for v in inferred.graph.value_info] ==
            [helper.printable_value_info(v) for v in expected.graph.value_info] != [])
    np.testing.assert_array_equal(numpy_helper.to_array(inferred.graph.initializer[0]), w)


def test_a_peer_that_fails_to_start_is_a_note_and_the_benchmark_goes_on():
    from tvm_nimble.bench.harness import peer_or_why

    def broken(*args):
        raise RuntimeError("Failed to serialize\nproto")

    assert peer_or_why("ONNX Runtime", broken, 1) == ([], ["ONNX Runtime: RuntimeError: Failed to serialize proto: "
                                                           "no rows"])


# ---- 3, 4: import ------------------------------------------------------------------------------
def test_an_if_on_the_input_values_is_named_by_op_and_node(tmp_path):
    """It failed at the launch plan, named by a Relax binding ('gv4'): named by ONNX node, with the fix."""
    model = if_model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), scalar("zero", 0.0),
                      helper.make_node("Greater", ["s", "zero"], ["c"])])
    path = zoo.save(model, str(tmp_path / "if.onnx"))
    line = one_error_line(cli("compile", path, "-o", str(tmp_path / "if.nimble"), "--target", "llvm"))
    assert "If node 'branch_on_x'" in line and "static control flow" in line and "gv" not in line
    with pytest.raises(UnsupportedOperatorError, match="branch_on_x"):
        from_onnx(model)


def test_an_if_on_a_static_shape_takes_its_branch():
    """Exporters also branch on shapes, which are static here: the branch taken is built, the If is gone."""
    model = if_model([helper.make_node("Shape", ["x"], ["shape"]), scalar("zero", 0, TensorProto.INT64),
                      helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
                      scalar("one", 1, TensorProto.INT64), helper.make_node("Equal", ["batch", "one"], ["c"])])
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], "float32")
    out = tvm_nimble.NimbleExecutor(tvm_nimble.build(model, "llvm"))(x)[0].numpy()
    np.testing.assert_array_equal(out, np.maximum(x, 0))  # batch 1: the Relu branch


def test_a_loop_names_the_control_flow_fix():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Relu", ["v_in"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 4])])
    nodes = [scalar("trips", 3, TensorProto.INT64), scalar("go", True, TensorProto.BOOL),
             helper.make_node("Loop", ["trips", "go", "x"], ["y"], name="three_relus", body=body)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    with pytest.raises(UnsupportedOperatorError) as err:
        from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "Loop" in str(err.value) and "'three_relus'" in str(err.value) and "static control flow" in str(err.value)


def test_an_opset_newer_than_the_importer_is_warned_once(recwarn):
    from tvm_nimble.compiler.frontend import max_supported_opset

    newest = max_supported_opset()
    assert newest >= 17  # read from the importer's converters (the zoo's opset 17 is well inside)
    from_onnx(relu_model(17))
    assert not [w for w in recwarn if "opset" in str(w.message)]
    with pytest.warns(UserWarning) as caught:
        from_onnx(relu_model(99))
    (msg,) = [str(w.message) for w in caught if "opset" in str(w.message)]
    assert "opset 99" in msg and f"up to opset {newest}" in msg and "\n" not in msg


# ---- 5: rpc-server -----------------------------------------------------------------------------
def test_rpc_server_gives_up_on_an_unreachable_tracker():
    from tvm_nimble.compiler.tuning.remote import free_port

    port = free_port()  # nothing listens there
    r = cli("rpc-server", "--tracker", f"127.0.0.1:{port}", "--key", "k", "--connect-timeout", "1", timeout=120)
    line = one_error_line(r)
    assert f"cannot reach the RPC tracker at 127.0.0.1:{port} after 1 s" in line and "--connect-timeout" in line


def test_rpc_server_help_says_how_sessions_start():
    """The help said 'spawned' while install() starts every session from a fork server."""
    from tvm_nimble.runtime import rpc_session

    r = cli("rpc-server", "--help")
    assert r.returncode == 0 and "--connect-timeout" in r.stdout
    assert "every session runs in a process forked from a fork server" in r.stdout
    assert '"forkserver"' in open(rpc_session.__file__).read()  # what the help describes


# ---- 9: packaging ------------------------------------------------------------------------------
def test_a_wheel_builds_quietly_with_every_package(tmp_path):
    """pyproject.toml: setuptools warned about the license table and about folders missing from `packages`
    (a wheel then lacked relay_passes/providers and the vendor headers)."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__}: pyproject.toml needs >= 77")
    src = tmp_path / "src"
    for name in ("tvm_nimble", "relay_passes", "codegen"):
        shutil.copytree(os.path.join(ROOT, name), src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Warning" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    import zipfile

    (wheel,) = os.listdir(tmp_path / "wheel")
    names = set(zipfile.ZipFile(tmp_path / "wheel" / wheel).namelist())
    for folder, package in (("tvm_nimble", "tvm_nimble"), ("relay_passes", "tvm_nimble/relay_passes"),
                            ("codegen", "tvm_nimble/codegen")):
        for here, dirs, files in os.walk(src / folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in files:
                rel = os.path.relpath(os.path.join(here, f), src / folder)
                assert f"{package}/{rel}".replace(os.sep, "/") in names, f"{folder}/{rel} is not in the wheel"


# ---- 10: the TVM way ---------------------------------------------------------------------------
@pytest.mark.skipif(gpu_arch() is not None, reason="a GPU is visible: tvm.target.Target('cuda') takes its arch")
def test_tvm_compile_refuses_a_cuda_target_without_arch():
    """tvm.target.Target('cuda') without a GPU is TVM's stand-in sm_50: the nimble pipeline built for it silently."""
    model = zoo.get_model("inception", blocks=1)
    with pytest.raises(NimbleError, match="without a GPU arch"):
        tvm.compile(from_onnx(model), tvm.target.Target("cuda"), relax_pipeline="nimble")
    with pytest.raises(NimbleError, match="without a GPU arch"):
        tvm_nimble.build(model, tvm.target.Target("cuda"))
    # the arch given, in any form, is taken
    from tvm_nimble.compiler.target import resolve_target

    for given in (tvm.target.Target({"kind": "cuda", "arch": "sm_90"}), tvm.target.Target("nimble/h100"),
                  "cuda -arch=sm_90"):
        assert str(resolve_target(given).attrs["arch"]) == "sm_90"
