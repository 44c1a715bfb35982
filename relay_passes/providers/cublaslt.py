"""cuBLASLt: GEMMs with constant weights (bias and ReLU fused), and batched GEMMs of two tensors.

    matmul(x, permute_dims(W)) [+ bias] [-> relu|gelu] (x: [..., M, K]; W constant [N, K] or [K, N];
                                                        gelu: the exact erf form in our bias kernel, the tanh
                                                        approximation in cuBLASLt's GELU epilogue)
    matmul(x, permute_dims(W)) [+ bias] + residual     (residual: a tensor of the output's shape; in a 16-bit
                                                        build also a float32 one added to the result cast up:
                                                        the call then writes float32, as the residual stream is)

Either form may reach what follows through a reshape of the rows (the last dimension kept): the call writes the
reshaped shape, as GPT-2's Conv1D exports reshape [B * S, N] back to [B, S, N] before the activation or the add.
    matmul(a, [permute_dims](b))                       (a: [..., M, K]; b: [..., K, N] or, transposed
                                                        by the permute, [..., N, K]; same batch dims)
    conv2d(x, W) [+ bias] [+ residual] [-> relu|relu6] (1x1, stride 1, unpadded, channels-last: x [N, H, W, C]
                                                        is a GEMM of N * H * W rows with W [O, C] transposed)

A Linear on [B, S, K] is one GEMM of M = B * S rows: the extension folds the leading dimensions.
The batched form is attention's Q·Kᵀ and ·V: one strided-batched call, a transpose of the last two
axes folded into it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from tvm_nimble.contract import vendor_abi

from ..precision import ALIASES, DTYPES, REDUCED_DTYPES, compute_dtype
from .chains import (ACT_NONE, ACT_RELU, ACTS, GEMM_WORKSPACE_BYTES, Columns, Const, activation, dtype_of, epilogue,
                     gelu_of, ints, known_shape, operator_of)
from .registry import Provider, register

MATMUL = vendor_abi.CUBLAS_MATMUL
MATMUL_ADD = vendor_abi.CUBLAS_MATMUL_ADD
BATCHED_MATMUL = vendor_abi.CUBLAS_BATCHED_MATMUL


@dataclass
class Linear:
    """``act(x @ W (+ bias)) (+ residual)`` as a matmul of constant weights and what follows it in the graph."""

    x: relax.Expr
    weight: np.ndarray  # as the model stores it: [N, K] when transpose_b, else [K, N]
    transpose_b: int
    bias: np.ndarray  # [N] (zeros when the model has none)
    act: int
    residual: relax.Var | None
    removed: list  # the bindings the call replaces, besides the matmul's
    last: relax.Var  # the binding whose value the call computes
    out_shape: tuple  # the rows may be reshaped (any leading dimensions; the last is N)
    dtype: str  # the compute dtype (x's, W's)
    out_dtype: str  # the call's result (and bias and residual): ``dtype``, or float32 (a residual stream in fp32)


_WEIGHT, _TRANSPOSED = Const(), Const()
_PERMUTE = is_op("relax.permute_dims")(_TRANSPOSED.pattern)
#: a Linear's matmul: x times a constant matrix W [K, N], or the transpose of one [N, K] (axes checked beside it)
_LINEAR = is_op("relax.matmul")(wildcard(), _WEIGHT.pattern | _PERMUTE)


@dataclass(frozen=True)
class _Epilogue:
    """What follows a GEMM (+ bias) that the call folds in: the vars it replaces, the var it computes, and how."""

    removed: list
    last: relax.Var
    act: int = ACT_NONE
    residual: relax.Var | None = None
    out_dtype: str | None = None  # None: the GEMM's dtype


def _epilogue(chains, var, shape, dtype, acts: frozenset = ACTS) -> _Epilogue | None:
    """A GELU (exact or tanh: :func:`gelu_of`) or ReLU of ``var``, or a tensor added to it (cuBLASLt adds any var
    of the output's shape as C): where the residual stream is float32 and the GEMM computes in 16 bits, through
    the cast up (the call writes float32, rounding the sum once). A 16-bit GEMM whose cast up is the block's output
    (a language model's logits, float32 as the model declares them; a decode step's, which its argmax reads too)
    writes float32 itself: no cast kernel reading the 16-bit logits back, one rounding; not where several float32
    rows would be unaligned (GPT-2's 50,257 columns: the padded GEMM's slice, fused with the cast, moves fewer
    bytes; one row, a decode step's, has no second row to align), nor where the cast only feeds more element-wise
    work (TVM fuses it into that kernel's reads). None when nothing follows that the call takes (``acts``: the
    activation codes the kernel computes)."""
    gelu = gelu_of(chains, var)
    if gelu is not None:
        folded, last, act = gelu
        return _Epilogue(folded, last, act) if act in acts else None
    nxt, val = chains.follow(var)
    if val is None:
        return None
    if activation(val) == ACT_RELU:
        return _Epilogue([var], nxt, ACT_RELU)
    residual = chains.residual_of(val, var, shape, dtype, computed=False)
    if residual is not None:
        return _Epilogue([var], nxt, residual=residual)
    if dtype in REDUCED_DTYPES and operator_of(val) == "relax.astype" and str(val.attrs.dtype) == "float32":
        up, add = chains.follow(nxt)
        residual = chains.residual_of(add, nxt, shape, "float32", computed=False) if add is not None else None
        if residual is not None:
            return _Epilogue([var, nxt], up, residual=residual, out_dtype="float32")
        if chains.output(nxt) and (shape[-1] % 4 == 0 or int(np.prod(shape[:-1])) == 1):
            return _Epilogue([var], nxt, out_dtype="float32")
    return None


def _rows_reshaped(chains, var, n: int):
    """``(reshaped var, its shape)`` when ``var``'s one use reshapes it keeping the last dimension ``n`` (GPT-2's
    Conv1D exports flatten x to [B * S, K] around the GEMM and reshape the result back to [B, S, N]); else None."""
    nxt, val = chains.follow(var)
    shape = known_shape(nxt) if operator_of(val) == "relax.reshape" else None
    return (nxt, shape) if shape and shape[-1] == n else None


def linear_of(chains, var, call, acts: frozenset = ACTS) -> Linear | None:
    """The Linear that ``call`` (a matmul) starts, None when its weights are not a constant matrix (or the
    transpose of one). What follows the GEMM and its bias may be read through a reshape of the rows, which the
    call then writes; an activation only if its code is in ``acts`` (else the Linear ends before it)."""
    m = chains.match(_LINEAR, call)
    if m is None:
        return None
    if _PERMUTE in m:
        axes = m[_PERMUTE].attrs.axes
        weight, transpose_b = (_TRANSPOSED.array(m), 1) if axes is None or ints(axes) == [1, 0] else (None, 0)
    else:
        weight, transpose_b = _WEIGHT.array(m), 0
    if weight is None or weight.ndim != 2:
        return None
    out_shape, dtype = known_shape(call), dtype_of(call)
    n = out_shape[-1]
    removed, last, bias = [], var, None
    nxt, val = chains.follow(last)
    b = chains.bias_of(val, last, out_shape, axis=-1) if val is not None else None
    if b is not None:
        bias, removed, last = b, [last], nxt
    after = _epilogue(chains, last, out_shape, dtype, acts)
    reshaped = _rows_reshaped(chains, last, n) if after is None else None
    if reshaped is not None:
        after = _epilogue(chains, *reshaped, dtype, acts)
        if after is not None:
            removed, out_shape = removed + [last], reshaped[1]
    after = after or _Epilogue([], last)  # nothing follows that the call takes
    return Linear(call.args[0], weight, transpose_b, np.zeros(n, dtype=dtype) if bias is None else bias, after.act,
                  after.residual, removed + after.removed, after.last, tuple(out_shape), dtype,
                  after.out_dtype or dtype)


def static_matmul(ctx, call, dtypes) -> bool:
    """Whether ``call`` is a matmul of static shapes, rank >= 2, computing in one of ``dtypes`` (else a note)."""
    xs, out_shape = known_shape(call.args[0]), known_shape(call)
    if xs is None or len(xs) < 2 or out_shape is None or compute_dtype(call) not in dtypes:
        ctx.report.kept.append(("matmul", f"only static {'/'.join(ALIASES[d] for d in dtypes)} matmuls of rank >= 2"))
        return False
    return True


def small_linear(ctx, chains, var, call, dtypes, acts: frozenset = ACTS) -> tuple[Linear, int] | None:
    """(the Linear ``call`` starts, its rows: the input's leading dimensions folded) for a static matmul in one of
    ``dtypes`` of constant weights, its epilogue's activation one of ``acts``; None otherwise (a batched GEMM of two
    tensors is not a Linear)."""
    if not static_matmul(ctx, call, dtypes):
        return None
    lin = linear_of(chains, var, call, acts)
    return None if lin is None else (lin, int(np.prod(lin.out_shape[:-1])))


def linear_call(ctx, lin: Linear, names: tuple[str, str], args: list, attrs, workspace_bytes: int,
                columns: int | None = None):
    """A matcher's answer for ``lin``: the call of ``names`` (matmul, matmul_add) on ``args`` and ``attrs``, the
    residual added (as the last tensor) where there is one. ``columns``: the call computes that many columns (the
    weights zero-padded, :func:`padded_columns`) and the chain's value is the first N (:class:`.chains.Columns`)."""
    out_shape, then = lin.out_shape, None
    if columns is not None:
        out_shape, then = tuple(lin.out_shape[:-1]) + (columns,), Columns(lin.out_shape[-1])
    if lin.residual is not None:
        return lin.removed, lin.last, (ctx.call(names[1], args + [lin.residual, attrs], out_shape, lin.out_dtype,
                                                workspace_bytes), then)
    return lin.removed, lin.last, (ctx.call(names[0], args + [attrs], out_shape, lin.out_dtype, workspace_bytes),
                                   then)


#: The fewest rows of a GEMM whose output rows :func:`padded_columns` aligns (a decode step's few rows are the GEMV's,
#: which reads and writes any N, and a slice after them would be one launch more a step), and the fewest
#: multiply-adds: below them the slice's launch costs about what an align-1 kernel loses (a classifier's 10 classes)
PAD_MIN_ROWS = 16
PAD_MIN_MACS = 1 << 24
_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def padded_columns(lin: Linear, rows: int) -> int | None:
    """The columns ``lin``'s GEMM computes when its output rows are not 16-byte aligned: N rounded up to 16 bytes.
    cuBLASLt's fast kernels need every row aligned; otherwise it runs align-1 kernels (GPT-2's 50,257-word head at
    512 rows: 322 us on one, against ~65 us of tensor-core work; benchmarks/findings.md). The weights and bias get
    zero columns and the chain's value is the first N (:class:`.chains.Columns`). None where N is aligned, where a
    residual (cuBLASLt's C, as unaligned as the output) is added, under :data:`PAD_MIN_ROWS` rows or
    :data:`PAD_MIN_MACS` multiply-adds."""
    per = 16 // _ITEM_BYTES.get(lin.out_dtype, 16)
    n = lin.out_shape[-1]
    macs = rows * lin.weight.size  # rows x K x N
    if per <= 1 or n % per == 0 or lin.residual is not None or rows < PAD_MIN_ROWS or macs < PAD_MIN_MACS:
        return None
    return -(-n // per) * per


def padded_operands(lin: Linear, rows: int) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(weight, bias, the columns computed) of ``lin``'s GEMM: zero columns added up to :func:`padded_columns`'s
    alignment where it gives one (None: N as it is)."""
    weight, bias = lin.weight, lin.bias
    padded = padded_columns(lin, rows)
    if padded is not None:
        extra = padded - lin.out_shape[-1]
        weight = np.pad(weight, ((0, extra), (0, 0)) if lin.transpose_b else ((0, 0), (0, extra)))
        bias = np.pad(bias, (0, extra))
    return weight, bias, padded


def matmul_chain(ctx, chains, var, call):
    if not static_matmul(ctx, call, PROVIDER.dtypes):
        return None
    lin = linear_of(chains, var, call)
    if lin is None:
        if chains.const(call.args[1]) is None:
            return batched_chain(ctx, chains, var, call)
        ctx.report.kept.append(("matmul", "weights are not a constant 2-D matrix"))
        return None
    weight, bias, padded = padded_operands(lin, int(np.prod(lin.out_shape[:-1])))
    # the bias in the result's dtype: cuBLASLt's epilogue reads it so; a residual is cuBLASLt's C (beta = 1). A
    # Linear without a bias (or an all-zero one) passes none: no bias epilogue, no bias kernel after the GEMM
    bias = bias if np.any(bias) else bias[:0]
    args = [lin.x, relax.const(weight.astype(lin.dtype)), relax.const(bias.astype(lin.out_dtype))]
    return linear_call(ctx, lin, (MATMUL, MATMUL_ADD), args, relax.ShapeExpr([lin.transpose_b, lin.act, ctx.tf32]),
                       GEMM_WORKSPACE_BYTES, padded)


def _swaps_last_two(axes, ndim: int) -> bool:
    return axes is not None and ints(axes) == list(range(ndim - 2)) + [ndim - 1, ndim - 2]


def batched_chain(ctx, chains, var, call):
    """``matmul(a, b)`` of two computed tensors with the same batch dimensions, as one strided-batched GEMM;
    a ``permute_dims`` swapping ``b``'s last two axes, used only here, becomes the call's transpose."""
    a, b = call.args
    shapes, out_shape, dtype = (known_shape(a), known_shape(b)), known_shape(call), dtype_of(call)
    if (None in shapes or out_shape is None or len(shapes[0]) < 3 or len(shapes[1]) != len(shapes[0])
            or shapes[0][:-2] != shapes[1][:-2] or compute_dtype(call) not in PROVIDER.dtypes):
        ctx.report.kept.append(("matmul", "a batched matmul needs two static fp32/fp16/bf16 tensors of one rank >= 3 "
                                          "with the same batch dimensions"))
        return None
    removed, transpose_b = [], 0
    inner = chains.value.get(b) if isinstance(b, relax.Var) else None
    if (operator_of(inner) == "relax.permute_dims" and chains.single_use(b) and b not in chains.claimed
            and _swaps_last_two(inner.attrs.axes, len(shapes[1]))):
        removed, b, transpose_b = [b], inner.args[0], 1
    args = [a, b, relax.ShapeExpr([transpose_b, ctx.tf32])]
    return removed, var, (ctx.call(BATCHED_MATMUL, args, out_shape, dtype), None)


def pointwise_chain(ctx, chains, var, call):
    """A channels-last 1x1 convolution as a GEMM over its pixels (NASNet's and the separable convolutions'
    pointwise layers: 270 in nasnetalarge). Only where cuDNN's tensor-core kernels are the alternative (TF32 and
    half precision, which build channels-last by default); registered after cuDNN, so ``kernels="vendor"`` keeps
    cuDNN, and ``kernels="best"`` measures both."""
    a = call.attrs
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout)) != ("NHWC", "OHWI", "NHWC"):
        return None
    if not ctx.allow_tf32 and compute_dtype(call) not in REDUCED_DTYPES:
        return None
    x, w = call.args
    ws, out_shape, dtype = known_shape(w), known_shape(call), dtype_of(call)
    if (ws is None or out_shape is None or ws[1:3] != (1, 1) or int(a.groups) != 1 or any(ints(a.padding))
            or ints(a.strides) != [1, 1] or (a.out_dtype and str(a.out_dtype) not in ("", "void", dtype))):
        return None  # no note: any other convolution is cuDNN's, whose report says why where it declines
    weight = chains.const(w)
    if weight is None:
        return None
    removed, last, bias, residual, act = epilogue(chains, var, out_shape, dtype, 3)
    bias = np.zeros(ws[0], dtype=dtype) if bias is None else bias
    args = [x, relax.const(np.ascontiguousarray(weight.reshape(ws[0], ws[3])).astype(dtype)),
            relax.const(bias.astype(dtype))]
    attrs = relax.ShapeExpr([1, act, ctx.tf32])  # y = act(x @ Wᵀ + bias (+ z))
    if residual is not None:
        return removed, last, (ctx.call(MATMUL_ADD, args + [residual, attrs], out_shape, dtype,
                                        GEMM_WORKSPACE_BYTES), None)
    return removed, last, (ctx.call(MATMUL, args + [attrs], out_shape, dtype, GEMM_WORKSPACE_BYTES), None)


PROVIDER = register(Provider(
    name="cublaslt", title="cuBLASLt", kernel_prefix=vendor_abi.CUBLAS.prefix,
    matchers={"relax.matmul": matmul_chain, "relax.nn.conv2d": pointwise_chain}, dtypes=DTYPES,
    layouts=("row-major", "NHWC/OHWI")))
