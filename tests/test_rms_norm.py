"""relay_passes/rms_norm.py: a spelled-out RMSNorm becomes one ``R.nn.rms_norm``, computing what stock TVM computes
for the spelled-out form; anything that is not an RMSNorm over the last axis stays as it was."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_nimble.relay_passes.rms_norm import fuse_rms_norm

D = 48


def _module(square="multiply", inverse="reciprocal", weight_first=True, axis=-1, weight_dtype="float32"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3, D), "float32"))
    rng = np.random.default_rng(0)
    w = relax.const(rng.standard_normal(D).astype(weight_dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            sq = bb.emit(relax.op.multiply(x, x) if square == "multiply"
                         else relax.op.power(x, relax.const(2.0, "float32")))
            m = bb.emit(relax.op.mean(sq, axis=[axis], keepdims=True))
            a = bb.emit(relax.op.add(m, relax.const(1e-5, "float32")))
            if inverse == "reciprocal":
                inv = bb.emit(relax.op.divide(relax.const(1.0, "float32"), bb.emit(relax.op.sqrt(a))))
            else:
                inv = bb.emit(relax.op.rsqrt(a))
            n = bb.emit(relax.op.astype(bb.emit(relax.op.multiply(x, inv)), "float32"))
            if weight_dtype != "float32":
                n = bb.emit(relax.op.astype(n, weight_dtype))
            out = bb.emit(relax.op.multiply(w, n) if weight_first else relax.op.multiply(n, w))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _ops(mod) -> list[str]:
    ops = []
    relax.analysis.post_order_visit(mod["main"], lambda e: ops.append(str(e.op.name)) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return ops


@pytest.mark.parametrize("square,inverse,weight_first", [("multiply", "reciprocal", True),
                                                         ("power", "rsqrt", False),
                                                         ("multiply", "rsqrt", True)])
def test_a_spelled_out_rms_norm_is_one_operator_computing_the_same(square, inverse, weight_first):
    mod = _module(square, inverse, weight_first)
    fused = fuse_rms_norm(mod)
    ops = _ops(fused)
    assert ops.count("relax.nn.rms_norm") == 1 and "relax.mean" not in ops, ops
    x = np.random.default_rng(1).standard_normal((2, 3, D)).astype("float32") * 3
    np.testing.assert_allclose(_run(fused, x), _run(mod, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(axis=1), dict(weight_dtype="float16")])
def test_what_is_not_an_rms_norm_over_the_last_axis_stays(kwargs):
    mod = _module(**kwargs)
    assert "relax.nn.rms_norm" not in _ops(fuse_rms_norm(mod)) and "relax.mean" in _ops(fuse_rms_norm(mod))


def test_a_llama_decoders_norms_are_one_kernel_each_and_its_outputs_unchanged():
    """The tiny Llama (2 layers: two norms a layer and the final one) built for llvm: five rms_norm kernels, no mean
    of a square left, and its logits equal the ONNX reference evaluator's."""
    from onnx.reference import ReferenceEvaluator

    from decoder_models import tiny_llama_onnx
    from tvm_nimble.compiler.build import build
    from tvm_nimble.runtime.loading import NimbleExecutor

    model = tiny_llama_onnx(dynamic=False)
    result = build(model, "llvm", kernels="tvm")
    kernels = [l.kernel for l in result.plan.launches]
    assert sum("rms_norm" in k for k in kernels) == 5, kernels
    assert not any("mean" in k for k in kernels), kernels
    feeds = {}
    rng = np.random.default_rng(0)
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = (rng.integers(0, 256, shape) if "ids" in inp.name else np.ones(shape)).astype(np.int64)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = NimbleExecutor(result)(*[feeds[i.name] for i in model.graph.input])[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
