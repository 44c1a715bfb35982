"""A decoder's causal + padding mask handed to cuDNN in two parts: the padding as one row of keys, the causal part
as cuDNN's own mask.

transformers' decoders export one additive mask plane, ``where(causal & padding, 0, finfo(float32).min)`` of
[B, 1, S, S], which the attention adds to every head's scores. :func:`.providers.attention.masks_later_keys` proves
such a plane causal whatever the inputs, and cuDNN's SDPA then takes its causal mask on top of it
(``cudnn_bias_causal_sdpa``: the tiles above the diagonal skipped), but still reads the whole plane, S² floats for
each head. :func:`key_mask_in_attention` (provider ``cudnn_key_mask``) computes the padding part alone,
``where(padding, 0, min)`` of [B, 1, 1, S], once for all the calls that read the plane, and calls
``cudnn_key_causal_sdpa``, whose causal mask is part of the call and which reads the padding as one row of keys
broadcast over the queries. A query that sees a key gets the same scores; one that sees none (left padding) averages
the keys up to it, as cuDNN's causal mask on top of the plane already made it do. The plane's kernel goes where no
other operator reads it. It runs after the offload, on the calls the kernel choice kept. :func:`causal_parts`, the
proof that a mask is such a plane, is here too: the attention provider's ``masks_later_keys`` asks it.
"""
from __future__ import annotations

import numpy as np
from tvm import relax

from tvm_nimble.contract import vendor_abi

from .cache_in_attention import extern_name, rewrite_pass
from .providers.chains import Chains, dtype_of, ints, known_shape, operator_of, rewrite_dataflow_blocks

TAKES = vendor_abi.ATTENTION_CUDNN_BIAS_CAUSAL_SDPA
KEY_CAUSAL = vendor_abi.ATTENTION_CUDNN_KEY_CAUSAL_SDPA
#: the attrs' mask strides (b, h, q, k): codegen/vendor/sdpa_args.h
_MASK = slice(21, 25)

#: what a mask's value passes through between the model's boolean mask and the attention (views of the same [Sq, Sk]
#: plane, casts): a walk through them keeps which keys each query may see
_MASK_VIEWS = ("relax.astype", "relax.broadcast_to", "relax.reshape", "relax.expand_dims")
#: a mask value this far below any score masks its key (transformers' exports use finfo(float32).min)
_MASKED = -1e4


def _through_views(chains, expr, plane: tuple):
    """``expr``'s value, through :data:`_MASK_VIEWS` whose result keeps ``plane`` ([Sq, Sk]) as its last two dims."""
    for _ in range(16):
        value = chains.value.get(expr, expr) if isinstance(expr, relax.Var) else expr
        shape = known_shape(value)
        if operator_of(value) not in _MASK_VIEWS or shape is None or tuple(shape[-2:]) != plane:
            return value
        expr = value.args[0]
    return None


def causal_parts(chains, bias, Sq: int, Sk: int):
    """(the value the mask gives a masked key, the and's other operand) where the additive mask ``bias`` masks every key
    after its query whatever the inputs (:func:`.providers.attention.masks_later_keys`); else None. The other operand
    is what the causal constant is and-ed with: a decoder's padding mask."""
    plane = (Sq, Sk)
    if Sq != Sk or Sq < 2:
        return None  # (a step with a past: its keys are not aligned with its queries from the top left)
    where = _through_views(chains, bias, plane)
    if operator_of(where) != "relax.where":
        return None
    cond, keep, drop = where.args
    keep, drop = chains.const(keep), chains.const(drop)
    if keep is None or drop is None or keep.size == 0 or np.any(keep != 0) or not np.all(drop <= _MASKED):
        return None
    both = _through_views(chains, cond, plane)
    if operator_of(both) != "relax.logical_and":
        return None
    later = np.triu(np.ones(plane, bool), k=1)
    for i, operand in enumerate(both.args):
        c = chains.const(operand)
        if c is not None and c.ndim >= 2 and tuple(c.shape[-2:]) == plane and not np.any(c[..., later]):
            return float(np.max(drop)), both.args[1 - i]
    return None


def _key_rows(chains: Chains, bias, attrs: list[int]):
    """(the bindings that compute ``bias``'s padding part as [Bm, Hm, 1, Sk] rows of keys, their var, its mask strides)
    where ``bias`` is a causal + padding plane whose padding is broadcast over the query rows; else None."""
    B, H, Sq, Sk = attrs[:4]
    parts = causal_parts(chains, bias, Sq, Sk)
    if parts is None:
        return None
    drop, keys = parts
    shape = known_shape(keys)
    if shape is None or not shape or shape[-1] != Sk or (len(shape) > 1 and shape[-2] != 1) \
            or any(d != 1 for d in shape[:-4]) or dtype_of(keys) != "bool":
        return None
    xb, xh = ([1, 1] + list(shape[:-2]))[-2:]
    if xb not in (1, B) or xh not in (1, H):
        return None
    rows, dtype = [xb, xh, 1, Sk], dtype_of(bias)
    cond = relax.DataflowVar(f"{bias.name}_keys_kept", relax.TensorType(rows, "bool"))
    mask = relax.DataflowVar(f"{bias.name}_keys", relax.TensorType(rows, dtype))
    bindings = [relax.VarBinding(cond, relax.op.reshape(keys, rows)),
                relax.VarBinding(mask, relax.op.where(cond, relax.const(0.0, dtype), relax.const(drop, dtype)))]
    return bindings, mask, [xh * Sk if xb > 1 else 0, Sk if xh > 1 else 0, 0, 1]


def key_mask_in_attention(func: relax.Function, _mod=None) -> tuple[relax.Function, int]:
    """``func`` with each ``cudnn_bias_causal_sdpa`` call whose mask is a causal + padding plane (padding broadcast
    over the query rows) as a ``cudnn_key_causal_sdpa`` call reading the padding as rows of keys, computed once per
    plane (see the module docstring), and how many it made."""
    return rewrite_dataflow_blocks(func, _key_rows_block)


def _key_rows_block(block, uses) -> tuple:
    """One dataflow block of :func:`key_mask_in_attention` and how many calls it rewrote."""
    chains = Chains(block, uses)
    keyed: dict = {}  # a plane -> (its rows' var, their strides), or None where it has no padding part to split
    bindings, made = [], 0
    for b in block.bindings:
        value = b.value
        if extern_name(value) == TAKES:
            q, k, v, bias, attrs = value.args[1].fields
            a = ints(attrs.values)
            if bias not in keyed:
                found = _key_rows(chains, bias, a)
                keyed[bias] = None if found is None else found[1:]
                bindings += found[0] if found is not None else []
            if keyed[bias] is not None:
                mask, strides = keyed[bias]
                args = [q, k, v, mask, relax.ShapeExpr(a[:_MASK.start] + strides + a[_MASK.stop:])]
                call = relax.op.call_dps_packed(KEY_CAUSAL, relax.Tuple(args), list(value.ty.fields))
                bindings.append(relax.VarBinding(b.var, call))
                made += 1
                continue
        bindings.append(b)
    return relax.DataflowBlock(bindings), made


def KeyMaskInAttention():
    """Module pass: :func:`key_mask_in_attention` on every Relax function, then dead-code elimination (the planes no
    operator reads any more)."""
    return rewrite_pass(key_mask_in_attention, "nimble.KeyMaskInAttention")
