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
