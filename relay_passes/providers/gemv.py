"""Our GEMV (codegen/vendor/gemv.cu): a 16-bit Linear of at most eight rows, its weights read once at the memory's
speed -- a decode step's projections, MLP and LM head at batches of 1 to 8.

    matmul(x, [permute_dims](W)) [+ bias] [-> relu|gelu] [+ residual]   (x: [..., M, K], M <= 8; W constant)

the chains of cuBLASLt's Linear (:func:`.cublaslt.linear_of`: the residual may be a float32 stream the call then
writes), with bias, activation and residual in the kernel's epilogue. Provider ``gemv_norm`` takes the same chain
with the norm before it -- a float32 LayerNorm or RMSNorm over the last axis cast to the 16-bit dtype, what the
precision policy makes of a decoder layer's norm before its projections -- into the kernel's prologue
(``norm_matmul``: one kernel fewer a norm; one row). Provider ``gemv_glu`` takes a gated MLP's
merged gate/up projection with what follows it up to the down projection, ``silu(gate) * up``, as one call
(``glu_matmul``, with the norm before it ``glu_norm_matmul``; one row): its weights' rows interleaved gate/up, so
that a block's columns pair up in the epilogue. The weights are stored [N, K] (transposed here, once, when the
model has them [K, N]), so that each output column is one contiguous row. fp16 and bf16 only (at M = 1 a 16-bit GEMM
is its weight read); K a multiple of 8 (16-byte loads). The three providers come before cuBLASLt in the registry's
order (``gemv_glu``, ``gemv_norm``, ``gemv``), so ``kernels="vendor"`` gives a decode step's Linears to them, as
``kernels="best"`` chose on every decode step measured; ``"best"`` measures each against cuBLASLt and TVM per operator.
"""
from __future__ import annotations

import numpy as np
from tvm import relax

from tvm_nimble.contract import vendor_abi

from ..precision import REDUCED_DTYPES, compute_dtype
from .chains import dtype_of, float32_bits, ints, known_shape, operator_of, other_operand
from .cublaslt import linear_call, small_linear
from .registry import Provider, register

MATMUL = vendor_abi.GEMV_MATMUL
MATMUL_ADD = vendor_abi.GEMV_MATMUL_ADD
NORM_MATMUL = vendor_abi.GEMV_NORM_MATMUL
NORM_MATMUL_ADD = vendor_abi.GEMV_NORM_MATMUL_ADD
#: the most rows (the input's leading dimensions folded) it takes: codegen/vendor/gemv_kernels.h's kGemvMaxRows
MAX_ROWS = 8
#: the widest row its prologue normalizes: gemv_kernels.h's kNormMaxK
MAX_NORM_K = 4096
#: the widest output the prologue is offered for: every block normalizes the row again, and on the LM heads measured
#: (50,257 and 151,936 columns) the prologue cost more than the norm kernel it saves (42 us against 28 without it, 108
#: against 67; benchmarks/findings.md, 'A decode step's Linears on our GEMV in kernels="vendor"'), while up to 9,728
#: (a gated MLP's gate/up) it saved time
MAX_NORM_COLUMNS = 16384
#: the prologue's norm codes (gemv_kernels.h's NormKind)
NORMS = {"relax.nn.layer_norm": 1, "relax.nn.rms_norm": 2}


def _norm_before(chains, x, dtype: str, k: int):
    """``(removed vars, the norm's input, gamma, beta, norm code, eps)`` when the Linear's input ``x`` is
    ``[reshape of rows](astype(dtype)(norm(src)))``, the norm a float32 LayerNorm (scale and centre) or RMSNorm over the
    last axis with constant parameters and ``src`` float32 or ``dtype`` (or a float32 cast of a ``dtype`` tensor, whose
    cast the call then takes too), every step read only on the way here; else None. A walk back through the bindings,
    not a DPL pattern: the offload removes the steps' vars, which a pattern's match (the values behind them) does not
    name."""
    removed = []

    def step(var, op):
        value = chains.value.get(var) if isinstance(var, relax.Var) else None
        if operator_of(value) not in op or not chains.single_use(var) or var in chains.claimed:
            return None
        removed.append(var)
        return value

    value = chains.value.get(x) if isinstance(x, relax.Var) else None
    if operator_of(value) == "relax.reshape":
        src_shape = known_shape(value.args[0])
        if src_shape is None or src_shape[-1] != k or step(x, {"relax.reshape"}) is None:
            return None
        x = value.args[0]
    cast = step(x, {"relax.astype"})
    if cast is None or dtype_of(x) != dtype:
        return None
    normed = cast.args[0]
    norm = step(normed, NORMS)
    if norm is None or dtype_of(normed) != "float32":
        return None
    src, shape, attrs = norm.args[0], known_shape(norm), norm.attrs
    axes = ints(attrs.axes)
    if shape is None or shape[-1] != k or k > MAX_NORM_K or len(axes) != 1 or axes[0] % len(shape) != len(shape) - 1:
        return None
    if dtype_of(src) not in ("float32", dtype):
        return None
    widen = chains.value.get(src) if isinstance(src, relax.Var) else None
    if operator_of(widen) == "relax.astype" and dtype_of(widen.args[0]) == dtype and step(src, {"relax.astype"}) is not None:
        src = widen.args[0]  # a 16-bit stream widened for the norm alone: the kernel reads it as it is
    code = NORMS[operator_of(norm)]
    gamma = chains.const(norm.args[1])
    beta = chains.const(norm.args[2]) if code == 1 else np.zeros(k, "float32")
    if code == 1 and not (attrs.center and attrs.scale):
        return None
    if gamma is None or beta is None or gamma.shape != (k,) or beta.shape != (k,):
        return None
    eps = float32_bits(float(attrs.epsilon))
    return removed, src, gamma.astype("float32"), beta.astype("float32"), code, eps


def _linear(ctx, chains, var, call):
    """(the Linear ``call`` starts, its weights [N, K]) when the GEMV takes it, else None (after a note)."""
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
    return lin, weight


def _constants(lin, weight, bias=None) -> list:
    """The call's weights [N, K] and bias (default: the Linear's) as constants in the dtypes the kernel reads."""
    bias = lin.bias if bias is None else bias
    return [relax.const(np.ascontiguousarray(weight).astype(lin.dtype)), relax.const(bias.astype(lin.out_dtype))]


def _one_row(lin) -> bool:
    """Whether the Linear has one row (its output's leading dimensions folded): what the prologue and the gate take."""
    return int(np.prod(lin.out_shape[:-1])) == 1


def gemv_chain(ctx, chains, var, call):
    found = _linear(ctx, chains, var, call)
    if found is None:
        return None
    lin, weight = found
    return linear_call(ctx, lin, (MATMUL, MATMUL_ADD), [lin.x] + _constants(lin, weight), relax.ShapeExpr([lin.act]),
                       1)


def gemv_norm_chain(ctx, chains, var, call):
    """The GEMV's chain of one row with the norm before it (:func:`_norm_before`); None where there is no such norm
    (or more rows: a decode step at batch 1 is what the prologue is for, and its kernels are compiled for one)."""
    found = _linear(ctx, chains, var, call)
    norm = found is not None and _one_row(found[0]) and found[1].shape[0] <= MAX_NORM_COLUMNS and \
        _norm_before(chains, found[0].x, found[0].dtype, found[1].shape[1])
    if not norm:
        return None
    lin, weight = found
    before, src, gamma, beta, code, eps = norm
    removed, last, value = linear_call(ctx, lin, (NORM_MATMUL, NORM_MATMUL_ADD),
                                       [src, relax.const(gamma), relax.const(beta)] + _constants(lin, weight),
                                       relax.ShapeExpr([lin.act, code, eps]), 1)
    return before + removed, last, value


PROVIDER = register(Provider(
    name="gemv", title="GEMV (ours: a decode step's few rows)", kernel_prefix=vendor_abi.GEMV.prefix,
    matchers={"relax.matmul": gemv_chain}, dtypes=REDUCED_DTYPES, layouts=("row-major",)))

#: A candidate of the kernel choice like every provider: where its grid is several waves (an LM head, Qwen's gate/up)
#: the prologue costs more than the norm kernel it saves, and the choice measures that and keeps the plain GEMV there
#: (benchmarks/findings.md, 'The norm in the GEMV's prologue by default').
NORM_PROVIDER = register(Provider(
    name="gemv_norm", title="GEMV with its LayerNorm/RMSNorm prologue (ours)",
    kernel_prefix=vendor_abi.family(NORM_MATMUL, NORM_MATMUL_ADD),
    matchers={"relax.matmul": gemv_norm_chain}, dtypes=REDUCED_DTYPES, layouts=("row-major",)))

GLU_MATMUL = vendor_abi.GEMV_GLU_MATMUL
GLU_NORM_MATMUL = vendor_abi.GEMV_GLU_NORM_MATMUL
#: the gates the kernel computes (gemv_kernels.h's GluKind)
GLU_SILU = 1


def _single(chains, var, op: str):
    """(var, value) of the one binding reading ``var`` when that is ``op`` and nothing else reads ``var``."""
    nxt, value = chains.follow(var)
    return (nxt, value) if operator_of(value) == op else (None, None)


def _glu_after(chains, lin):
    """``(removed vars, the gated var)`` when the Linear's whole output is split in two halves along its last axis,
    gate then up, that only ``silu(gate) * up`` reads (SiLU as ``g * sigmoid(g)``, as the exporters write it, each
    product's operands in either order): a gated MLP's merged gate/up projection up to its down projection's input;
    else None."""
    shape = lin.out_shape
    if lin.act or lin.residual is not None or lin.out_dtype != lin.dtype or shape[-1] % 2:
        return None
    split_var, split = _single(chains, lin.last, "relax.split")
    if split is None or int(split.attrs.axis) % len(shape) != len(shape) - 1:
        return None
    sections = split.attrs.indices_or_sections
    try:
        halves = ints(sections) == [shape[-1] // 2]  # split at the middle
    except TypeError:
        halves = int(sections) == 2  # two equal sections
    readers = chains.consumers.get(split_var, [])
    items = {int(chains.value[v].index): v for v in readers if isinstance(chains.value[v], relax.TupleGetItem)}
    if not halves or sorted(items) != [0, 1] or chains.uses.get(split_var, 0) != 2 or split_var in chains.claimed:
        return None
    gate, up = items[0], items[1]
    gate_readers = [v for v in chains.consumers.get(gate, []) if v not in chains.claimed]
    if chains.uses.get(gate, 0) != 2 or len(gate_readers) != 2 or not chains.single_use(up):
        return None
    sig = next((v for v in gate_readers if operator_of(chains.value[v]) == "relax.sigmoid"), None)
    silu = next((v for v in gate_readers if operator_of(chains.value[v]) == "relax.multiply"), None)
    if sig is None or silu is None or not chains.single_use(sig):
        return None
    gate_times = other_operand(chains.value[silu], gate)
    if gate_times is None or not gate_times.same_as(sig):
        return None
    gated, product = _single(chains, silu, "relax.multiply")
    times_up = other_operand(product, silu) if product is not None else None
    if times_up is None or not times_up.same_as(up):
        return None
    if any(dtype_of(v) != lin.dtype for v in (gate, up, sig, silu, gated)):
        return None
    return [lin.last, split_var, gate, up, sig, silu], gated


def _interleaved(rows: np.ndarray) -> np.ndarray:
    """``rows`` ([2I, ...], gate then up) as pairs: row 2j gate j, row 2j + 1 up j."""
    half = rows.shape[0] // 2
    return np.stack([rows[:half], rows[half:]], axis=1).reshape(rows.shape)


def gemv_glu_chain(ctx, chains, var, call):
    """A one-row gated MLP's gate/up projection and gate (:func:`_glu_after`), with the norm before it where there is
    one (:func:`_norm_before`), as one ``glu_matmul`` / ``glu_norm_matmul`` call."""
    found = _linear(ctx, chains, var, call)
    glu = found is not None and _one_row(found[0]) and _glu_after(chains, found[0])
    if not glu:
        return None
    (lin, weight), (removed, gated) = found, glu
    consts = _constants(lin, _interleaved(weight), _interleaved(lin.bias))  # (out_dtype is dtype: _glu_after)
    norm = _norm_before(chains, lin.x, lin.dtype, weight.shape[1])
    out_shape = lin.out_shape[:-1] + (lin.out_shape[-1] // 2,)
    if norm:
        before, src, gamma, beta, code, eps = norm
        value = ctx.call(GLU_NORM_MATMUL, [src, relax.const(gamma), relax.const(beta)] + consts
                         + [relax.ShapeExpr([GLU_SILU, code, eps])], out_shape, lin.dtype, 1)
        return before + lin.removed + removed, gated, (value, None)
    value = ctx.call(GLU_MATMUL, [lin.x] + consts + [relax.ShapeExpr([GLU_SILU])], out_shape, lin.dtype, 1)
    return lin.removed + removed, gated, (value, None)


#: the gated MLP's projection and gate as one kernel: checked against float64 PyTorch on an H200 (experiment
#: gemv_check), measured per chain by kernels="best" (which takes it for the 0.5B decoder's MLPs: benchmarks/findings.md)
GLU_PROVIDER = register(Provider(
    name="gemv_glu", title="GEMV of a gated MLP's gate/up projection with its SiLU gate (ours)",
    kernel_prefix=vendor_abi.family(GLU_MATMUL, GLU_NORM_MATMUL),
    matchers={"relax.matmul": gemv_glu_chain}, dtypes=REDUCED_DTYPES, layouts=("row-major",)))
