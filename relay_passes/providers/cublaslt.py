"""cuBLASLt: GEMMs with constant weights, bias and ReLU fused.

    matmul(x, permute_dims(W)) [+ bias] [-> relu]      (x: [..., M, K]; W constant [N, K] or [K, N])

A Linear on [B, S, K] is one GEMM of M = B * S rows: the extension folds the leading dimensions.
"""
from __future__ import annotations

import numpy as np
from tvm import relax

from ..precision import DTYPES, compute_dtype
from .chains import ACT_NONE, ACT_RELU, activation, dtype_of, ints, operator_of, known_shape
from .registry import Provider, register

MATMUL = "nimble.cublas.matmul"


def matmul_chain(ctx, chains, var, call):
    x, w = call.args
    xs, out_shape, dtype = known_shape(x), known_shape(call), dtype_of(call)
    if xs is None or len(xs) < 2 or out_shape is None or compute_dtype(call) not in PROVIDER.dtypes:
        ctx.report.kept.append(("matmul", "only static fp32/fp16 matmuls of rank >= 2"))
        return None
    transpose_b = 0
    weight = chains.const(w)
    if weight is None and isinstance(w, relax.Var) and operator_of(chains.value.get(w)) == "relax.permute_dims":
        inner = chains.value[w]
        axes = inner.attrs.axes
        if (axes is None or ints(axes) == [1, 0]) and chains.const(inner.args[0]) is not None:
            weight, transpose_b = chains.const(inner.args[0]), 1
    if weight is None or weight.ndim != 2:
        ctx.report.kept.append(("matmul", "weights are not a constant 2-D matrix"))
        return None
    n = out_shape[-1]
    removed, last, bias, act = [], var, None, ACT_NONE
    nxt, val = chains.follow(last)
    b = chains.bias_of(val, last, out_shape, axis=-1) if val is not None else None
    if b is not None:
        bias, removed, last = b, [last], nxt
        nxt, val = chains.follow(last)
    if val is not None and activation(val) == ACT_RELU:
        act, removed, last = ACT_RELU, removed + [last], nxt
    if bias is None:
        bias = np.zeros(n, dtype=dtype)
    args = [x, relax.const(weight.astype(dtype)), relax.const(bias.astype(dtype)),
            relax.ShapeExpr([transpose_b, act, ctx.tf32])]
    return removed, last, (ctx.call(MATMUL, args, out_shape, dtype), None)


PROVIDER = register(Provider(
    name="cublaslt", title="cuBLASLt", kernel_prefix="nimble.cublas.",
    matchers={"relax.matmul": matmul_chain}, dtypes=DTYPES, layouts=("row-major",)))
