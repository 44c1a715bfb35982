"""The benchmark's output checks cannot be vacuous: without PyTorch the reference is the ONNX reference
evaluator, a model whose output does not depend on its input is refused, and a normal one is timed with
its relative error recorded."""
import csv

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_nimble import zoo
from tvm_nimble.bench.harness import VacuousCheckError, check_input_dependence, rel_l2, run_benchmark
from tvm_nimble.errors import NimbleError


def constant_output_model():
    """y = x * 0 + c: runs fine, and its output is the same for every input."""
    zero = numpy_helper.from_array(np.zeros((1, 8), np.float32), "zero")
    c = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(1, 8), "c")
    nodes = [helper.make_node("Mul", ["x", "zero"], ["z"]), helper.make_node("Add", ["z", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [zero, c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_input_dependence_check():
    a = [np.ones((2, 3))]
    with pytest.raises(VacuousCheckError, match="barely depends on the input"):
        check_input_dependence(a, [a[0] + 1e-9], 1e-3, "m")
    assert check_input_dependence(a, [a[0] * 2], 1e-3, "m") == pytest.approx(rel_l2([a[0] * 2], a))


def test_a_constant_output_model_is_refused_and_a_normal_one_timed(tmp_path):
    models = {"constant": lambda batch: constant_output_model(),
              "incept": lambda batch: zoo.get_model("inception", blocks=2)}
    with pytest.raises(NimbleError, match=r"1 model\(s\) not timed.*constant batch 1 float32: constant: the reference "
                                          r"output barely depends on the input"):
        run_benchmark(models, "llvm", rounds=1, iters=2, out_dir=str(tmp_path))
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert {r["model"] for r in rows} == {"incept"}
    assert all(0 <= float(r["rel_err"]) < 1e-5 for r in rows)
    assert "not timed: constant" in (tmp_path / "RESULTS.md").read_text()
    import json

    machine = json.load(open(tmp_path / "machines.json"))[-1]  # what the run ran on, for honest comparisons
    assert machine["device"] == rows[0]["device"] and machine["tvm"] and machine["numpy"] == np.__version__


def test_skipped_systems_are_neither_built_nor_timed_and_the_rest_is_still_checked(tmp_path, capsys):
    from tvm_nimble.bench.harness import check_skip

    models = {"incept": lambda batch: zoo.get_model("inception", blocks=2)}
    rows, _ = run_benchmark(models, "llvm", rounds=1, iters=2, out_dir=str(tmp_path), skip=check_skip(["tvm-vm"]))
    assert [r["system"] for r in rows] == ["nimble-aot-cpu"]
    built = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[bench] build seconds: ")]
    assert len(built) == 1 and "Nimble's build" in built[0] and "stock TVM" not in built[0]
    assert 0 <= float(rows[0]["rel_err"]) < 1e-5  # still checked against the ONNX reference evaluator
    with pytest.raises(ValueError, match="leaves no TVM or Nimble system to time on llvm"):
        run_benchmark(models, "llvm", rounds=1, iters=2, out_dir=str(tmp_path / "none"),
                      skip=check_skip(["tvm-vm", "nimble-aot-cpu"]))


@pytest.mark.parametrize("skip, message", [
    ("torch-eager,bogus", "--skip bogus: no such system; the systems are tvm-vm, "),
    ("nimble-auto,nimble-aot-cpu,nimble-multi-stream-graph,nimble-multi-stream-nograph,nimble-single-stream-graph",
     "--skip names every Nimble system: keep at least one"),
])
def test_bad_skip_lists_are_one_line_before_any_build(skip, message, tmp_path, capsys):
    from tvm_nimble.cli.main import main

    assert main(["bench", "--models", "incept6", "--small", "--target", "llvm", "--skip", skip,
                 "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "results.csv").exists()


def test_a_peer_with_a_wrong_output_is_left_out_and_widens_no_tolerance():
    """A peer whose output is wrong (NaN, or far off: what a broken CUDA-graph capture gives) is reported and
    left out; PyTorch's error then no longer loosens the check of our systems, so a Nimble output as wrong as
    that fails instead of passing under a tolerance the broken peer set."""
    from onnx.reference import ReferenceEvaluator

    from tvm_nimble import NimbleExecutor, build
    from tvm_nimble.bench.harness import reference_errors
    from tvm_nimble.bench.system import System

    model = zoo.get_model("inception", blocks=2)
    inputs = list(zoo.random_inputs(model, seed=0).values())
    ref = [np.asarray(o) for o in ReferenceEvaluator(model).run(None, {model.graph.input[0].name: inputs[0]})]
    ex = NimbleExecutor(build(model, "llvm", timing_cache="off"))

    def system(label, outputs):
        return System(label, run=None, sync=None, outputs=lambda: outputs)

    nimble = System("nimble-aot-cpu", run=None, sync=None, outputs=lambda: [o.numpy() for o in ex(*inputs)])
    nan_torch = system("torch-cudagraph", [np.full_like(ref[0], np.nan)])
    negated_ort = system("ort-cuda-graph", [-ref[0]])  # relative L2 2
    errors, wrong = reference_errors("incept", model, [nimble, nan_torch, negated_ort], inputs, "fp16")
    assert set(wrong) == {"torch-cudagraph", "ort-cuda-graph"} and "output is wrong" in wrong["ort-cuda-graph"]
    assert errors["nimble-aot-cpu"] < 1e-5 and errors["ort-cuda-graph"] == pytest.approx(2)
    scaled_torch = system("torch-cudagraph", [ref[0] * 4])  # relative L2 3: no sane fp16 run
    off_nimble = system("nimble-aot-cpu", [ref[0] * 1.5])  # relative L2 0.5, 10x the fp16 tolerance
    with pytest.raises(AssertionError, match="outputs disagree"):  # the old check let 2x the torch error (6) pass
        reference_errors("incept", model, [off_nimble, scaled_torch], inputs, "fp16")
    sane_torch = system("torch-cudagraph", [ref[0] * 1.3])  # relative L2 0.3: a sane peer still sets the bound
    assert reference_errors("incept", model, [off_nimble, sane_torch], inputs, "fp16")[1] == {}
