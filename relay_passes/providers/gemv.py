"""Our GEMV (codegen/vendor/gemv.cu): a 16-bit Linear of at most four rows, its weights read once at the memory's
speed -- a decode step's projections, MLP and LM head at batch 1.

    matmul(x, [permute_dims](W)) [+ bias] [-> relu|gelu] [+ residual]   (x: [..., M, K], M <= 4; W constant)

the chains of cuBLASLt's Linear (:func:`.cublaslt.linear_of`: the residual may be a float32 stream the call then
writes), with bias, activation and residual in the kernel's epilogue. The weights are stored [N, K] (transposed
here, once, when the model has them [K, N]), so that each output column is one contiguous row. fp16 and bf16 only
(at M = 1 a 16-bit GEMM is its weight read); K a multiple of 8 (16-byte loads). Registered after cuBLASLt, so
``kernels="vendor"`` keeps cuBLASLt; ``kernels="best"`` measures this kernel per operator against cuBLASLt and TVM.
"""
from __future__ import annotations

import numpy as np
from tvm import relax

from tvm_nimble.contract import vendor_abi

from ..precision import REDUCED_DTYPES, compute_dtype
from .cublaslt import linear_call, small_linear
from .registry import Provider, register

MATMUL = vendor_abi.GEMV_MATMUL
MATMUL_ADD = vendor_abi.GEMV_MATMUL_ADD
#: the most rows (the input's leading dimensions folded) it takes: codegen/vendor/gemv.cu's kGemvMaxRows
MAX_ROWS = 4


def gemv_chain(ctx, chains, var, call):
    if compute_dtype(call) not in PROVIDER.dtypes:
        return None  # no note: fp32 GEMMs are cuBLASLt's or our SIMT GEMM's, whose reports say why where they decline
    found = small_linear(ctx, chains, var, call, PROVIDER.dtypes)
    if found is None:
        return None  # two computed operands: cuBLASLt's batched GEMM, or TVM
    lin, rows = found
    if rows > MAX_ROWS:
        ctx.report.kept.append(("matmul", f"our GEMV takes at most {MAX_ROWS} rows"))
        return None
    weight = lin.weight if lin.transpose_b else lin.weight.T  # [N, K]
    if weight.shape[1] % 8:
        ctx.report.kept.append(("matmul", "our GEMV needs K to be a multiple of 8"))
        return None
    args = [lin.x, relax.const(np.ascontiguousarray(weight).astype(lin.dtype)),
            relax.const(lin.bias.astype(lin.out_dtype))]
    return linear_call(ctx, lin, (MATMUL, MATMUL_ADD), args, relax.ShapeExpr([lin.act]), 1)


PROVIDER = register(Provider(
    name="gemv", title="GEMV (ours: a decode step's few rows)", kernel_prefix=vendor_abi.GEMV.prefix,
    matchers={"relax.matmul": gemv_chain}, dtypes=REDUCED_DTYPES, layouts=("row-major",)))
