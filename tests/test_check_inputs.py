"""Index inputs (the ids of a Gather: an embedding lookup) are validated against the table when they are
set, by default (ONNX Runtime's behaviour): an id out of range is one InputError, where the kernel would
read out of bounds (it segfaulted the process). ``check_inputs=False`` opts out, as in stock TVM."""
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


@pytest.fixture(scope="module")
def gather():
    model = gather_model()
    return model, tvm_nimble.build(model, "llvm")


def _reference(model, ids):
    return ReferenceEvaluator(model).run(None, {"ids": ids})[0]


def test_an_out_of_range_id_is_one_clear_error_by_default(gather):
    model, module = gather
    assert module.plan.index_bounds == {"ids": 10}
    ex = tvm_nimble.NimbleExecutor(module)  # default settings
    assert ex.check_inputs is True
    message = r"'ids' indexes a table of 10 rows but holds 10; valid indices are -10..9"
    with pytest.raises(InputError, match=message) as err:
        ex(np.array([0, 10, 1], dtype=np.int64))
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match=r"holds -11;"):  # below the negative range too, through set_input
        ex.set_input("ids", np.array([-11, 0, 0], dtype=np.int64))
    # refused before anything ran: the executor still computes what the ONNX reference does
    ids = np.array([0, 9, -1], dtype=np.int64)  # -1 is the last row, as in ONNX
    np.testing.assert_allclose(ex(ids)[0].numpy(), _reference(model, ids))


def test_the_check_survives_the_artifact_and_the_pool(gather, tmp_path):
    model, module = gather
    module.export(str(tmp_path / "m.nimble"))
    ex = tvm_nimble.NimbleExecutor(str(tmp_path / "m.nimble"))
    with pytest.raises(InputError, match="holds 10"):
        ex(np.array([10, 0, 0], dtype=np.int64))
    with tvm_nimble.NimblePool(module, replicas=1) as pool:
        with pytest.raises(InputError, match="holds 12"):
            pool(np.array([0, 12, 0], dtype=np.int64))
        ids = np.array([3, 4, 5], dtype=np.int64)
        np.testing.assert_allclose(pool(ids)[0].numpy(), _reference(model, ids))


def test_check_inputs_false_opts_out(gather):
    model, module = gather
    ex = tvm_nimble.NimbleExecutor(module, check_inputs=False)
    assert ex.check_inputs is False
    ids = np.array([2, 0, -3], dtype=np.int64)  # (an out-of-range id is not run here: it reads out of bounds)
    np.testing.assert_allclose(ex(ids)[0].numpy(), _reference(model, ids))
    with tvm_nimble.NimblePool(module, replicas=1, check_inputs=False) as pool:
        assert all(not e.check_inputs for e in pool._executors)


# ---- check_finite: a NaN or an infinity refused, naming the input ------------------------------------------
@pytest.fixture(scope="module")
def relu_net():
    """The zoo inception (convolutions and ReLUs) built at batch 1 and with buckets [1, 2]."""
    from tvm_nimble import zoo

    model = zoo.inception(blocks=1, hw=8)
    return model, tvm_nimble.build(model, "llvm"), tvm_nimble.build(model, "llvm", batch_sizes=[1, 2])


def test_check_finite_refuses_a_nan_or_an_infinity_in_one_line(relu_net):
    import tvm

    model, module, bucketed = relu_net
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype("float32")
    nan = x.copy()
    nan[0, 1, 2, 3] = np.nan
    inf = x.copy()
    inf[0, 0, 0, 5] = -np.inf
    for m in (module, bucketed):
        ex = tvm_nimble.NimbleExecutor(m, check_finite=True)
        assert ex.check_finite is True
        for bad, what in ((nan, r"holds nan at \[0, 1, 2, 3\]"), (inf, r"holds -inf at \[0, 0, 0, 5\]")):
            for value in (bad, tvm.runtime.tensor(bad)):
                with pytest.raises(InputError, match=rf"input 'input' {what}.*check_finite=False") as err:
                    ex(value)
                assert "\n" not in str(err.value)
                with pytest.raises(InputError, match=what):
                    ex.set_input("input", value)
        np.testing.assert_allclose(ex(x)[0].numpy(), ReferenceEvaluator(model).run(None, {"input": x})[0],
                                   rtol=1e-4, atol=1e-4)  # finite inputs run as before
    # off by default: the NaN input runs (what comes out is the kernels' business)
    assert tvm_nimble.NimbleExecutor(module).check_finite is False
    tvm_nimble.NimbleExecutor(module)(nan)
    with tvm_nimble.NimblePool(module, replicas=1, check_finite=True) as pool:
        with pytest.raises(InputError, match="holds nan"):
            pool(nan)


def test_the_batcher_refuses_a_non_finite_request_alone(relu_net):
    from tvm_nimble.runtime.batcher import Batcher

    model, _, bucketed = relu_net
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype("float32")
    nan = x[:1].copy()
    nan[0, 0, 0, 0] = np.nan
    with Batcher(bucketed, max_delay_ms=0, check_finite=True) as batcher:
        with pytest.raises(InputError, match="input 'input' holds nan at"):
            batcher(nan)
        want = np.concatenate([ReferenceEvaluator(model).run(None, {"input": x[i:i + 1]})[0] for i in range(2)])
        np.testing.assert_allclose(batcher(x)[0].numpy(), want, rtol=1e-4, atol=1e-4)
