"""float32 GEMMs on tensor cores: three TF32 products in one cuBLASLt call (provider tf32x3).

    matmul(x, [permute_dims](W)) [+ bias] [-> act] [+ residual]   (x: [..., M, K] float32; W constant)

A tensor core reads a float32 operand as TF32 (its top 11 significant bits), so one TF32 GEMM is ~1e-3 off float32.
Each operand is split into a high part of 11 significant bits and the rest, ``v = hi + lo``; the product keeps
``x_lo W_hi + x_hi W_lo + x_hi W_hi`` (the dropped ``x_lo W_lo`` is ~2^-22 of it): one cuBLASLt TF32 GEMM over three
times the depth,

    [x_lo | x_hi | x_hi] @ [W_hi ; W_lo ; W_hi]     ([M, 3K] @ [3K, N], float32 accumulation)

the two small products first along K, so that the accumulator holds them before the large one (CUTLASS's 3xTF32
orders its products so). The bias, activation and residual are in the epilogue as in cuBLASLt's float32 Linear.
W's parts are split once, at build, rounding to nearest (constants three times W's size); x's by element-wise
operators before the call (TVM fuses them into one kernel, or into x's producer), Veltkamp's split ``c = x * 8193;
hi = c - (c - x); lo = x - hi``: exact in float32 arithmetic, where ``c`` is rounded to float32. A product feeding a
subtraction is not: the CUDA code's ``mul.f32`` / ``sub.f32`` carry no rounding mode, so ptxas may contract
``x * 8193 - x`` into one fused multiply-add (exactly ``8192 x``), and the high part is then not TF32's (a decoder
on such a split measured one TF32 product's error, benchmarks/findings.md). So the product passes through
``max(c, -FLT_MAX)`` (an identity on every finite product, which neither TVM's simplifier nor ptxas removes) and
only the maximum feeds the subtractions. Values over ~4e34 in magnitude overflow the split (NaN or a wrong high part,
as a float32 overflow would).

The operands' rounding is float32's; the accumulation is the tensor cores', which is not IEEE float32's: with the
large product first such GEMMs measured further from float64 than SGEMM, by a factor depending on the shape
(benchmarks/findings.md, 'GEMMs at batch 1'); with the small ones first, not yet measured.

Why: in float32 with TF32 off (the bench's fp32: PyTorch's default) every engine runs the FP32 pipes' SGEMM, and
an H100's dense TF32 tensor cores do ~7x those pipes' multiply-adds a second: three TF32 products can beat one
SGEMM where a GEMM is bound by its arithmetic (a decoder's hundreds of tokens), less so where it is bound by reading
its weights (three times W's bytes). Only where TF32 is off (with TF32 on, cuBLASLt's one TF32 GEMM is what the user
asked for), from :data:`MIN_ROWS` rows. Used only when named (``providers=("+tf32x3",)``); ``kernels="best"`` then
measures it per operator against cuBLASLt's SGEMM, our fp32 GEMM and TVM, the split's kernel included.
"""
from __future__ import annotations

import numpy as np
from tvm import relax

from tvm_nimble.contract import vendor_abi

from ..precision import compute_dtype
from .chains import ACTS, GEMM_WORKSPACE_BYTES
from .cublaslt import linear_call, padded_operands, small_linear
from .registry import Provider, register

MATMUL = vendor_abi.CUBLAS_TF32X3_MATMUL
MATMUL_ADD = vendor_abi.CUBLAS_TF32X3_MATMUL_ADD
#: the fewest rows it takes: below them a GEMM reads its weights (three times W's bytes here) more than it computes
MIN_ROWS = 16
#: 2^13 + 1: Veltkamp's constant for a high part of 24 - 13 = 11 significant bits (TF32's)
SPLITTER = 8193.0
#: the 13 low mantissa bits of a float32 that TF32 does not keep (it keeps 10 of the 23 stored)
TF32_DROPPED = 0x1FFF


def split_array(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) of a finite float32 array: ``hi`` rounded to its top 11 significant bits (to nearest, a tie away
    from zero), exact in TF32; ``lo = w - hi`` exactly (at most 2^-11 of ``w``)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    bits = w.view(np.uint32)
    hi = ((bits + np.uint32(TF32_DROPPED + 1 >> 1)) & np.uint32(~TF32_DROPPED & 0xFFFFFFFF)).view(np.float32)
    return hi, w - hi


def split_weight(weight: np.ndarray, transpose_b: int) -> np.ndarray:
    """``[W_hi ; W_lo ; W_hi]`` stacked along K (axis 1 of a [N, K] weight, axis 0 of a [K, N] one)."""
    hi, lo = split_array(weight)
    return np.concatenate([hi, lo, hi], axis=1 if transpose_b else 0)


def split_rows(x: relax.Expr) -> relax.Expr:
    """``[x_lo | x_hi | x_hi]`` along the last axis, by Veltkamp's split, its product rounded before the
    subtractions (see the module docstring)."""
    c = relax.op.maximum(relax.op.multiply(x, relax.const(SPLITTER, "float32")),
                         relax.const(float(np.finfo(np.float32).min), "float32"))
    hi = relax.op.subtract(c, relax.op.subtract(c, x))
    lo = relax.op.subtract(x, hi)
    return relax.op.concat([lo, hi, hi], axis=-1)


def tf32x3_chain(ctx, chains, var, call):
    if ctx.allow_tf32 or compute_dtype(call) != "float32":
        return None  # no note: with TF32 on, or in 16 bits, the GEMMs are cuBLASLt's
    found = small_linear(ctx, chains, var, call, PROVIDER.dtypes, ACTS)
    if found is None:
        return None
    lin, rows = found
    if rows < MIN_ROWS:
        ctx.report.kept.append(("matmul", f"three TF32 products take {MIN_ROWS} rows or more"))
        return None
    weight, bias, padded = padded_operands(lin, rows)
    args = [split_rows(lin.x), relax.const(split_weight(weight, lin.transpose_b)),
            relax.const(bias.astype("float32"))]
    # attrs as cuBLASLt's Linear: [transpose_b, activation, allow_tf32 = 1 (these three products are TF32's)]
    return linear_call(ctx, lin, (MATMUL, MATMUL_ADD), args, relax.ShapeExpr([lin.transpose_b, lin.act, 1]),
                       GEMM_WORKSPACE_BYTES, padded)


PROVIDER = register(Provider(
    name="tf32x3", title="float32 GEMM as three TF32 products (cuBLASLt)",
    kernel_prefix=vendor_abi.family(MATMUL, MATMUL_ADD), matchers={"relax.matmul": tf32x3_chain},
    dtypes=("float32",), layouts=("row-major",), by_default=False))
