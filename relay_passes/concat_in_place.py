"""Concatenation without copies: each branch writes its output straight into its slice of the concat.

An Inception block ends in ``concat(branch_1, ..., branch_n)``. Stock TVM runs that as one more
kernel that copies every branch output again, and on a multi-stream schedule it is also the join
that every branch waits for. Where the slices are contiguous in memory (every axis before the
concat axis has extent 1: channels of an NCHW tensor at batch 1), the branch kernels can write into
the concatenated buffer directly and the copy disappears, as TensorRT does. The rewrite works on the
lowered function (after ``CallTIRRewrite``, before stream assignment)::

    o = R.builtin.alloc_tensor(...)            # moved up, before the first branch's buffer
    a1 = nimble.slice_view(o, 0, shape_1)      # was R.builtin.alloc_tensor(shape_1)
    branch_1(..., a1)
    a2 = nimble.slice_view(o, bytes_1, shape_2)
    branch_2(..., a2)
    # concatenate(a1, a2, o) is gone: a reader of o now depends on branch_1 and branch_2

A concat is rewritten only when every input is a buffer of its own (an allocation of this function,
not an input, a constant, an output or a slice of another concat), each slice starts on a
:data:`SLICE_ALIGN` boundary (TVM advances the data pointer only then), and no input is read after
the concat's output is dead (so TVM's own memory planner, which does not see the aliasing, never
reuses the output's storage while a slice is alive, when the Relax VM runs the function). Nested
concats (inception_v3's) compose: an inner concat's output becomes a slice of the outer one. Where
each input goes is read off the concat kernel (:mod:`.concat_kernel`), not from its parameter order.
"""
from __future__ import annotations

import bisect
import math
import re
from fractions import Fraction

import tvm
from tvm import relax

from tvm_nimble.contract.markers import SLICE_VIEW
from tvm_nimble.contract.plan import SLICE_ALIGN

from .concat_kernel import slice_starts, tiles_output
from .lowered_ir import op_name, static_shape

#: the PrimFuncs TVM's legalization names after ``relax.concat`` (unfused: a fused one carries more names)
_CONCAT = re.compile(r"(fused_)?concatenate\d*")
_ALLOC = "relax.builtin.alloc_tensor"


def concat_axis(inputs: list[tuple[int, ...]], out: tuple[int, ...]) -> int | None:
    """The axis along which ``inputs`` concatenate to ``out``, or None if they do not."""
    if len(inputs) < 2 or any(len(s) != len(out) for s in inputs):
        return None
    axes = [ax for ax in range(len(out))
            if sum(s[ax] for s in inputs) == out[ax]
            and all(s[d] == out[d] for s in inputs for d in range(len(out)) if d != ax)]
    return axes[0] if len(axes) == 1 else None


class _Block:
    """The bindings of one block, with what the rewrite needs to know about each variable.

    Each binding has an order key (a Fraction: its position at first) that a rewrite never renumbers: a
    rewrite replaces bindings, drops the concat and moves the output's allocation up between two keys,
    and updates the allocations and uses it touched. Positions recomputed from the whole block after
    every rewrite made densenet121's 58 nested concats cost O(concats x bindings) (seconds)."""

    def __init__(self, bindings, returned: set):
        self.at = {Fraction(i): b for i, b in enumerate(bindings)}  # order key -> binding
        self.keys = sorted(self.at)
        self.returned = returned
        self.alias = {}  # var bound to another var (or to a field of a tuple of vars) -> that var
        self._allocs = {}  # var -> key of its allocation
        self._uses = {}  # root var -> keys of the calls that use it (or an alias of it)
        tuples = {}
        for b in bindings:
            v = b.value
            if isinstance(v, relax.Var):
                self.alias[b.var] = v
            elif isinstance(v, relax.Tuple):
                tuples[b.var] = v.fields
            elif isinstance(v, relax.TupleGetItem) and v.tuple_value in tuples:
                field = tuples[v.tuple_value][v.index]
                if isinstance(field, relax.Var):
                    self.alias[b.var] = field
        for k in self.keys:
            self._index(k, self.at[k], add=True)

    def root(self, var):
        while var in self.alias:
            var = self.alias[var]
        return var

    def _index(self, key, b, add: bool) -> None:
        if not isinstance(b.value, relax.Call):
            return
        if op_name(b.value) == _ALLOC:
            if add:
                self._allocs.setdefault(b.var, key)
            elif self._allocs.get(b.var) == key:
                del self._allocs[b.var]
        for a in b.value.args:
            if isinstance(a, relax.Var):
                uses = self._uses.setdefault(self.root(a), set())
                uses.add(key) if add else uses.discard(key)

    def bindings(self) -> list:
        return [self.at[k] for k in self.keys]

    def replace(self, key, binding) -> None:
        self._index(key, self.at[key], add=False)
        self.at[key] = binding
        self._index(key, binding, add=True)

    def remove(self, key) -> None:
        self._index(key, self.at.pop(key), add=False)
        del self.keys[bisect.bisect_left(self.keys, key)]

    def move_before(self, key, before) -> None:
        """Move the binding at ``key`` to just before the one at ``before``."""
        b = self.at[key]
        self.remove(key)
        i = bisect.bisect_left(self.keys, before)
        new = (self.keys[i - 1] + before) / 2 if i else before - 1
        self.at[new] = b
        self.keys.insert(i, new)
        self._index(new, b, add=True)

    def index_of_alloc(self, var):
        """The key of ``var``'s allocation, or None."""
        return self._allocs.get(var)

    def last_use(self, root, skip) -> Fraction:
        """Key of the last binding other than ``skip`` that uses ``root`` (or an alias of it); -1 if none."""
        return max((k for k in self._uses.get(root, ()) if k != skip), default=Fraction(-1))

    def returns(self, root) -> bool:
        return any(self.root(v).same_as(root) for v in self.returned)


def _slice_binding(var, base, offset: int) -> relax.VarBinding:
    shape, dtype = static_shape(var.ty, f"tensor '{var.name}'")
    call = relax.Call(relax.ExternFunc(SLICE_VIEW),
                      [base, relax.prim_value(tvm.tirx.IntImm("int64", offset)), relax.ShapeExpr(list(shape)),
                       tvm.ir.StringImm(dtype)], ty_args=[var.ty])
    return relax.VarBinding(var, call)


def _try_rewrite(block: _Block, pos: Fraction, prim_funcs: dict) -> bool:
    """Rewrite the concat at order key ``pos`` in place if it qualifies; return whether it did."""
    call = block.at[pos].value
    if not (isinstance(call, relax.Call) and isinstance(call.op, relax.GlobalVar)
            and call.op.name_hint in prim_funcs and _CONCAT.fullmatch(call.op.name_hint)):
        return False
    args = [block.root(a) if isinstance(a, relax.Var) else None for a in call.args]
    if any(a is None for a in args):
        return False
    *inputs, out = args
    if any(a.same_as(b) for i, a in enumerate(args) for b in args[i + 1:]):
        return False
    shapes = [static_shape(a.ty, a.name) for a in args]
    if len({dtype for _, dtype in shapes}) != 1:
        return False
    axis = concat_axis([s for s, _ in shapes[:-1]], shapes[-1][0])
    if axis is None or math.prod(shapes[-1][0][:axis]) != 1:
        return False
    # the kernel's parameters need not be in concatenation order: read each one's slice off the kernel
    starts = slice_starts(prim_funcs[call.op.name_hint], [s for s, _ in shapes[:-1]])
    sizes = [math.prod(s) for s, _ in shapes[:-1]]
    if starts is None or not tiles_output(starts, sizes, math.prod(shapes[-1][0])):
        return False
    out_at = block.index_of_alloc(out)
    in_at = [block.index_of_alloc(a) for a in inputs]
    if out_at is None or any(i is None for i in in_at) or any(block.returns(a) for a in inputs):
        return False
    bits = tvm.runtime.DataType(shapes[0][1]).bits
    offsets = [start * bits // 8 for start in starts]
    if any(o % SLICE_ALIGN for o in offsets):
        return False
    if max(block.last_use(a, pos) for a in inputs) > block.last_use(out, pos) and not block.returns(out):
        return False
    for a, at, off in zip(inputs, in_at, offsets):
        block.replace(at, _slice_binding(a, out, off))
    block.remove(pos)
    first = min(in_at)
    if out_at > first:  # the output's buffer must exist before the first slice of it
        block.move_before(out_at, first)
    return True


def concat_in_place(func: relax.Function, prim_funcs: dict) -> tuple[relax.Function, int]:
    """(``func`` with every qualifying concat built in place, how many were)."""
    body = func.body
    returned = {body.body} if isinstance(body.body, relax.Var) else set(getattr(body.body, "fields", []))
    returned = {v for v in returned if isinstance(v, relax.Var)}
    blocks, count = [], 0
    for blk in body.blocks:
        block = _Block(blk.bindings, returned)
        pos = 0
        while pos < len(block.keys):
            if _try_rewrite(block, block.keys[pos], prim_funcs):
                count += 1  # the binding list changed around pos; rescan from the start
                pos = 0
            else:
                pos += 1
        blocks.append(relax.BindingBlock(block.bindings()))
    if not count:
        return func, 0
    new = relax.Function(func.params, relax.SeqExpr(blocks, body.body), func.ret_ty, func.is_pure, func.attrs,
                         func.span)
    return new, count


def flatten_concats(func: relax.Function) -> relax.Function:
    """``concat((concat((a, b), k), c), k)`` -> ``concat((a, b, c), k)`` where the inner concat has no
    other reader. Run before fusion: TVM fuses nested concats into one kernel whose parameter order
    need not be the concatenation order, which :func:`concat_in_place` cannot then rewrite safely; a
    flat concat legalizes to one ``concatenate`` kernel whose inputs are in order."""
    uses: dict = {}

    def count(expr):
        if isinstance(expr, relax.Var):
            uses[expr] = uses.get(expr, 0) + 1

    relax.analysis.post_order_visit(func.body, count)
    bound = {}  # var -> (fields, axis) of the flat concat it is bound to
    blocks = []
    for blk in func.body.blocks:
        bindings = []
        for b in blk.bindings:
            v = b.value
            if (isinstance(b, relax.VarBinding) and isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
                    and v.op.name == "relax.concat" and isinstance(v.args[0], relax.Tuple)):
                axis = int(v.attrs.axis)
                fields = []
                for f in v.args[0].fields:
                    inner = bound.get(f)
                    fields += inner[0] if inner is not None and inner[1] == axis and uses.get(f) == 1 else [f]
                bound[b.var] = (fields, axis)
                if len(fields) != len(v.args[0].fields):
                    b = relax.VarBinding(b.var, relax.op.concat(relax.Tuple(fields), axis=axis))
            bindings.append(b)
        blocks.append(type(blk)(bindings))
    new = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                         func.attrs, func.span)
    return relax.analysis.remove_all_unused(new)


def FlattenConcats(func_name: str = "main") -> tvm.transform.Pass:
    """Module pass: :func:`flatten_concats` on ``func_name`` (before legalization and fusion)."""

    @tvm.transform.module_pass(opt_level=0, name="nimble.FlattenConcats")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = mod.clone()
        mod[func_name] = flatten_concats(mod[func_name])
        return relax.transform.Normalize()(mod)

    return _pass


ATTR_CONCATS_IN_PLACE = "nimble_concats_in_place"


def ConcatInPlace(func_name: str = "main") -> tvm.transform.Pass:
    """Module pass: :func:`concat_in_place` on ``func_name``; the count goes to its attribute
    ``nimble_concats_in_place``."""

    @tvm.transform.module_pass(opt_level=0, name="nimble.ConcatInPlace")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        prim_funcs = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
        func, count = concat_in_place(mod[func_name], prim_funcs)
        mod = mod.clone()
        mod[func_name] = func.with_attr(ATTR_CONCATS_IN_PLACE, count)
        return mod

    return _pass
