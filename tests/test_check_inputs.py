"""check_inputs=True: indices of a Gather are validated against the table before a run (ONNX Runtime's
behaviour); by default they are not, as in stock TVM."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_nimble
from tvm_nimble.runtime.executor import InputError


def gather_model():
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
             helper.make_node("Relu", ["rows"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_gather_indices_are_checked_when_asked(tmp_path):
    model = gather_model()
    module = tvm_nimble.build(model, "llvm")
    assert module.plan.index_bounds == {"ids": 10}
    module.export(str(tmp_path / "m.nimble"))
    ex = tvm_nimble.NimbleExecutor(str(tmp_path / "m.nimble"), check_inputs=True)  # survives the artifact
    ids = np.array([0, 9, -1], dtype=np.int64)
    np.testing.assert_allclose(ex(ids)[0].numpy(), ReferenceEvaluator(model).run(None, {"ids": ids})[0])
    with pytest.raises(InputError, match=r"'ids' indexes a table of 10 rows but holds 10; valid indices are -10..9"):
        ex(np.array([0, 10, 1], dtype=np.int64))
    assert tvm_nimble.NimbleExecutor(module).check_inputs is False  # off by default, as in stock TVM
