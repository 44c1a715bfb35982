"""The same per-head computation on adjacent parts of a merged projection, done once over all their heads.

After :mod:`.merge_siblings` a Llama-style layer's Q, K and V are one GEMM and a split of its columns; q and k each go
on as ``reshape`` to [B, S, heads, D], ``permute_dims`` to [B, heads, S, D] and the same rotary embedding (slices of
the head dimension, a negation, a concat, products with the cos / sin tables, a sum): two kernels of the same code,
one over 14 heads and one over 2. :func:`merge_heads` gives such adjacent split parts one part, and their chains one
chain over all the heads, whose result a split along the heads gives back: one kernel a layer fewer, and the fused
attention reads q and k from it through that split as it read them from the two kernels.

Two parts' chains are merged where they are the same computation for every head: the same operators with the same
attributes in the same order, each reading the chain's own values or the same operand (a var, or constants equal in
value) that holds nothing per head (rank 2 or less, or size 1 along the heads), and no operator acting along the heads
(a slice or concat of axis 1). Each chain's intermediates are read inside it alone, and its result is read only after
both chains are computed. A decode step's chains (one row a head) are left apart: the decode attention call rotates
q and the new key itself (``attention_rope``, :mod:`.cache_in_attention`), which leaves no kernel to merge.
"""
from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .providers.chains import Chains, Substitute, const_value, ints, known_shape, operator_of, rewrite_dataflow_blocks

#: operators a per-head chain may hold: element-wise ones, and slices / concats off the head axis
_PER_HEAD = frozenset(f"relax.{n}" for n in ("add", "subtract", "multiply", "negative", "astype", "strided_slice",
                                               "concat"))


def _tensor(x) -> bool:
    """Whether operand ``x`` is a tensor (a var or a constant tensor), not a literal (a slice's bounds)."""
    return isinstance(x, relax.Var) or (isinstance(x, tvm.ir.expr.Constant) and hasattr(x, "data"))


def _args(value) -> list:
    """The operands of a chain's binding (a concat's tuple fields spread)."""
    out = []
    for a in value.args:
        out += list(a.fields) if isinstance(a, relax.Tuple) else [a]
    return out


def _off_heads(value) -> bool:
    """Whether a chain operator leaves the head axis (axis 1 of [B, heads, S, D]) alone."""
    op = operator_of(value)
    if op == "relax.strided_slice":
        return all(a % 4 != 1 for a in ints(value.args[1].values if hasattr(value.args[1], "values") else value.args[1]))
    if op == "relax.concat":
        return int(value.attrs.axis) % 4 != 1
    return True


def _per_head_operand(chains: Chains, x) -> bool:
    """Whether ``x`` (read by a chain over [B, heads, S, D]) holds nothing per head: rank 2 or less, or size 1 along
    the heads."""
    shape = known_shape(x)
    return shape is not None and (len(shape) <= 2 or (len(shape) <= 4 and ([1] * (4 - len(shape)) + list(shape))[1] == 1))


class _Chain:
    """One split part's per-head chain: the part (a split item), its reshape to heads and permute, the bindings after
    (in block order), their result."""

    def __init__(self, item, reshape, permute, body: list, result):
        self.item, self.reshape, self.permute, self.body, self.result = item, reshape, permute, body, result


def _users(block) -> dict:
    """var -> the bindings of ``block`` that read it, once per operand (a concat's fields included)."""
    users: dict = {}
    for b in block.bindings:
        value = b.value
        operands = _args(value) if isinstance(value, relax.Call) else [getattr(value, "tuple_value", None)]
        for a in operands:
            if isinstance(a, relax.Var):
                users.setdefault(a, []).append(b.var)
    return users


def _chain(chains: Chains, users: dict, item, order: dict) -> _Chain | None:
    """The per-head chain of split item ``item``, or None (see the module docstring)."""
    def only_use(var):
        readers = users.get(var, [])
        return readers[0] if chains.uses.get(var, 0) == 1 and len(readers) == 1 else None

    reshape = only_use(item)
    shape = known_shape(reshape) if reshape is not None else None
    if operator_of(chains.value.get(reshape)) != "relax.reshape" or shape is None or len(shape) != 4:
        return None
    permute = only_use(reshape)
    pv = chains.value.get(permute)
    if operator_of(pv) != "relax.permute_dims" or pv.attrs.axes is None or ints(pv.attrs.axes) != [0, 2, 1, 3]:
        return None
    if shape[1] == 1:  # one row a head (a decode step): its attention call takes q's and k's rotary in apart
        return None
    members, frontier = {permute}, [permute]
    while frontier:  # everything the permuted heads flow into through per-head operators
        for user in users.get(frontier.pop(), []):
            if user not in members and operator_of(chains.value.get(user)) in _PER_HEAD:
                members.add(user)
                frontier.append(user)
    body = sorted(members - {permute}, key=order.__getitem__)
    outside = [v for v in members if chains.uses.get(v, 0) != sum(c in members for c in users.get(v, []))]
    if len(outside) != 1 or outside[0] is permute or not body:
        return None
    for v in body:
        value = chains.value[v]
        if not _off_heads(value) or not all(a in members or _per_head_operand(chains, a) for a in _args(value)
                                              if _tensor(a)):
            return None
    return _Chain(item, reshape, permute, body, outside[0])


def _same_operand(chains: Chains, a, b) -> bool:
    if isinstance(a, relax.Var) or isinstance(b, relax.Var):
        if a.same_as(b):
            return True
    ca, cb = const_value(chains.value, a), const_value(chains.value, b)
    return ca is not None and cb is not None and ca.shape == cb.shape and ca.dtype == cb.dtype and np.array_equal(ca, cb)


def _alike(chains: Chains, x: _Chain, y: _Chain) -> bool:
    """Whether ``y`` computes, per head, what ``x`` does (the module docstring's rule)."""
    if len(x.body) != len(y.body) or known_shape(x.permute)[3] != known_shape(y.permute)[3]:
        return False
    pos = {v: i for i, v in enumerate([x.permute] + x.body)}
    ypos = {v: i for i, v in enumerate([y.permute] + y.body)}
    if pos[x.result] != ypos[y.result]:
        return False
    for vx, vy in zip(x.body, y.body):
        a, b = chains.value[vx], chains.value[vy]
        if operator_of(a) != operator_of(b) or not tvm_ffi.structural_equal(a.attrs, b.attrs):
            return False
        ax, by = _args(a), _args(b)
        if len(ax) != len(by):
            return False
        for p, q in zip(ax, by):
            if p in pos or q in ypos:
                if pos.get(p, -1) != ypos.get(q, -2):
                    return False
            elif _tensor(p):
                if not _same_operand(chains, p, q):
                    return False
            elif not tvm_ffi.structural_equal(p, q):  # a literal (a slice's bounds)
                return False
    return True


def merge_heads(func: relax.Function) -> tuple[relax.Function, int]:
    """``func`` with each pair of adjacent split parts whose per-head chains are alike computed as one part and one
    chain (see the module docstring), and how many pairs it merged."""
    return rewrite_dataflow_blocks(func, _merge_block)


def _merge_block(block, uses) -> tuple:
    chains, users = Chains(block, uses), _users(block)
    order = {b.var: i for i, b in enumerate(block.bindings)}
    items: dict = {}  # split var -> {index: item var}
    for b in block.bindings:
        if isinstance(b.value, relax.TupleGetItem) and isinstance(b.value.tuple_value, relax.Var):
            items.setdefault(b.value.tuple_value, {})[int(b.value.index)] = b.var
    plans = []  # (split var, index i, chain i, chain i + 1)
    for sp, by_index in items.items():
        value = chains.value.get(sp)
        shape = known_shape(by_index[0]) if 0 in by_index else None
        if operator_of(value) != "relax.split" or shape is None or int(value.attrs.axis) % len(shape) != len(shape) - 1:
            continue
        if isinstance(value.attrs.indices_or_sections, (int, tvm.tirx.IntImm)):
            continue  # equal sections: left as they are
        i = 0
        n = len(ints(value.attrs.indices_or_sections)) + 1
        while i + 1 < n:
            x = _chain(chains, users, by_index[i], order) if i in by_index else None
            y = _chain(chains, users, by_index[i + 1], order) if i + 1 in by_index else None
            if x is not None and y is not None and _alike(chains, x, y) and \
                    all(order[u] > order[y.result] for u in users.get(x.result, [])):
                plans.append((sp, i, x, y))
                i += 2
            else:
                i += 1
    if not plans:
        return block, 0
    return _rewrite(block, chains, plans), len(plans)


def _rewrite(block, chains: Chains, plans: list):
    """``block`` with each planned pair merged: its split gets one part for both (the items after it renumbered),
    the merged chain is emitted where the second chain's result was, and each chain's result is an item of a split
    of the merged result along the heads."""
    drop, at_split, at_result, renumber = set(), {}, {}, {}
    for sp, i, x, y in plans:
        drop |= {x.item, y.item, x.reshape, y.reshape, x.permute, y.permute, *x.body, *y.body}
        at_split.setdefault(sp, []).append(i)
        at_result[y.result] = (sp, i, x, y)
    bindings, fresh = [], {}
    for b in block.bindings:
        if b.var in at_split:
            value = chains.value[b.var]
            cuts = ints(value.attrs.indices_or_sections)
            merged = sorted(at_split[b.var])
            keep = [c for j, c in enumerate(cuts) if j not in merged]  # cut j separates part j from part j + 1
            call = relax.op.split(value.args[0], keep, axis=int(value.attrs.axis))
            new_split = relax.DataflowVar(b.var.name, relax.BlockBuilder().normalize(call).ty)
            bindings.append(relax.VarBinding(new_split, call))
            fresh[b.var] = new_split
            renumber[b.var] = lambda j, m=merged: j - sum(1 for k in m if k < j)
            continue
        if isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value in fresh and b.var not in drop:
            sp = b.value.tuple_value
            bindings.append(relax.VarBinding(b.var, relax.TupleGetItem(fresh[sp], renumber[sp](int(b.value.index)))))
            continue
        if b.var in at_result:
            sp, i, x, y = at_result.pop(b.var)
            bindings += _merged_chain(chains, fresh[sp], renumber[sp](i), x, y)
            continue
        if b.var not in drop:
            bindings.append(b)
    return relax.DataflowBlock(bindings)


def _merged_chain(chains: Chains, split, index: int, x: _Chain, y: _Chain) -> list:
    """The bindings of ``x``'s chain over the heads of both parts (``split``'s item ``index``), then the split of its
    result back into ``x``'s and ``y``'s results."""
    bb = relax.BlockBuilder()

    def bind(name, expr):
        var = relax.DataflowVar(name, bb.normalize(expr).ty)
        out.append(relax.VarBinding(var, expr))
        return var

    out: list = []
    xs, ys = known_shape(x.reshape), known_shape(y.reshape)
    heads = xs[2] + ys[2]
    part = bind(f"{x.item.name}_heads", relax.TupleGetItem(split, index))
    shaped = bind(f"{x.reshape.name}_heads", relax.op.reshape(part, [xs[0], xs[1], heads, xs[3]]))
    mapping = {x.permute: bind(f"{x.permute.name}_heads", relax.op.permute_dims(shaped, [0, 2, 1, 3]))}
    for v in x.body:
        mapping[v] = bind(f"{v.name}_heads", Substitute(mapping).visit_expr(chains.value[v]))
    both = bind(f"{x.result.name}_heads_split", relax.op.split(mapping[x.result], [xs[2]], axis=1))
    out.append(relax.VarBinding(x.result, relax.TupleGetItem(both, 0)))
    out.append(relax.VarBinding(y.result, relax.TupleGetItem(both, 1)))
    return out
