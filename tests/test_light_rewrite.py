"""relay_passes/light_rewrite.py: TVM's pattern rewriter over a function whose large constants are lifted out for the
rewrite gives what ``tvm.relax.dpl.rewrite_call`` gives on the function as it is (the reference), with every constant
back in place; the small constants a pattern reads (an epsilon) are not lifted."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import rewrite_call

from tvm_nimble.relay_passes.light_rewrite import LIFT_BYTES, rewrite_call_light
from tvm_nimble.relay_passes.rms_norm import FuseRmsNorm
from tvm_nimble.relay_passes.take_indices import _TAKE, _clipped

D = 128  # a [D, D] float32 weight is 64 KB: lifted


def _decoder_like():
    """Two layers of: an embedding take of a large table, a spelled-out RMSNorm (a D-wide weight, small, and its
    eps), a matmul with a [D, D] weight (large); the two layers' weights equal, as a random init leaves them."""
    rng = np.random.default_rng(0)
    table = relax.const(rng.standard_normal((512, D)).astype("float32"))
    norm_w = relax.const(np.ones(D, "float32"))
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((1, 4), "int64"))
    with bb.function("main", [ids]):
        with bb.dataflow():
            h = bb.emit(relax.op.take(table, ids, axis=0))
            for _ in range(2):
                sq = bb.emit(relax.op.multiply(h, h))
                m = bb.emit(relax.op.mean(sq, axis=[-1], keepdims=True))
                inv = bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(m, relax.const(1e-6, "float32")))))
                n = bb.emit(relax.op.multiply(norm_w, bb.emit(relax.op.multiply(h, inv))))
                w = relax.const(rng.standard_normal((D, D)).astype("float32"))
                h = bb.emit(relax.op.matmul(n, w))
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)
    return bb.get()["main"]


def test_the_rewrites_equal_tvms_with_the_constants_back_in_place():
    func = _decoder_like()
    rms = FuseRmsNorm()
    for pattern, rewriter in ((_TAKE, _clipped), (rms.pattern, rms.rewrite)):
        want = rewrite_call(pattern, rewriter, func)
        got = rewrite_call_light(pattern, rewriter, func)
        assert not got.same_as(func) and len(got.params) == len(func.params)
        tvm.ir.assert_structural_equal(got, want)
    fused = rewrite_call_light(rms.pattern, rms.rewrite, func)  # the eps (4 bytes) stayed a constant the rewrite read
    assert fused.script().count("R.nn.rms_norm") == 2 and "R.mean" not in fused.script()


def test_nothing_to_rewrite_gives_the_function_back():
    func = _decoder_like()
    rms = FuseRmsNorm()
    once = rewrite_call_light(rms.pattern, rms.rewrite, func)
    assert rewrite_call_light(rms.pattern, rms.rewrite, once).same_as(once)
    assert D * D * 4 >= LIFT_BYTES  # the matmul weights are the lifted kind
