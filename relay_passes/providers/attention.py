"""Fused attention: scaled dot-product attention as one kernel of the vendor extension.

    matmul(q, kᵀ) [* c | / c ...] [+ bias] -> softmax(axis=-1) -> matmul(·, v) [-> permute_dims(0, 2, 1, 3)]

as the ONNX exports of timm and Hugging Face models spell it, as one kernel: ours
(``nimble.attention.sdpa``, codegen/vendor/attention.cu: fp32 and fp16, with a mask) or, for fp16/bf16,
cuDNN's SDPA: without a mask (``nimble.attention.cudnn_sdpa``, provider ``cudnn_sdpa``, ahead of ours), or with
one and grouped K/V heads (``nimble.attention.cudnn_bias_sdpa``, provider ``cudnn_bias_sdpa``, ahead of ours too:
``kernels="vendor"`` gives it a 16-bit decoder's or BERT's attention, which it runs 1.4x-7x faster than ours on an
H200 at 128-512 keys, and ``"best"`` measures both; not for one query row, a decode step, whose cache write our
kernels take in).

q, kᵀ and v are traced back through the views that split the heads (reshape, permute_dims, take / split + squeeze of a constant index,
and a multiply by a scalar constant, which becomes part of the scale) to the tensors the model
computes, e.g. one QKV Linear's output for all three: the call reads them through strided views,
so those copies disappear, and a following ``permute_dims(0, 2, 1, 3)`` (the head merge) is written
in place. Grouped-query attention's ``repeat_kv`` (K or V [B, Hkv, S, D] -> expand_dims(axis=2) ->
broadcast_to [B, Hkv, g, S, D] -> reshape [B, Hkv * g, S, D], as the Qwen2 / Llama exports spell it) is
read in place too: the call's attrs end with the group g, and query head h reads KV head h // g. Casts
around the softmax (reduced-precision builds compute it in fp32; decoders' exports cast its output
back to the values' dtype) are part of the chain. A bias (an attention mask) must broadcast to [B, H, Sq, Sk] from the right; any other
form (``where`` masks, a scale after the bias, a head dimension over 128) stays on the other
providers' and TVM's kernels, with the reason in the offload report.

Matched by walking the bindings, not by one dataflow pattern (``tvm.relax.dpl``) as the other chains' steps are: the
chain runs forward from Q·Kᵀ through the softmax to ·V, and from there q, kᵀ and v are each traced back through a
sequence of views of any length and order (reshapes, transposes, split items, repeat_kv), whose composition as
strides is the match's result; a pattern would need one alternative per sequence and still leave the strides to
this walk. Its constants (scales, take indices) are read through :meth:`.chains.Chains.const`, a pattern.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from tvm import relax

from tvm_nimble.contract import vendor_abi

from ..cache_in_attention import CacheWriteInAttention, RotaryInAttention
from ..key_mask import KeyMaskInAttention, causal_parts
from .chains import const_value, dtype_of, float32_bits, ints, known_shape, operator_of, other_operand
from .registry import Provider, register

SDPA = vendor_abi.ATTENTION_SDPA
SDPA_BIAS = vendor_abi.ATTENTION_SDPA_BIAS
CUDNN_SDPA = vendor_abi.ATTENTION_CUDNN_SDPA
CUDNN_BIAS_SDPA = vendor_abi.ATTENTION_CUDNN_BIAS_SDPA
#: the same where the mask masks every key after its query whatever the inputs (:func:`masks_later_keys`): cuDNN's
#: causal mask on top of it, which skips the key tiles above the diagonal
CUDNN_BIAS_CAUSAL_SDPA = vendor_abi.ATTENTION_CUDNN_BIAS_CAUSAL_SDPA
CUDNN_KEY_CAUSAL_SDPA = vendor_abi.ATTENTION_CUDNN_KEY_CAUSAL_SDPA
#: the split-key kernel (codegen/vendor/attention.cu), same attrs; provider ``attention_split``
SPLIT_SDPA = vendor_abi.ATTENTION_SPLIT_SDPA
SPLIT_SDPA_BIAS = vendor_abi.ATTENTION_SPLIT_SDPA_BIAS
#: the tile kernel (codegen/vendor/attention_tile.h: register-tiled Q·Kᵀ and P·V, the head's K and V in shared
#: memory), same attrs; provider ``attention_tile``
TILE_SDPA = vendor_abi.ATTENTION_TILE_SDPA
TILE_SDPA_BIAS = vendor_abi.ATTENTION_TILE_SDPA_BIAS
#: the key-split fp32 kernel (codegen/vendor/attention_cluster.cu: a query tile's key chunks on the blocks of a
#: thread-block cluster), same attrs; provider ``attention_cluster``
CLUSTER_SDPA = vendor_abi.ATTENTION_CLUSTER_SDPA
CLUSTER_SDPA_BIAS = vendor_abi.ATTENTION_CLUSTER_SDPA_BIAS
MAX_HEAD_DIM = 128  # codegen/vendor/sdpa_args.h: kMaxHeadDim
_DTYPES = ("float32", "float16", "bfloat16")
_HALF = ("float16", "bfloat16")  # what cuDNN's SDPA takes
_FP32 = ("float32",)  # what the key-split cluster kernel takes
_BITS = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}
_VIEWS = ("relax.reshape", "relax.permute_dims", "relax.take", "relax.squeeze", "relax.expand_dims")
_SCALES = ("relax.multiply", "relax.divide")


class _NotTaken(Exception):
    """The chain is attention but not one the kernel takes; the message is the report's reason."""


def _scalar(chains, expr) -> float | None:
    """A scalar constant, also one cast by ``astype`` (ToMixedPrecision leaves those in fp16 builds)."""
    c = chains.const(expr)
    if c is None and isinstance(expr, relax.Var) and operator_of(chains.value.get(expr)) == "relax.astype":
        c = chains.const(chains.value[expr].args[0])
    return float(c.reshape(())) if c is not None and c.size == 1 else None


def _scale_step(chains, value) -> float | None:
    """The factor of ``x * c``, ``c * x`` or ``x / c`` (c a scalar constant), else None."""
    op = operator_of(value)
    if op not in _SCALES:
        return None
    a, b = value.args
    if op == "relax.divide":
        c = _scalar(chains, b)
        return None if not c else 1.0 / c
    c = _scalar(chains, b)
    return c if c is not None else _scalar(chains, a)


def _scaled_input(chains, value):
    op = operator_of(value)
    if op == "relax.multiply" and _scalar(chains, value.args[1]) is None:
        return value.args[1]
    return value.args[0]


def _repeat_kv(chains, var, stop: set) -> list | None:
    """The bindings of ``repeat_kv`` computing ``var`` (reshape first): ``reshape(broadcast_to(expand_dims(x,
    axis=2), [B, Hkv, g, S, D]), [B, Hkv * g, S, D])`` with x [B, Hkv, S, D]; else None."""
    value = chains.value.get(var)
    if operator_of(value) != "relax.reshape" or not isinstance(value.args[0], relax.Var):
        return None
    wide = value.args[0]
    wide_value = chains.value.get(wide)
    if operator_of(wide_value) != "relax.broadcast_to" or not isinstance(wide_value.args[0], relax.Var):
        return None
    unit = wide_value.args[0]
    unit_value = chains.value.get(unit)
    if operator_of(unit_value) != "relax.expand_dims" or any(v in stop or v in chains.claimed for v in (wide, unit)):
        return None
    x, out, mid, big = unit_value.args[0], known_shape(var), known_shape(unit), known_shape(wide)
    src = known_shape(x)
    if None in (out, mid, big, src) or len(src) != 4 or len(big) != 5:
        return None
    b, hkv, s, d = src
    if (list(mid) != [b, hkv, 1, s, d] or big[:2] != (b, hkv) or big[3:] != (s, d)
            or list(out) != [b, hkv * big[2], s, d]):
        return None
    return [(var, value), (wide, wide_value), (unit, unit_value)]


def _trace(chains, operand, stop: set) -> list:
    """The view / scale bindings from ``operand`` back towards the tensor it reads (operand first),
    stopping at a var in ``stop`` or at any other operator."""
    steps, var = [], operand
    while isinstance(var, relax.Var) and var in chains.value and var not in stop and var not in chains.claimed:
        value = chains.value[var]
        repeat = _repeat_kv(chains, var, stop)
        if repeat is not None:
            steps += repeat
            var = repeat[-1][1].args[0]
        elif isinstance(value, relax.TupleGetItem):
            split = chains.value.get(value.tuple_value) if isinstance(value.tuple_value, relax.Var) else None
            if operator_of(split) != "relax.split" or value.tuple_value in stop:
                break
            steps += [(var, value), (value.tuple_value, split)]  # the split itself is a member too
            var = split.args[0]
        elif operator_of(value) in _VIEWS or operator_of(value) == "relax.astype":
            # fp16 builds take a view in fp32 and cast back (exact); _take refuses casts that round
            steps.append((var, value))
            var = value.args[0]
        elif _scale_step(chains, value) is not None:
            steps.append((var, value))
            var = _scaled_input(chains, value)
        else:
            break
    # a cast that rounds (float32 rotary output to fp16) and is not undone below it: the call reads the rounded
    # tensor, so the trace ends there (a view taken in fp32 of an fp16 tensor and cast back stays absorbed)
    if isinstance(var, relax.Expr) and isinstance(operand, relax.Expr) and dtype_of(var) != dtype_of(operand):
        for i, (sv, value) in enumerate(steps):
            if operator_of(value) == "relax.astype" and _BITS.get(dtype_of(sv), 0) < _BITS.get(dtype_of(value.args[0]), 0):
                return steps[:i]
    return steps


def _contiguous(shape) -> list[int]:
    strides, n = [], 1
    for d in reversed(shape):
        strides.append(n)
        n *= d
    return strides[::-1]


def reshape_strides(shape, strides, out) -> list[int] | None:
    """The strides of ``out`` as a view of the same elements as the view (``shape``, ``strides``), or None
    when no strides express it (NumPy's no-copy reshape). A merged Q/K/V GEMM's part is strided along its
    last axis ([S, 3 * H * D] read as [S, H * D]); splitting that axis into heads keeps it a view."""
    old = [(d, s) for d, s in zip(shape, strides) if d != 1]
    new = [int(d) for d in out]
    res = [0] * len(new)
    oi = ni = 0
    while ni < len(new) and oi < len(old):
        n_size, o_size, nj, oj = new[ni], old[oi][0], ni + 1, oi + 1
        while n_size != o_size:
            if n_size < o_size:
                if nj >= len(new):
                    return None
                n_size, nj = n_size * new[nj], nj + 1
            else:
                if oj >= len(old):
                    return None
                o_size, oj = o_size * old[oj][0], oj + 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
            return None  # the old axes this group merges are not contiguous with each other
        res[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            res[k - 1] = res[k] * new[k]
        ni, oi = nj, oj
    if oi < len(old) or any(d != 1 for d in new[ni:]):
        return None
    for k in range(ni, len(new)):  # trailing axes of extent 1: any stride reads the same element
        res[k] = 1
    return res


def _input_of(chains, value):
    """The tensor a traced step reads (a split's item: the split's input)."""
    if isinstance(value, relax.TupleGetItem):
        return chains.value[value.tuple_value].args[0]
    return _scaled_input(chains, value) if operator_of(value) in _SCALES else value.args[0]


@dataclass
class _View:
    """A strided view of a tensor the model computes: element [i0, i1, ..] at ``offset + sum(i * stride)``, except
    that along ``head_axis`` index i reads i // ``group`` (a repeat_kv's query heads sharing one KV head)."""

    offset: int
    shape: list
    strides: list
    scale: float = 1.0
    group: int = 1
    head_axis: int = -1


def _compose(chains, base, steps: list) -> _View:
    """The first step's output as a view of ``base``, the last step's input: the steps applied base-first."""
    shape = known_shape(base)
    if shape is None:
        raise _NotTaken("a tensor of the attention has no static shape")
    shape, strides, offset, scale = list(shape), _contiguous(shape), 0, 1.0
    group, head_axis, repeating = 1, -1, False
    for var, value in reversed(steps):
        op = operator_of(value)
        if group > 1 and op not in _SCALES and op not in ("relax.astype", "relax.permute_dims"):
            raise _NotTaken("a view of repeated K/V heads the trace cannot follow")
        if op == "relax.broadcast_to":  # repeat_kv: [B, Hkv, 1, S, D] (stride 0 on the unit axis) -> [B, Hkv, g, S, D]
            shape, repeating = list(known_shape(var)), True
            continue
        if repeating:  # repeat_kv's reshape [B, Hkv, g, S, D] -> [B, Hkv * g, S, D] (see _repeat_kv)
            group, head_axis, repeating = shape[2], 1, False
            shape = [shape[0], shape[1] * group, shape[3], shape[4]]
            strides = [strides[0], strides[1], strides[3], strides[4]]  # the KV head's stride; h // group picks it
            continue
        if operator_of(value) == "relax.split":
            continue  # its item (the next step) says which part
        if isinstance(value, relax.TupleGetItem):
            split = chains.value[value.tuple_value]
            axis = int(split.attrs.axis) % len(shape)
            sections = split.attrs.indices_or_sections
            if isinstance(sections, (int, np.integer)) or hasattr(sections, "value"):
                n = int(getattr(sections, "value", sections))
                starts = [i * (shape[axis] // n) for i in range(n + 1)]
            else:
                starts = [0] + ints(sections) + [shape[axis]]
            i = int(value.index)
            offset += starts[i] * strides[axis]
            shape[axis] = starts[i + 1] - starts[i]
            continue
        if op in _SCALES:
            scale *= _scale_step(chains, value)
            continue
        if op == "relax.astype":
            continue
        out = known_shape(var)
        if out is None:
            raise _NotTaken("a view of the attention has no static shape")
        if op == "relax.reshape":
            reshaped = reshape_strides(shape, strides, out)
            if reshaped is None:
                raise _NotTaken("a reshape of a strided view that no strides express")
            shape, strides = list(out), reshaped
        elif op == "relax.permute_dims":
            axes = list(range(len(shape)))[::-1] if value.attrs.axes is None else ints(value.attrs.axes)
            shape, strides = [shape[a] for a in axes], [strides[a] for a in axes]
            head_axis = axes.index(head_axis) if group > 1 else head_axis
        elif op == "relax.take":
            idx = const_value(chains.value, value.args[1])
            if idx is None or idx.size != 1:
                raise _NotTaken("a take whose index is not one constant")
            axis = int(value.attrs.axis or 0) % len(shape)
            offset += (int(idx.reshape(())) % shape[axis]) * strides[axis]
            if idx.ndim == 0:
                del shape[axis], strides[axis]
            else:
                shape[axis] = 1
        elif op in ("relax.squeeze", "relax.expand_dims"):
            # both only add or drop size-1 axes: match the output's axes to the input's in order
            kept = [(d, s) for d, s in zip(shape, strides) if d != 1]
            shape, strides, it = list(out), [], iter(kept)
            for d in out:
                strides.append(next(it)[1] if d != 1 else 0)
        if list(shape) != list(out):
            raise _NotTaken("a view the trace cannot follow")
    return _View(offset, shape, strides, scale, group, head_axis)


def _bhsd(shape, strides, what: str):
    """[B, H, S, D] (rank 3 is one batch) with the head dimension contiguous, else _NotTaken."""
    if len(shape) == 3:
        shape, strides = [1] + list(shape), [0] + list(strides)
    if len(shape) != 4:
        raise _NotTaken(f"{what} has rank {len(shape)}; the kernel takes [B, H, S, D] or [B*H, S, D]")
    if strides[3] != 1 and shape[3] != 1:
        raise _NotTaken(f"{what}'s head dimension is strided")
    return shape, strides


def _absorbable(chains, core: set, traces: list[list]) -> set:
    """The traced view vars that can be dropped: every use inside the chain, and so is every view
    between them and the attention (a var the model uses elsewhere stays, and the trace reads it)."""
    members = set(core) | {v for steps in traces for v, _ in steps}
    while True:
        outside = {v for steps in traces for v, _ in steps if v in members
                   and chains.uses.get(v, 0) != sum(c in members for c in chains.consumers.get(v, []))}
        if not outside:
            break
        members -= outside
    keep = set()
    for steps in traces:
        for v, _ in steps:
            if v not in members:
                break
            keep.add(v)
    return keep


def _reaches_softmax(chains, var, steps: int = 4) -> bool:
    for _ in range(steps):
        var, value = chains.follow(var)
        if value is None:
            return False
        if operator_of(value) == "relax.nn.softmax":
            return True
    return False


def masks_later_keys(chains, bias, Sq: int, Sk: int) -> bool:
    """Whether the additive mask ``bias`` masks every key after its query (key j > query i) whatever the model's
    inputs: ``where(allowed, 0, m)`` with ``m`` at most -1e4 and ``allowed`` (through casts, broadcasts and reshapes
    that keep the [Sq, Sk] plane) the logical and of anything with a constant that is False above its diagonal, as
    transformers' decoders export their causal + padding mask. Such a call may also take cuDNN's causal mask, which
    skips the tiles above the diagonal; the bias still masks them, so the result is the same either way."""
    return causal_parts(chains, bias, Sq, Sk) is not None


def attention_chain(ctx, chains, var, call, cudnn: bool = False, kernels: tuple[str, str] = (SDPA, SDPA_BIAS),
                    dtypes: tuple[str, ...] = _DTYPES):
    """The anchor is Q·Kᵀ; None (silently) when no softmax follows, so the GEMM providers get it.
    ``cudnn``: the call for cuDNN's SDPA, for the chains it documents (else None, silently: the reasons
    are reported once, by our row-per-warp kernel's provider). ``kernels``: which kernel the call
    runs, (without a mask, with one): the row-per-warp, split-key, tile or key-split cluster kernel, or cuDNN's
    (None: the provider does not take chains without / with a mask); ``dtypes``:
    the q/k/v dtypes it takes (others: None, silently, as another kernel takes them)."""
    report = ctx.report.kept if not cudnn and kernels == (SDPA, SDPA_BIAS) else []
    scores_shape = known_shape(call)
    if scores_shape is None or len(scores_shape) not in (3, 4):
        return None
    core, scale, bias, last = [var], 1.0, None, var
    nxt, val = chains.follow(last)
    while val is not None and operator_of(val) != "relax.nn.softmax":
        factor = _scale_step(chains, val)
        if operator_of(val) == "relax.astype":
            pass  # reduced-precision builds compute the softmax in fp32; so does the kernel
        elif factor is not None and bias is None and last.same_as(_scaled_input(chains, val)):
            scale *= factor
        elif operator_of(val) == "relax.add" and bias is None:
            bias = other_operand(val, last)
        else:
            if _reaches_softmax(chains, last):
                report.append(("attention", f"{(operator_of(val) or type(val).__name__).replace('relax.', '')} before the softmax "
                                                     "is not a scale or one additive mask"))
            return None
        core.append(nxt)
        last = nxt
        nxt, val = chains.follow(last)
    if val is None or int(val.attrs.axis) % len(scores_shape) != len(scores_shape) - 1:
        return None
    core.append(nxt)
    probs = nxt
    nxt, pv = chains.follow(probs)
    while operator_of(pv) == "relax.astype":  # back to the build's precision for ·V (exports cast once more)
        core.append(nxt)
        probs = nxt
        nxt, pv = chains.follow(probs)
    if operator_of(pv) != "relax.matmul" or not pv.args[0].same_as(probs):
        return None
    try:
        return _take(ctx, chains, call, core + [nxt], nxt, pv, scale, bias, cudnn, kernels, dtypes)
    except _NotTaken as why:
        report.append(("attention", str(why)))
        return None


def _take(ctx, chains, qk, core, out_var, pv, scale, bias, cudnn: bool, kernels: tuple[str, str],
          dtypes: tuple[str, ...]):
    dtype = dtype_of(qk)
    if dtype in _DTYPES and dtype not in dtypes:
        return None
    if dtype not in _DTYPES or dtype_of(pv) != dtype:
        raise _NotTaken(f"dtype {dtype}; the kernel takes {'/'.join(_DTYPES)}")
    q, kt = qk.args
    v = pv.args[1]
    nxt, perm = chains.follow(out_var)
    merge = (operator_of(perm) == "relax.permute_dims" and perm.attrs.axes is not None
             and ints(perm.attrs.axes) == [0, 2, 1, 3])
    core = set(core) | ({nxt} if merge else set())
    traces = [_trace(chains, x, core) for x in (q, kt, v)]
    keep = _absorbable(chains, core, traces)
    views = []
    for x, steps in zip((q, kt, v), traces):
        steps = [(sv, value) for sv, value in steps if sv in keep]  # a prefix: what the call reads through
        base = _input_of(chains, steps[-1][1]) if steps else x  # an item's base is its split's input
        view = _compose(chains, base, steps)
        if any(operator_of(value) == "relax.astype" and _BITS[dtype_of(sv)] < _BITS[dtype] for sv, value in steps):
            raise _NotTaken(f"q, k or v is rounded to a narrower dtype than the attention's {dtype}")
        if dtype_of(base) != dtype:
            raise _NotTaken("q, k and v are read from tensors of another dtype")
        views.append((base, view))
        scale *= view.scale
    (qb, qv), (kb, kv), (vb, vv) = views
    group = kv.group
    if qv.group != 1 or vv.group != group or any(x.group > 1 and (len(x.shape) != 4 or x.head_axis != 1)
                                                 for x in (kv, vv)):
        raise _NotTaken("q is repeated, or k and v are not repeated alike along the heads (grouped-query attention "
                        "reads each KV head once for the query heads of its group)")
    qo, qs, qst = qv.offset, qv.shape, qv.strides
    ko, ks, kst = kv.offset, kv.shape, kv.strides
    vo, vs, vst = vv.offset, vv.shape, vv.strides
    if len(ks) in (3, 4):  # kᵀ [.., D, Sk] -> k [.., Sk, D]
        ks, kst = ks[:-2] + [ks[-1], ks[-2]], kst[:-2] + [kst[-1], kst[-2]]
    qs, qst = _bhsd(qs, qst, "q")
    ks, kst = _bhsd(ks, kst, "k")
    vs, vst = _bhsd(vs, vst, "v")
    B, H, Sq, D = qs
    Sk, Dv = ks[2], vs[3]
    if ks[:2] != [B, H] or vs[:3] != [B, H, Sk] or ks[3] != D:
        raise _NotTaken(f"q {qs}, k {ks} and v {vs} do not line up as [B, H, S, D]")
    if max(D, Dv) > MAX_HEAD_DIM:
        raise _NotTaken(f"head dimension {max(D, Dv)} > {MAX_HEAD_DIM}")
    if merge:
        out_shape, o_strides = [B, Sq, H, Dv], [Sq * H * Dv, Dv, H * Dv]
        last = nxt
    else:
        out_shape, o_strides = list(known_shape(pv)), [H * Sq * Dv, Sq * Dv, Dv]
        last = out_var
    m_strides = [0, 0, 0, 0]
    args = [qb, kb, vb]
    if bias is not None:
        ms = known_shape(bias)
        if ms is None or len(ms) > 4 or dtype_of(bias) not in (dtype, "float32"):
            raise _NotTaken("the mask is not a static tensor of the attention's dtype or float32")
        aligned = [1] * (4 - len(ms)) + list(ms)
        if any(m not in (1, t) for m, t in zip(aligned, [B, H, Sq, Sk])):
            raise _NotTaken(f"a mask of shape {list(ms)} does not broadcast to {[B, H, Sq, Sk]}")
        m_strides = [s if m != 1 else 0 for m, s in zip(aligned, _contiguous(aligned))]
        args.append(bias)
    scale_bits = float32_bits(scale)
    # the KV head of query head h is h // group, written only where it is over 1 (codegen/vendor/sdpa_args.h: 26
    # attrs, or 27 with the group; plans without it stay as they were)
    attrs = [B, H, Sq, Sk, D, Dv, qo, qst[0], qst[1], qst[2], ko, kst[0], kst[1], kst[2],
             vo, vst[0], vst[1], vst[2], *o_strides, *m_strides, scale_bits] + ([group] if group > 1 else [])
    args.append(relax.ShapeExpr(attrs))
    removed = list(keep | (core - {last}))
    if cudnn:
        name = kernels[1] if bias is not None else kernels[0]
        aligned = [D, Dv, qo, ko, vo, *qst[:3], *kst[:3], *vst[:3], *o_strides]
        if name is None or dtype not in _HALF or any(x % 8 for x in aligned):
            return None  # cuDNN's SDPA: fp16/bf16, 16-byte aligned rows and heads
        if bias is None:
            if group != 1:
                return None  # grouped K/V heads: the call with a mask (a decoder's) takes them
            return removed, last, (ctx.call(name, args, tuple(out_shape), dtype), None)
        if Sq == 1:
            return None  # a decode step's one query row: our kernels, which take its cache write in
        if masks_later_keys(chains, bias, Sq, Sk):
            name = CUDNN_BIAS_CAUSAL_SDPA
        # the mask converted to q's dtype goes into the workspace past cuDNN's own (codegen/vendor/cudnn_attention.cpp)
        mask_elements = (B if m_strides[0] else 1) * (H if m_strides[1] else 1) * Sq * Sk
        workspace = ctx.workspace_bytes + 256 + 2 * mask_elements
        return removed, last, (ctx.call(name, args, tuple(out_shape), dtype, workspace_bytes=workspace), None)
    if kernels == (SDPA, SDPA_BIAS) and Sq == 1:
        # one query row (a decoder's decode step over its cache): the row-per-warp kernel gives it one warp per
        # head; the split-key kernel spreads the keys over a block's eight warps
        kernels = (SPLIT_SDPA, SPLIT_SDPA_BIAS)
    name = kernels[1] if bias is not None else kernels[0]
    return removed, last, (ctx.call(name, args, tuple(out_shape), dtype, workspace_bytes=1), None)


#: cuDNN's fused attention (the cuDNN frontend's SDPA graph) for the fp16/bf16 chains it takes; registered
#: first, so that kernels="vendor" gives it those, and "best" measures it against our kernel
CUDNN_PROVIDER = register(Provider(
    name="cudnn_sdpa", title="cuDNN fused attention", kernel_prefix=vendor_abi.family(CUDNN_SDPA),
    matchers={"relax.matmul": functools.partial(attention_chain, cudnn=True, kernels=(CUDNN_SDPA, None))},
    dtypes=_HALF, layouts=("row-major",)))

PROVIDER = register(Provider(
    name="attention", title="fused attention", kernel_prefix=vendor_abi.family(SDPA, SDPA_BIAS),
    matchers={"relax.matmul": attention_chain}, dtypes=_DTYPES, layouts=("row-major",)))

#: the split-key attention kernel (a block's warps on separate key tiles, for head dimensions up to 64; larger
#: heads run the row-per-warp kernel inside the same call). Checked against float64 and timed on an H200 and an
#: H100 (scripts/experiments/attention_check.py): faster than ours on ViT-S's shape (15.5 vs 17.7 us) and long
#: sequences, slower on ViT-B's, so it is one more candidate the kernel choice measures per operator
SPLIT_PROVIDER = register(Provider(
    name="attention_split", title="fused attention (split-key kernel)",
    kernel_prefix=vendor_abi.family(SPLIT_SDPA, SPLIT_SDPA_BIAS),
    matchers={"relax.matmul": functools.partial(attention_chain, kernels=(SPLIT_SDPA, SPLIT_SDPA_BIAS))},
    dtypes=_DTYPES, layouts=("row-major",)))

#: the tile attention kernel (one block per (batch, head) and R query rows, the head's K and then V in shared
#: memory, Q·Kᵀ and P·V register-tiled like a small SIMT GEMM; a head whose K does not fit shared memory runs
#: the row-per-warp kernel inside the same call). Faster than the row-per-warp kernel at ViT-B's shape, slower
#: on small grids (see benchmarks/findings.md, 'Attention kernels, build times, serving googlenet, PyTorch's half
#: precision by layout'); measured per operator
TILE_PROVIDER = register(Provider(
    name="attention_tile", title="fused attention (tile kernel)",
    kernel_prefix=vendor_abi.family(TILE_SDPA, TILE_SDPA_BIAS),
    matchers={"relax.matmul": functools.partial(attention_chain, kernels=(TILE_SDPA, TILE_SDPA_BIAS))},
    dtypes=_DTYPES, layouts=("row-major",)))

#: cuDNN's fused attention with a mask (a decoder's causal + padding mask, BERT's padding mask) and grouped K/V heads,
#: fp16/bf16, more than one query row; with cuDNN's causal mask too where the mask is causal whatever the inputs.
#: Ahead of our kernels (registry.PRIORITY), as cudnn_sdpa: "vendor" gives it those chains (GPT-2 at 512 keys on an
#: H200: 17 us a layer against ours' 100-130), "best" measures it against ours per operator
CUDNN_BIAS_PROVIDER = register(Provider(
    name="cudnn_bias_sdpa", title="cuDNN fused attention with a mask",
    kernel_prefix=vendor_abi.family(CUDNN_BIAS_SDPA, CUDNN_BIAS_CAUSAL_SDPA),
    matchers={"relax.matmul": functools.partial(attention_chain, cudnn=True, kernels=(None, CUDNN_BIAS_SDPA))},
    dtypes=_HALF, layouts=("row-major",)))

#: a decode step's KV cache write and its fused attention as one call (``nimble.attention.append_sdpa_bias``): no
#: matcher of operators but a rewrite after the offload, of the attention calls above that follow a cache write
#: (:mod:`tvm_nimble.relay_passes.cache_in_attention`); ``providers=`` without it keeps the write a kernel of its own
APPEND_PROVIDER = register(Provider(
    name="attention_append", title="the KV cache write in the decode attention",
    kernel_prefix=vendor_abi.family(vendor_abi.ATTENTION_APPEND_SDPA_BIAS), dtypes=_DTYPES, layouts=("row-major",),
    rewrite=CacheWriteInAttention()))

#: and the rotary embedding of q and the new key inside that call (``append_rope_sdpa_bias``: two TVM kernels a layer
#: of a Llama-style decode step fewer); after attention_append, whose calls it rewrites
ROPE_PROVIDER = register(Provider(
    name="attention_rope", title="the rotary embedding in the decode attention",
    kernel_prefix=vendor_abi.family(vendor_abi.ATTENTION_APPEND_ROPE_SDPA_BIAS), dtypes=_DTYPES,
    layouts=("row-major",), rewrite=RotaryInAttention()))

#: a decoder's causal + padding mask handed to cuDNN in two parts: the padding as one row of keys, the causal part as
#: cuDNN's own mask (``cudnn_key_causal_sdpa``), in place of the whole [S, S] plane a head reads; a rewrite of the calls
#: cudnn_bias_sdpa made (:mod:`tvm_nimble.relay_passes.key_mask`); measured faster than the whole plane (benchmarks/
#: findings.md, 'The decoder's mask as one row of keys')
KEY_MASK_PROVIDER = register(Provider(
    name="cudnn_key_mask", title="cuDNN's causal mask and a padding mask of keys",
    kernel_prefix=vendor_abi.ATTENTION_CUDNN_KEY_CAUSAL_SDPA, dtypes=_HALF, layouts=("row-major",),
    rewrite=KeyMaskInAttention()))

#: the key-split attention kernel for fp32 (32 query rows and a chunk of at most 64 keys per block, a query tile's
#: chunks on the blocks of one thread-block cluster, merged through distributed shared memory), for the batch-1
#: shapes where the other kernels leave most SMs idle (ViT-B: 84 blocks of a whole head's keys). fp32 only: in 16 bits
#: cuDNN's SDPA is faster. A call it does not take (a head over 64, unaligned rows, over 512 keys) runs the tile
#: kernel inside the same call; measured per operator like the others
CLUSTER_PROVIDER = register(Provider(
    name="attention_cluster", title="fused attention (key-split cluster kernel)",
    kernel_prefix=vendor_abi.family(CLUSTER_SDPA, CLUSTER_SDPA_BIAS),
    matchers={"relax.matmul": functools.partial(attention_chain, kernels=(CLUSTER_SDPA, CLUSTER_SDPA_BIAS),
                                                dtypes=_FP32)},
    dtypes=_FP32, layouts=("row-major",)))
