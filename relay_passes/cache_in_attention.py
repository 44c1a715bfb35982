"""A decode step's KV cache write inside its attention call: one launch a layer less.

After :func:`.kv_cache.cache_step`, a decode step writes each layer's new key and value into the cache with a TIR
kernel (``kv_write``, in place) and the fused attention (``vendor_offload``'s ``nimble.attention.sdpa_bias`` /
``split_sdpa_bias``, one query row) then reads the whole cache. At batch 1 both are latency, not work: the write is
one more launch and one more dependency a layer (12 in GPT-2 small, 24 in a 0.5B decoder). :func:`CacheWriteInAttention`
replaces such a pair by one ``nimble.attention.append_sdpa_bias`` call, which writes the new key and value into the
caches and attends over them (the vendor ABI's ``IN_PLACE``: the plan keeps the caches as state, as it does for
``kv_write``'s). It runs after the offload, on what the kernel choice kept: it adds no candidate to measure (the
same kernel runs, with one launch less), and it takes only a write whose cache the attention alone reads.

:func:`RotaryInAttention` (provider ``attention_rope``) goes one step further on a Llama-style decoder: where the
append call's q and new key are the rotary embeddings of one position (``x * cos + rotate_half(x) * sin``, as the
export spells it and the precision pass widens it), the call reads them before the rotation and rotates them itself
(``append_rope_sdpa_bias``, the cos/sin tables as arguments): the two TVM kernels a layer that computed them go.
"""
from __future__ import annotations

import tvm
from tvm import relax

from tvm_nimble.contract import vendor_abi
from tvm_nimble.contract.markers import in_place_args

from .providers.chains import Substitute, ints, known_shape, operator_of, use_counts

#: the attention calls whose decode (one query row) the append call computes: those that run the decode kernel
TAKES = (vendor_abi.ATTENTION_SDPA_BIAS, vendor_abi.ATTENTION_SPLIT_SDPA_BIAS)
APPEND = vendor_abi.ATTENTION_APPEND_SDPA_BIAS
#: the attrs' entry of the query rows (Sq): codegen/vendor/sdpa_args.h
_SQ = 2


def extern_name(call) -> str | None:
    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_dps_packed":
        callee = call.args[0]
        if isinstance(callee, relax.ExternFunc):
            return str(callee.global_symbol)
    return None


class _Write:
    """One cache a ``kv_write`` call writes: the call's binding var, the cache (a parameter), the new values, the
    positions."""

    def __init__(self, call_var, cache, new, pos):
        self.call_var, self.cache, self.new, self.pos = call_var, cache, new, pos


def _write_of(var, bound: dict, mod: tvm.IRModule, params: set) -> _Write | None:
    """The cache write ``var`` (an attention's K or V operand) is the result of, or None: an item of (or the whole
    result of) a ``call_tir_inplace`` of a PrimFunc marked in place (``contract.markers.in_place_args``) over a
    parameter (the state)."""
    value, item = bound.get(var), None
    if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
        var, item = value.tuple_value, int(value.index)
        value = bound.get(var)
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.call_tir_inplace" and isinstance(value.args[0], relax.GlobalVar)):
        return None
    func = mod[value.args[0]]
    in_place = in_place_args(func) if isinstance(func, tvm.tirx.PrimFunc) else []
    if not in_place:
        return None
    args = list(value.args[1].fields)
    n = len(in_place)
    # kv_write's arguments: the n caches, their n new values, the positions (kv_cache.kv_write)
    if in_place != list(range(n)) or len(args) != 2 * n + 1 or (item is None) != (n == 1):
        return None
    i = 0 if item is None else item
    if args[i] not in params:
        return None
    return _Write(var, args[i], args[n + i], args[2 * n])


def _rewrite_bindings(func: relax.Function, replace) -> tuple[relax.Function, int]:
    """``func`` with each binding for which ``replace(binding, bound)`` (``bound``: its block's var -> value) gives
    a new binding replaced by it (a new var stands for the old one where it is read), and how many were replaced."""
    blocks, made, renamed = [], 0, {}
    for block in func.body.blocks:
        bound = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
        bindings = []
        for b in block.bindings:
            new = replace(b, bound)
            if new is not None:
                if not new.var.same_as(b.var):
                    renamed[b.var] = new.var
                bindings.append(new)
                made += 1
            else:
                bindings.append(b)
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    if not made:
        return func, 0
    body = relax.SeqExpr(blocks, func.body.body)
    body = Substitute(renamed).visit_expr(body) if renamed else body
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span), made


def cache_write_in_attention(func: relax.Function, mod: tvm.IRModule) -> tuple[relax.Function, int]:
    """``func`` with each decode attention over a cache ``kv_write`` wrote just before as one append call (see the
    module docstring), and how many it made."""
    params = set(func.params)
    uses = use_counts(func)

    def replace(b, bound):
        value = b.value
        if extern_name(value) not in TAKES:
            return None
        args = list(value.args[1].fields)
        attrs = args[-1]
        q, k, v, bias = args[:4]
        if not (isinstance(attrs, relax.ShapeExpr) and int(attrs.values[_SQ]) == 1):
            return None
        wk, wv = (_write_of(x, bound, mod, params) for x in (k, v))
        # the attention alone reads what the writes return (each write's result: its items, or itself)
        if wk is None or wv is None or not wk.pos.same_as(wv.pos) or uses.get(k) != 1 or uses.get(v) != 1 \
                or not _only_read_through(wk, wv, k, v, bound, uses):
            return None
        call = relax.op.call_dps_packed(
            APPEND, relax.Tuple([q, wk.cache, wv.cache, bias, wk.new, wv.new, wk.pos, attrs]), list(value.ty.fields))
        return relax.VarBinding(b.var, call)

    return _rewrite_bindings(func, replace)


def _only_read_through(wk: _Write, wv: _Write, k, v, bound: dict, uses: dict) -> bool:
    """Whether the writes' results are read by nothing but the attention's K and V operands: a write of both caches
    returns a tuple whose two items are ``k`` and ``v``; a write of one returns ``k`` (or ``v``) itself."""
    if wk.call_var.same_as(wv.call_var):  # one kernel wrote both: its tuple is read by the two items alone
        return uses.get(wk.call_var) == 2 and isinstance(bound.get(k), relax.TupleGetItem)
    return all(uses.get(w.call_var) == 1 for w in (wk, wv))


def rewrite_pass(rewrite, name: str) -> tvm.transform.Pass:
    """Module pass: ``rewrite(func, mod) -> (func, made)`` on every Relax function, then dead-code elimination (what
    the calls it made replaced)."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        changed = False
        mod = mod.clone()
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                new, made = rewrite(func, mod)
                if made:
                    mod[gv] = new
                    changed = True
        return relax.transform.DeadCodeElimination()(mod) if changed else mod

    return _pass


def CacheWriteInAttention() -> tvm.transform.Pass:
    """Module pass: :func:`cache_write_in_attention` on every Relax function, then dead-code elimination (the cache
    writes it replaced)."""
    return rewrite_pass(cache_write_in_attention, "nimble.CacheWriteInAttention")


# ---- the rotary embedding of q and the new key inside the append call -------------------------------------------
ROPE = vendor_abi.ATTENTION_APPEND_ROPE_SDPA_BIAS


def _widened(expr, bound: dict):
    """``expr`` with one float32 widening (the precision policy's ``astype``) looked through."""
    value = bound.get(expr)
    if operator_of(value) == "relax.astype" and str(value.attrs.dtype) == "float32":
        return value.args[0]
    return expr


def _expanded(expr, bound: dict):
    """The [B, S, D] float32 table ``expr`` is ``expand_dims(table, axis=1)`` of, or None."""
    value = bound.get(expr)
    if operator_of(value) == "relax.expand_dims" and ints(value.attrs.axis) == [1]:
        table = value.args[0]
        if isinstance(table, relax.Var) and str(table.ty.dtype) == "float32":
            return table
    return None


def _half_of(expr, bound: dict, x, first: bool) -> bool:
    """Whether ``expr`` is ``x[..., :D/2]`` (``first``) or ``x[..., D/2:]``, a strided slice of the last axis."""
    value = bound.get(expr)
    if operator_of(value) != "relax.strided_slice" or not value.args[0].same_as(x):
        return False
    d = known_shape(x)[-1]
    axes, begin, end = (ints(a.values if hasattr(a, "values") else a) for a in value.args[1:4])
    strides = ints(value.args[4].values if hasattr(value.args[4], "values") else value.args[4]) \
        if len(value.args) > 4 else [1]
    if axes not in ([3], [-1]) or strides != [1]:
        return False
    return (begin == [0] and end == [d // 2]) if first else (begin == [d // 2] and end[0] >= d)


def _rotated_half(expr, bound: dict, x) -> bool:
    """Whether ``expr`` is ``concat([-x[..., D/2:], x[..., :D/2]], axis=-1)`` (rotate_half)."""
    value = bound.get(expr)
    if operator_of(value) != "relax.concat" or len(value.args[0].fields) != 2 or int(value.attrs.axis) not in (3, -1):
        return False
    neg, first = value.args[0].fields
    neg_value = bound.get(neg)
    return (operator_of(neg_value) == "relax.negative" and _half_of(neg_value.args[0], bound, x, first=False)
            and _half_of(first, bound, x, first=True))


def rotary_of(expr, bound: dict):
    """(x, cos, sin) where ``expr`` is the rotary embedding of x ([B, H, 1, D]) as a Llama-style export computes it
    after the precision pass: ``astype(x * cos + rotate_half(x) * sin)`` in float32 (the casts absent in an fp32
    build), cos and sin ``expand_dims(table, 1)`` of float32 [B, 1, D] tables; else None."""
    value = bound.get(expr)
    if operator_of(value) == "relax.astype":
        value = bound.get(value.args[0])
    if operator_of(value) != "relax.add":
        return None
    terms = [bound.get(a) for a in value.args]
    if any(operator_of(t) != "relax.multiply" for t in terms):
        return None
    for direct, rotated in (terms, terms[::-1]):
        for xa, ca in (direct.args, direct.args[::-1]):
            x, cos = _widened(xa, bound), _expanded(ca, bound)
            shape = known_shape(x) if isinstance(x, relax.Var) else None
            if cos is None or shape is None or len(shape) != 4 or shape[2] != 1 or shape[3] % 2:
                continue
            for ra, sa in (rotated.args, rotated.args[::-1]):
                sin = _expanded(sa, bound)
                if sin is not None and _rotated_half(_widened(ra, bound), bound, x):
                    return x, cos, sin
    return None


def _rows(x, bound: dict):
    """What holds ``x`` ([B, H, 1, D]) as [B, H, D] contiguous rows without a kernel: the [B, 1, H, D] tensor a
    permute_dims of one position made it from (the same bytes), or ``x`` itself."""
    value = bound.get(x)
    if operator_of(value) == "relax.permute_dims" and value.attrs.axes is not None \
            and ints(value.attrs.axes) == [0, 2, 1, 3]:
        return value.args[0]
    return x


def rotary_in_attention(func: relax.Function) -> tuple[relax.Function, int]:
    """``func`` with each append call whose q and new key are rotary embeddings over the same cos/sin tables as one
    ``append_rope_sdpa_bias`` call reading them before the rotation, and how many it made."""

    def replace(b, bound):
        value = b.value
        if extern_name(value) != APPEND:
            return None
        q, kc, vc, bias, kn, vn, pos, attrs = value.args[1].fields
        a = ints(attrs.values)
        B, H, D = a[0], a[1], a[4]
        rq, rk = rotary_of(q, bound), rotary_of(kn, bound)
        contiguous_q = a[6] == 0 and a[7] == H * D and a[8] == D
        if rq is None or rk is None or not contiguous_q or not rq[1].same_as(rk[1]) or not rq[2].same_as(rk[2]) \
                or known_shape(rq[1]) != (B, 1, D):
            return None
        ws = relax.TensorType((B * H * D * 4 + 256,), "uint8")  # the rotated q where the decode kernel is not used
        out = value.ty.fields[0]
        call = relax.op.call_dps_packed(
            ROPE, relax.Tuple([_rows(rq[0], bound), kc, vc, bias, _rows(rk[0], bound), vn, pos, rq[1], rq[2], attrs]),
            [out, ws])
        # a var of the call's type (its workspace is larger), read where the append call's was
        return relax.VarBinding(relax.DataflowVar(b.var.name, relax.TupleType([out, ws])), call)

    return _rewrite_bindings(func, replace)


def RotaryInAttention() -> tvm.transform.Pass:
    """Module pass: :func:`rotary_in_attention` on every Relax function (after :func:`CacheWriteInAttention`), then
    dead-code elimination (the rotary kernels it replaced)."""
    return rewrite_pass(lambda func, _mod: rotary_in_attention(func), "nimble.RotaryInAttention")
