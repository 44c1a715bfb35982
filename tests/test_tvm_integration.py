"""`import tvm_nimble` makes Nimble a TVM build option: pipeline, tags, export/load, executor."""
import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_nimble
from tvm_nimble import NimbleError, NimbleExecutor
from tvm_nimble.compiler.frontend import from_onnx


def test_nimble_pipeline_matches_stock_pipeline(zoo_built, tmp_path):
    b = zoo_built
    mod = from_onnx(b.model)
    target = tvm.target.Target({"kind": "llvm"})
    stock = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
    ex = tvm.compile(mod, target, relax_pipeline="nimble")
    nimble_vm = relax.VirtualMachine(ex, tvm.cpu())
    x = [tvm.runtime.tensor(v) for v in b.inputs.values()]
    np.testing.assert_allclose(nimble_vm["main"](*x).numpy(), stock["main"](*x).numpy(), rtol=1e-5, atol=1e-5)
    # the same executable runs through NimbleExecutor, also after export_library / load_module
    out = NimbleExecutor(ex)(*b.inputs.values())[0].numpy()
    np.testing.assert_allclose(out, b.reference[0], rtol=1e-4, atol=1e-4)
    path = str(tmp_path / "model.so")
    ex.export_library(path)
    loaded = tvm.runtime.load_module(path)
    out2 = NimbleExecutor(loaded)(*b.inputs.values())[0].numpy()
    np.testing.assert_allclose(out2, out, rtol=0, atol=0)


def test_stock_executable_is_rejected_clearly(inception_built):
    ex = tvm.compile(from_onnx(inception_built.model), tvm.target.Target({"kind": "llvm"}))
    with pytest.raises(NimbleError, match="relax_pipeline='nimble'"):
        NimbleExecutor(ex)


def test_target_tags_are_registered():
    for tag in ("nimble/h100", "nimble/h200"):
        t = tvm.target.Target(tag)
        assert t.kind.name == "cuda" and str(t.attrs["arch"]) == "sm_90"


def test_build_api_options(nasnet_built):
    b = nasnet_built
    single = tvm_nimble.build(b.model, "llvm", max_streams=1)
    assert single.plan.num_streams == 1 and single.plan.num_events == 0
    capped = tvm_nimble.build(b.model, {"kind": "llvm"}, max_streams=3)
    assert capped.plan.num_streams <= 3
    for module in (single, capped):
        out = NimbleExecutor(module)(*b.inputs.values())[0].numpy()
        np.testing.assert_allclose(out, b.reference[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(NimbleError, match="max_streams"):
        tvm_nimble.build(b.model, "llvm", max_streams=0)
    with pytest.raises(NimbleError, match="arch"):
        tvm_nimble.build(b.model, {"kind": "cuda"})
    with pytest.raises(NimbleError, match="not supported"):
        tvm_nimble.build(b.model, {"kind": "metal"})


def test_params_bind_weights_given_as_inputs(tmp_path):
    """A Relax module whose weights are function parameters: params= binds them (TVM style)."""
    from tvm.script import relax as R  # noqa: F401

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            z = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(z)
    mod = bb.get()
    wv = np.random.default_rng(0).standard_normal((4, 3)).astype("float32")
    xv = np.random.default_rng(1).standard_normal((2, 4)).astype("float32")
    module = tvm_nimble.build(mod, "llvm", params={"w": wv})
    out = NimbleExecutor(module)(xv)[0].numpy()
    np.testing.assert_allclose(out, np.maximum(xv @ wv, 0), rtol=1e-5, atol=1e-5)
