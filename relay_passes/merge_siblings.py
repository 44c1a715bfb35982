"""Horizontal fusion: sibling convolutions or GEMMs of one input become one operator, then a split.

Inception's 1x1 convolutions of one block input, or BERT's Q, K and V Linears of one hidden state, are
each a kernel too small to fill a GPU. Run side by side on streams they compete for it; merged (as IOS,
MLSys 2021, and TensorRT's horizontal fusion do) they are one larger kernel that reads the input once::

    a = relu(conv2d(x, Wa) + ba)             m = relu(conv2d(x, concat(Wa, Wb)) + concat(ba, bb))
    b = relu(conv2d(x, Wb) + bb)      ->     (a, b) = split(m, [Ca], axis=1)

Siblings are operators of one dataflow block reading the same tensor (after common subexpressions are
eliminated, so two ``relu(h)`` of one ``h`` are one input), with constant weights and the same
epilogue (a constant per-channel bias or none, then the same activation or none), each intermediate
used only inside its own chain:

- convolutions (NCHW / OIHW, ``groups == 1``) with the same strides, dilation and dtype whose padding
  centers their kernels alike: a smaller kernel is zero-padded to the largest (as IOS does) and the
  merged padding keeps every output's shape. Grouped convolutions are not merged: the merged output's
  parts would interleave by group, and reading one back would be a copy;
- GEMMs ``x @ W`` (W a constant [K, N], or the transpose of one [N, K]): the weights concatenate along N.

The weights are concatenated at build time (constants). The split is a ``relax.split`` here; where a
part is contiguous (channels of an NCHW tensor at batch 1), Nimble's lowering reads it as a slice of the
merged buffer, with no copy (:func:`split_views`, mirror image of :mod:`.concat_in_place`); a GEMM's
parts are strided along the last axis, and the fused attention provider reads q, k and v through them.

Whether a group is merged is the caller's choice (``select``): ``compiler/merge_choice.py`` measures it.
Every group found, and every sibling left out of one, is reported with the reason (:class:`MergeGroup`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from tvm_nimble.contract.markers import SLICE_VIEW
from tvm_nimble.contract.plan import SLICE_ALIGN

from .merge_heads import merge_heads
from .providers.chains import Chains, activation, ints, known_shape, operator_of, use_counts

_ACT_NAMES = {1: "relu", 2: "relu6"}


@dataclass
class Member:
    """One sibling: its chain's bindings (anchor first), the var holding its result, and its operator's
    parameters as the merged operator needs them."""

    anchor: relax.Var
    chain: list  # vars of the chain's bindings, anchor first, result last
    last: relax.Var
    weight: np.ndarray  # conv: OIHW; GEMM: [K, N]
    bias: np.ndarray | None
    act: relax.Call | None  # the activation binding's value (rebuilt on the merged tensor)
    padding: list[int] = field(default_factory=list)  # conv: [top, left, bottom, right]

    @property
    def channels(self) -> int:
        return int(self.weight.shape[0] if self.weight.ndim == 4 else self.weight.shape[1])


@dataclass
class MergeGroup:
    """Siblings of one input found by :func:`find_groups`. ``merged`` and ``why`` say what became of them
    (filled by the caller's choice); a group of one member is a sibling left out, ``why`` says which
    property kept it apart."""

    kind: str  # "conv2d" | "matmul"
    input: str
    members: list[Member]
    key: tuple
    merged: bool = False
    why: str = ""
    #: the concatenation the members are a consecutive run of (in member order, along the channels, used by
    #: nothing else): merged, the run becomes the merged output itself, and no split is needed
    into: relax.Var | None = None

    @property
    def name(self) -> str:
        return f"{self.kind} x{len(self.members)} of {self.input}"

    def describe(self) -> str:
        """``conv2d x3 of lv3: 1x1 (4+4+2 channels)``: explain's line for the group."""
        if self.kind == "conv2d":
            sizes = sorted({"x".join(str(d) for d in m.weight.shape[2:]) for m in self.members})
            shape = "/".join(sizes)
        else:
            shape = f"K={self.members[0].weight.shape[0]}"
        parts = "+".join(str(m.channels) for m in self.members)
        return f"{self.name}: {shape} ({parts} outputs)"

    def to_info(self) -> dict:
        return {"group": self.describe(), "merged": self.merged, "why": self.why}


def _conv_member(chains: Chains, var, call) -> tuple[tuple, Member] | None:
    a = call.attrs
    if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return None
    weight = chains.const(call.args[1])
    out = known_shape(call)
    if weight is None or out is None or weight.ndim != 4:
        return None
    strides, dil, pad, groups = ints(a.strides), ints(a.dilation), ints(a.padding), int(a.groups)
    if len(pad) == 2:
        pad = pad * 2
    kh, kw = weight.shape[2:]
    # where the kernel's center falls relative to the padded input (doubled: an integer for every size):
    # siblings with the same centers keep their output shapes when padded to one kernel size
    centers = (2 * pad[0] - dil[0] * (kh - 1), 2 * pad[1] - dil[1] * (kw - 1),
               2 * pad[2] - dil[0] * (kh - 1), 2 * pad[3] - dil[1] * (kw - 1))
    chain, last, bias, act = _epilogue(chains, var, out, axis=1)
    key = ("conv2d", str(call.ty.dtype), str(a.out_dtype), ("strides", tuple(strides)), ("dilation", tuple(dil)),
           ("groups", groups), ("padding", centers), ("bias", bias is not None),
           ("epilogue", _act_name(act)), ("spatial", tuple(out[2:])))
    return key, Member(var, chain, last, weight, bias, act, pad)


def _gemm_member(chains: Chains, var, call) -> tuple[tuple, Member] | None:
    x, w = call.args
    weight = chains.const(w)
    if weight is None and isinstance(w, relax.Var) and operator_of(chains.value.get(w)) == "relax.permute_dims":
        inner = chains.value[w]
        t = chains.const(inner.args[0])
        if t is not None and t.ndim == 2 and (inner.attrs.axes is None or ints(inner.attrs.axes) == [1, 0]):
            weight = t.T
    out = known_shape(call)
    if weight is None or weight.ndim != 2 or out is None or known_shape(x) is None or len(known_shape(x)) < 2:
        return None
    chain, last, bias, act = _epilogue(chains, var, out, axis=-1)
    key = ("matmul", str(call.ty.dtype), str(call.attrs.out_dtype), ("rows", tuple(out[:-1])),
           ("bias", bias is not None), ("epilogue", _act_name(act)))
    return key, Member(var, chain, last, np.ascontiguousarray(weight), bias, act)


def _act_name(act) -> str:
    return _ACT_NAMES.get(activation(act), "none") if act is not None else "none"


def _epilogue(chains: Chains, var, out_shape, axis: int):
    """(chain vars, result var, bias or None, activation call or None) after the anchor ``var``: a
    constant per-channel bias add, then a ReLU / ReLU6, each taken only when it is the sole use."""
    chain, last, bias, act = [var], var, None, None
    nxt, val = chains.follow(last)
    b = chains.bias_of(val, last, out_shape, axis=axis) if val is not None else None
    if b is not None:
        bias, last = b, nxt
        chain.append(nxt)
        nxt, val = chains.follow(last)
    if val is not None and activation(val) is not None and val.args[0].same_as(last):
        act, last = val, nxt
        chain.append(nxt)
    return chain, last, bias, act


#: why a sibling whose result a concatenation takes stays apart: kept apart, it writes its slice of the
#: concatenation in place (``concat_in_place``); a part of a merged output cannot, so the concatenation
#: would become a copy of every branch again
_CONCATENATED = ("its result goes into a concatenation, which it writes in place when kept apart "
                 "(merged, the concatenation would copy every branch)")


def _concats(chains: Chains, block) -> dict:
    """concat var -> (its fields, its axis) for every ``concat`` of ``block`` (its tuple written inline or
    bound to a var)."""
    out = {}
    for b in block.bindings:
        if operator_of(b.value) == "relax.concat":
            fields = b.value.args[0]
            fields = chains.value.get(fields, fields) if isinstance(fields, relax.Var) else fields
            out[b.var] = (list(getattr(fields, "fields", [])), int(b.value.attrs.axis))
    return out


def _run_of(concat_fields, members: list, uses: dict):
    """(the concat var, the members in its order) when ``members`` are a consecutive run of one channel
    concatenation's fields, each used by it alone; else None."""
    lasts = {m.last: m for m in members}
    for var, (fields, axis) in concat_fields.items():
        at = [i for i, f in enumerate(fields) if isinstance(f, relax.Var) and f in lasts]
        if len(at) != len(members) or axis != 1 or at != list(range(at[0], at[0] + len(at))):
            continue
        if all(uses.get(m.last, 0) == 1 for m in members):
            return var, [lasts[fields[i]] for i in at]
    return None


def _differences(key: tuple, other: tuple) -> str:
    """What sets two siblings' keys apart, e.g. ``strides (2, 2) vs (1, 1)``."""
    diffs = [f"{a[0]} {a[1]} vs {b[1]}" for a, b in zip(key, other)
             if a != b and isinstance(a, tuple) and isinstance(b, tuple)]
    return ", ".join(diffs) or "dtype"


def find_groups(func: relax.Function) -> list[tuple[int, MergeGroup]]:
    """(block index, group) for every set of siblings of ``func``: groups of two or more that can merge,
    and, for each sibling that cannot join its input's largest group, a group of one saying why."""
    uses = use_counts(func)
    found = []
    for bi, block in enumerate(func.body.blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        chains = Chains(block, uses)
        concat_fields = _concats(chains, block)
        concatenated = {f for fields, _ in concat_fields.values() for f in fields if isinstance(f, relax.Var)}
        by_input: dict = {}  # (kind, input var) -> [(key, member)] in program order
        for b in block.bindings:
            op = operator_of(b.value)
            if op == "relax.nn.conv2d":
                m = _conv_member(chains, b.var, b.value)
            elif op == "relax.matmul":
                m = _gemm_member(chains, b.var, b.value)
            else:
                continue
            if m is not None and isinstance(b.value.args[0], relax.Var):
                by_input.setdefault((m[0][0], b.value.args[0]), []).append(m)
        for (kind, x), members in by_input.items():
            if len(members) < 2:
                continue
            keyed: dict = {}
            into: dict = {}  # key -> siblings of that key that a concatenation takes
            for key, m in members:
                (into if m.last in concatenated else keyed).setdefault(key, []).append(m)
            for key, ms in into.items():  # a run of one concatenation merges into it; the others stay apart
                run = _run_of(concat_fields, ms, uses) if len(ms) >= 2 and kind == "conv2d" else None
                if run is not None and dict(key[3:]).get("groups", 1) == 1:
                    found.append((bi, MergeGroup(kind, x.name, run[1], key, into=run[0])))
                else:
                    found += [(bi, MergeGroup(kind, x.name, [m], key, why=_CONCATENATED)) for m in ms]
            if not keyed:
                continue
            largest = max(keyed, key=lambda k: (dict(k[3:]).get("groups", 1) == 1, len(keyed[k])))
            for key, ms in keyed.items():
                groups = dict(key[3:]).get("groups", 1)
                if groups != 1:
                    found.append((bi, MergeGroup(kind, x.name, ms, key, why=(
                        f"grouped convolutions (groups {groups}): the merged output's parts would interleave "
                        "by group, and reading one back would be a copy"))))
                elif len(ms) >= 2:
                    found.append((bi, MergeGroup(kind, x.name, ms, key)))
                else:
                    found.append((bi, MergeGroup(kind, x.name, ms, key, why=(
                        "no sibling to merge with: differs in " + _differences(key, largest)))))
    return found


def _merged_conv(group: MergeGroup) -> tuple[list[np.ndarray], list[int]]:
    """(each member's weights zero-padded to the largest kernel, centered; the merged padding)."""
    members = group.members
    kh = max(m.weight.shape[2] for m in members)
    kw = max(m.weight.shape[3] for m in members)
    weights = []
    for m in members:
        h, w = m.weight.shape[2:]
        dh, dw = (kh - h) // 2, (kw - w) // 2  # (kh - h) is even for siblings of one key: same center
        weights.append(np.pad(m.weight, ((0, 0), (0, 0), (dh, kh - h - dh), (dw, kw - w - dw))))
    # siblings of one key center their kernels alike, so the largest kernel's padding is every one's,
    # grown by the rows and columns its kernel grew
    tall = next(m for m in members if m.weight.shape[2] == kh)
    wide = next(m for m in members if m.weight.shape[3] == kw)
    return weights, [tall.padding[0], wide.padding[1], tall.padding[2], wide.padding[3]]


def _rebuild_epilogue(group: MergeGroup, y, out_ty, axis: int, bindings: list, name: str):
    """The merged bias add and activation after ``y``; returns the var of the merged result."""
    members = group.members
    if members[0].bias is not None:
        bias = np.concatenate([m.bias for m in members]).astype(str(out_ty.dtype))
        shape = [1] * len(out_ty.shape.values)
        shape[axis] = bias.shape[0]
        v = relax.DataflowVar(f"{name}_bias", out_ty)
        bindings.append(relax.VarBinding(v, relax.op.add(y, relax.const(bias.reshape(shape)))))
        y = v
    act = members[0].act
    if act is not None:
        v = relax.DataflowVar(f"{name}_act", out_ty)
        bindings.append(relax.VarBinding(v, relax.Call(act.op, [y] + list(act.args[1:]), act.attrs)))
        y = v
    return y


def merged_bindings(group: MergeGroup, anchor_call, name: str) -> list:
    """The bindings that replace the group's chains: the merged operator, its epilogue, the split, and each
    member's result var bound to its part (for a group merging into a concatenation: up to the merged output,
    the last binding)."""
    members = group.members
    out_shape = list(known_shape(anchor_call))
    dtype = str(anchor_call.ty.dtype)
    axis = 1 if group.kind == "conv2d" else len(out_shape) - 1
    out_shape[axis] = sum(m.channels for m in members)
    out_ty = relax.TensorType(out_shape, dtype)
    x = anchor_call.args[0]
    wdtype = str(anchor_call.args[1].ty.dtype) if hasattr(anchor_call.args[1].ty, "dtype") else dtype
    bindings = []
    y = relax.DataflowVar(name, out_ty)
    if group.kind == "conv2d":
        weights, padding = _merged_conv(group)
        a = anchor_call.attrs
        w = relax.const(np.concatenate(weights).astype(wdtype))
        call = relax.op.nn.conv2d(x, w, strides=ints(a.strides), padding=padding, dilation=ints(a.dilation),
                                  groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW",
                                  out_dtype=a.out_dtype if str(a.out_dtype) not in ("", "void") else None)
    else:
        w = relax.const(np.concatenate([m.weight for m in members], axis=1).astype(wdtype))
        out_dtype = anchor_call.attrs.out_dtype
        call = relax.op.matmul(x, w, out_dtype=out_dtype if str(out_dtype) not in ("", "void") else None)
    bindings.append(relax.VarBinding(y, call))
    y = _rebuild_epilogue(group, y, out_ty, axis, bindings, name)
    if group.into is not None:  # the merged output is the run of the concatenation: merge_siblings puts it there
        return bindings
    bounds = list(np.cumsum([m.channels for m in members])[:-1])
    parts = []
    for m in members:
        shape = list(out_shape)
        shape[axis] = m.channels
        parts.append(relax.TensorType(shape, dtype))
    split = relax.DataflowVar(f"{name}_split", relax.TupleType(parts))
    bindings.append(relax.VarBinding(split, relax.op.split(y, [int(b) for b in bounds], axis=axis)))
    for i, m in enumerate(members):
        bindings.append(relax.VarBinding(m.last, relax.TupleGetItem(split, i)))
    return bindings


def _concat_with_runs(binding, groups: list[MergeGroup], value: dict, merged_output: dict):
    """The concatenation ``binding`` with each group's run of fields replaced by its merged output
    (``merged_output[id(group)]``; the merged output itself when one run was every field)."""
    tup = binding.value.args[0]
    fields = list((value.get(tup, tup) if isinstance(tup, relax.Var) else tup).fields)
    for group in groups:
        lasts = [m.last for m in group.members]
        start = next(i for i, f in enumerate(fields) if isinstance(f, relax.Var) and f.same_as(lasts[0]))
        fields[start:start + len(lasts)] = [merged_output[id(group)]]
    if len(fields) == 1:
        return relax.VarBinding(binding.var, merged_output[id(groups[0])])
    return relax.VarBinding(binding.var, relax.op.concat(relax.Tuple(fields), axis=int(binding.value.attrs.axis)))


def merge_siblings(func: relax.Function, select=None) -> tuple[relax.Function, list[MergeGroup]]:
    """(``func`` with the sibling groups that ``select(group) -> bool`` keeps merged (default: every one),
    every group found, each marked ``merged`` or not, with why)."""
    found = find_groups(func)
    for _, g in found:
        if len(g.members) >= 2 and not g.why:
            g.merged = True if select is None else bool(select(g))
            if g.merged and not g.why:
                g.why = "merged" if g.into is None else "merged into its concatenation (the run's channels, no copy)"
    chosen = [(bi, g) for bi, g in found if g.merged]
    if not chosen:
        return func, [g for _, g in found]
    blocks = []
    count = 0
    for bi, block in enumerate(func.body.blocks):
        mine = [g for b, g in chosen if b == bi]
        if not mine:
            blocks.append(block)
            continue
        value = {b.var: b.value for b in block.bindings}
        drop = {v for g in mine for m in g.members for v in m.chain}
        at = {g.members[0].anchor: g for g in mine}  # the merged chain goes where its first sibling was
        runs: dict = {}  # concat var -> the groups merging into it (Inception-v3's block concatenation takes two)
        for g in mine:
            if g.into is not None:
                runs.setdefault(g.into, []).append(g)
        drop |= {value[c].args[0] for c in runs if isinstance(value[c].args[0], relax.Var)}  # a tuple bound apart
        merged_output: dict = {}  # id(group) -> the var of its merged output
        bindings = []
        for b in block.bindings:
            if b.var in at:
                g = at[b.var]
                merged = merged_bindings(g, value[b.var], f"merged{count}")
                merged_output[id(g)] = merged[-1].var
                bindings += merged
                count += 1
            elif b.var in runs:  # after every sibling of its runs (it takes their results)
                bindings.append(_concat_with_runs(b, runs[b.var], value, merged_output))
            elif b.var not in drop:
                bindings.append(b)
        blocks.append(relax.DataflowBlock(bindings))
    new = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                         func.attrs, func.span)
    return new, [g for _, g in found]


def MergeSiblings(select=None, groups: list | None = None, func_name: str = "main") -> tvm.transform.Pass:
    """Module pass: common subexpressions eliminated (so siblings reading equal expressions read one
    value), then :func:`merge_siblings` on ``func_name`` and, where it merged, :func:`.merge_heads.merge_heads` on the
    parts; every group found is appended to ``groups``."""

    @tvm.transform.module_pass(opt_level=0, name="nimble.MergeSiblings")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = relax.transform.EliminateCommonSubexpr()(mod)
        func, found = merge_siblings(mod[func_name], select)
        if groups is not None:
            groups.extend(found)
        if func is mod[func_name]:
            return mod
        func, _ = merge_heads(func)  # the merged parts' alike per-head chains (q's and k's rotary) as one
        mod = mod.clone()
        mod[func_name] = func
        return relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))

    return _pass


# ---- the split without a copy, at lowering -----------------------------------------------------------

def _view_call(base, offset: int, ty) -> relax.Call:
    shape = [int(d) for d in ty.shape.values]
    return relax.op.call_pure_packed(
        SLICE_VIEW, base, relax.prim_value(tvm.tirx.IntImm("int64", offset)), relax.ShapeExpr(shape),
        tvm.ir.StringImm(str(ty.dtype)), ty_args=ty)


#: operators TVM fuses a strided slice into (injective and element-wise: the slice becomes part of the kernel's reads)
_FUSES_A_SLICE = frozenset(f"relax.{n}" for n in (
    "reshape", "permute_dims", "astype", "strided_slice", "squeeze", "expand_dims", "broadcast_to", "concat", "add",
    "subtract", "multiply", "divide", "negative", "exp", "sigmoid", "tanh", "nn.silu"))


def _readers(func: relax.Function) -> dict:
    """var -> the values of ``func``'s bindings that read it, once per read (a var the function returns: None)."""
    readers: dict = {}

    def reads(value):
        def visit(e):
            if isinstance(e, relax.Var):
                readers.setdefault(e, []).append(value)
        return visit

    for block in func.body.blocks:
        for b in block.bindings:
            relax.analysis.post_order_visit(b.value, reads(b.value))
    relax.analysis.post_order_visit(func.body.body, reads(None))
    return readers


def split_views(func: relax.Function) -> tuple[relax.Function, int]:
    """(``func`` with each ``split`` whose parts are contiguous and aligned read as slices of its input,
    how many splits are gone). A part of a split along axis ``a`` is contiguous when every axis before ``a`` has
    extent 1 (channels of an NCHW tensor at batch 1); each must start on a :data:`SLICE_ALIGN` byte
    boundary, as in :mod:`.concat_in_place`. The parts become ``nimble.slice_view`` calls, which the
    launch plan reads as views of the split's input: no kernel, and a reader of a part depends on the
    writer of the input.

    Any other split whose parts are read only by element-wise and injective operators (a merged Q/K/V GEMM's q and
    k, read by the rotary embedding; v read in place by the attention call, not through the split) becomes one
    strided slice a part read, which TVM fuses into each reader's kernel: no split kernel copying every part (one
    launch a decoder layer), and a part nobody reads is not copied at all."""
    items: dict = {}  # split var -> {index: item var}
    splits: dict = {}
    for block in func.body.blocks:
        for b in block.bindings:
            if operator_of(b.value) == "relax.split":
                splits[b.var] = b.value
            elif isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value in splits:
                items.setdefault(b.value.tuple_value, {})[int(b.value.index)] = b.var
    readers = _readers(func) if splits else {}
    views: dict = {}  # item var -> slice_view call, or the strided slice its readers fuse
    for var, call in splits.items():
        shape = known_shape(call.args[0])
        if shape is None or not isinstance(call.args[0], relax.Var):
            continue
        axis = int(call.attrs.axis) % len(shape)
        parts = var.ty.fields
        bounds, start = [], 0
        for p in parts:
            bounds.append((start, start + int(p.shape.values[axis])))
            start = bounds[-1][1]
        bits = tvm.runtime.DataType(str(parts[0].dtype)).bits
        inner = math.prod(shape[axis + 1:])
        if math.prod(shape[:axis]) == 1 and not any(b * inner * bits // 8 % SLICE_ALIGN for b, _ in bounds):
            for i, item in items.get(var, {}).items():
                views[item] = _view_call(call.args[0], bounds[i][0] * inner * bits // 8, parts[i])
        elif (len(readers.get(var, ())) == len(items.get(var, {})) and items.get(var)
              and all(operator_of(r) in _FUSES_A_SLICE for item in items[var].values()
                      for r in readers.get(item, [None]))):
            for i, item in items[var].items():
                views[item] = relax.op.strided_slice(call.args[0], [axis], [bounds[i][0]], [bounds[i][1]])
    if not views:
        return func, 0
    blocks = []
    for block in func.body.blocks:
        bindings = [relax.VarBinding(b.var, views[b.var]) if b.var in views else b for b in block.bindings]
        blocks.append(type(block)(bindings))
    new = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                         func.attrs, func.span)
    return relax.analysis.remove_all_unused(new), len({v for v in splits if v in items and
                                                       all(i in views for i in items[v].values())})


ATTR_SPLITS_AS_VIEWS = "nimble_splits_as_views"


def SplitViews(func_name: str = "main") -> tvm.transform.Pass:
    """Module pass: :func:`split_views` on ``func_name`` (before legalization); the count goes to its
    attribute ``nimble_splits_as_views``."""

    @tvm.transform.module_pass(opt_level=0, name="nimble.SplitViews")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        func, count = split_views(mod[func_name])
        mod = mod.clone()
        mod[func_name] = func.with_attr(ATTR_SPLITS_AS_VIEWS, count)
        return relax.transform.Normalize()(mod)

    return _pass
