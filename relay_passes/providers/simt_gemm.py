"""Our fp32 GEMM (codegen/vendor/gemm_simt.cu): a Linear of constant weights, exact fp32, for small M.

    matmul(x, [permute_dims](W)) [+ bias] [-> relu|gelu (erf)] [+ residual]   (x: [..., M, K]; W constant)

the same chains as cuBLASLt's Linear (:func:`.cublaslt.linear_of`), with bias, activation and residual in
the kernel's epilogue. Small tiles, and K split across a thread-block cluster, fill the SMs that
cuBLAS's fp32 kernels leave idle at batch 1 (a ViT's 197 tokens). The weights are stored [K, N] (transposed
here, once, when the model has them [N, K]), so the kernel reads one layout. fp32 only, and only when
TF32 is off (with TF32 allowed, cuBLASLt's tensor-core kernels are the faster exact-enough choice); K and N
multiples of 4 (float4 rows). The split-K candidates need thread-block clusters (sm_90 and later); on older
GPUs only the unsplit ones run. Registered after cuBLASLt, so ``kernels="vendor"`` gives a Linear to
cuBLASLt; ``kernels="best"`` measures this kernel per operator against cuBLASLt and TVM.
"""
from __future__ import annotations

import numpy as np
from tvm import relax

from tvm_nimble.contract import vendor_abi

from ..precision import compute_dtype
from .chains import ACT_GELU_TANH, ACTS
from .cublaslt import linear_call, small_linear
from .registry import Provider, register

MATMUL = vendor_abi.GEMM_MATMUL
MATMUL_ADD = vendor_abi.GEMM_MATMUL_ADD
#: the fewest rows (M: the input's leading dimensions folded) it takes: its tiles are 32 rows and more, so a
#: classifier's single row at batch 1 is cuBLASLt's (ViT-B's head on an H100: 9.8 us ours, 7.8 TVM's); and a
#: convolutional net's only Linear then costs the kernel choice no probe build
MIN_ROWS = 16
#: the activations its epilogue computes: not GELU's tanh form (the kernel's kSimtMaxActivation: compiling that
#: branch in slowed every tile's main loop), whose Linear ends before the GELU here
ACTIVATIONS = ACTS - {ACT_GELU_TANH}


def simt_chain(ctx, chains, var, call):
    if ctx.allow_tf32 or compute_dtype(call) != "float32":
        return None  # no note: TF32 and half-precision GEMMs are cuBLASLt's, whose report says why where it declines
    found = small_linear(ctx, chains, var, call, PROVIDER.dtypes, ACTIVATIONS)
    if found is None:
        return None  # two computed operands: cuBLASLt's batched GEMM, or TVM
    lin, rows = found
    if rows < MIN_ROWS:
        ctx.report.kept.append(("matmul", f"our fp32 GEMM takes {MIN_ROWS} rows or more"))
        return None
    weight = lin.weight.T if lin.transpose_b else lin.weight  # [K, N]
    if weight.shape[0] % 4 or weight.shape[1] % 4:
        ctx.report.kept.append(("matmul", "our fp32 GEMM needs K and N to be multiples of 4"))
        return None
    args = [lin.x, relax.const(np.ascontiguousarray(weight, dtype="float32")),
            relax.const(lin.bias.astype("float32"))]
    return linear_call(ctx, lin, (MATMUL, MATMUL_ADD), args, relax.ShapeExpr([lin.act]), 1)


PROVIDER = register(Provider(
    name="simt_gemm", title="fp32 GEMM (ours: small tiles, cluster split-K)", kernel_prefix=vendor_abi.GEMM.prefix,
    matchers={"relax.matmul": simt_chain}, dtypes=("float32",), layouts=("row-major",)))
