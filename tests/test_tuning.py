"""A tiny MetaSchedule run on CPU: it writes a database, a second run resumes it, the build applies it."""
import json
import os

import numpy as np
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper

from tvm_nimble import NimbleExecutor, build
from tvm_nimble.tuning import tune


def one_kernel_model():
    """Conv + Relu: a single fused kernel, so the tiny tuning run has exactly one task."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.2).astype("float32"), "w")
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["output"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 8, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_tiny_tuning_resumes_and_is_applied(tmp_path):
    model = one_kernel_model()
    db = str(tmp_path / "db")
    kw = dict(trials_per_round=1, strategy="replay-trace", cost_model="random", progress=False)
    first = tune(model, "llvm", db, trials_per_task=1, **kw)
    assert first.trials_this_run == 1 and first.tuned == len(first.tasks) == 1
    records = open(os.path.join(db, "database_tuning_record.json")).read().splitlines()
    assert len(records) == 1
    # a second run with a larger budget continues from the database: only the missing trial runs
    second = tune(model, "llvm", db, trials_per_task=2, **kw)
    assert second.trials_this_run == 1 and second.tasks[0]["trials"] == 2
    assert second.tasks[0]["best_us"] is not None, "no trial was measured successfully"
    assert len(open(os.path.join(db, "database_tuning_record.json")).read().splitlines()) == 2
    # a run whose budget is already met does no work
    assert tune(model, "llvm", db, trials_per_task=2, **kw).trials_this_run == 0
    summary = json.load(open(os.path.join(db, "tuning_summary.json")))
    assert summary["tasks"][0]["trials"] == 2

    default = build(model, "llvm")
    tuned = build(model, "llvm", tuning_db=db)
    kernel = default.plan.launches[0].kernel
    assert not tvm_ffi.structural_equal(default.annotated_mod[kernel], tuned.annotated_mod[kernel])
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype("float32")
    np.testing.assert_allclose(NimbleExecutor(tuned)(x)[0].numpy(), NimbleExecutor(default)(x)[0].numpy(),
                               rtol=1e-4, atol=1e-4)
