"""ONNX Clip as Relax operators, not opaque TIR calls.

TVM 0.27's ONNX importer writes ``Clip(x, lo, hi)`` (opset 11 and later: the bounds are inputs, as torch exports
ReLU6) as ``call_tir(maximum, (x, lo))`` then ``call_tir(minimum, (.., hi))``: TE functions that no Relax pass can
look into. Two things need the operator instead: the providers' matchers, which fuse ``clip(0, 6)`` into a
convolution's epilogue as ReLU6, and ``ConvertLayout``, which leaves a TIR call in the model's layout and so puts a
transpose on either side of every ReLU6 of a channels-last build (relay_passes/layout.py).

A ``maximum`` / ``minimum`` TE call with a one-element constant bound becomes ``relax.maximum`` /
``relax.minimum``, and ``minimum(maximum(x, lo), hi)`` with the inner one used once becomes ``relax.clip(x, lo,
hi)``. The same values: ``clip`` is ``min(max(x, lo), hi)``.
"""
from __future__ import annotations

import re

import tvm
import numpy as np
from tvm import relax
from tvm.ir.expr import Constant

_TE_NAME = re.compile(r"^(maximum|minimum)\d*$")
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _bound(expr) -> float | None:
    """The value of a one-element floating-point constant that is not NaN, else None."""
    if not isinstance(expr, Constant):
        return None
    value = expr.value.numpy()
    ok = value.size == 1 and value.dtype.kind == "f" and not np.isnan(value).any()
    return float(value.reshape(-1)[0]) if ok else None


def _constant(bound: dict, expr):
    """``expr`` as the constant it is: itself, or what the importer's NaN guard ``where(isnan(c), inf, c)`` of a
    constant ``c`` that is not NaN gives (``c``); else None."""
    value = bound.get(expr) if isinstance(expr, relax.Var) else expr
    if isinstance(value, Constant):
        return value
    if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.where":
        cond, c = value.args[0], value.args[2]
        cond = bound.get(cond, cond) if isinstance(cond, relax.Var) else cond
        if (isinstance(cond, relax.Call) and getattr(cond.op, "name", "") == "relax.isnan"
                and isinstance(c, Constant) and cond.args[0].same_as(c) and _bound(c) is not None):
            return c
    return None


def _min_max(bound: dict, value) -> tuple[str, relax.Expr, relax.Constant, bool] | None:
    """("maximum" | "minimum", x, bound, whether a TE call) for one half of a Clip: a TE call as the importer writes
    it, or the Relax operator with a constant bound; else None."""
    if not isinstance(value, relax.Call):
        return None
    name = getattr(value.op, "name", "")
    if name in ("relax.maximum", "relax.minimum"):
        kind, (x, c), te = name[len("relax."):], value.args, False
    elif value.op.same_as(_CALL_TIR):
        m = _TE_NAME.match(getattr(value.args[0], "name_hint", ""))
        fields = getattr(value.args[1], "fields", None)
        if m is None or fields is None or len(fields) != 2:
            return None
        kind, (x, c), te = m.group(1), fields, True
    else:
        return None
    c = _constant(bound, c)
    if c is None or _bound(c) is None or not isinstance(x.ty, relax.TensorType) or str(x.ty.dtype) != str(c.ty.dtype):
        return None
    return kind, x, c, te


def _rewrite(func: relax.Function, rewrite) -> relax.Function | None:
    """``func`` with each dataflow binding's value replaced by ``rewrite(binding, values, uses)`` where that is not
    None (``values``: var -> value in its block; ``uses``: var -> how often it is used); None if nothing changed."""
    uses: dict = {}

    def count(e):
        if isinstance(e, relax.Var):
            uses[e] = uses.get(e, 0) + 1

    relax.analysis.post_order_visit(func.body, count)
    changed, blocks = False, []
    for block in func.body.blocks:
        values = {b.var: b.value for b in block.bindings}
        bindings = []
        for b in block.bindings:
            new = rewrite(b, values, uses)
            changed |= new is not None
            bindings.append(b if new is None else type(b)(b.var, new))
        blocks.append(type(block)(bindings))
    if not changed:
        return None
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs,
                          func.span)


def _as_clip(binding, values, uses):
    hit = _min_max(values, binding.value)
    if hit is None:
        return None
    kind, x, c, te = hit
    inner = _min_max(values, values[x]) if isinstance(x, relax.Var) and x in values else None
    if kind == "minimum" and inner is not None and inner[0] == "maximum" and uses.get(x, 0) == 1:
        lo, hi = _bound(inner[2]), _bound(c)
        if lo <= hi:  # the maximum's binding is left unused: DeadCodeElimination drops it
            return relax.op.clip(inner[1], lo, hi)
    if not te:
        return None
    return (relax.op.maximum if kind == "maximum" else relax.op.minimum)(x, c)


def _as_min_max(binding, values, uses):
    v = binding.value
    if not (isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.clip"):
        return None
    dtype = str(v.args[0].ty.dtype)
    lo, hi = (relax.const(float(a.value), dtype) for a in v.args[1:3])
    return relax.op.minimum(relax.op.maximum(v.args[0], lo), hi)


def _apply(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    func = _rewrite(mod["main"], rewrite)
    if func is None:
        return mod
    out = mod.clone()
    out["main"] = func
    return relax.transform.DeadCodeElimination(["main"])(relax.transform.Normalize()(out))


@tvm.transform.module_pass(opt_level=0, name="nimble.ClipAsOperators")
def ClipAsOperators(mod: tvm.IRModule, _ctx=None) -> tvm.IRModule:
    """Module pass: see the module's docstring (a ``minimum(maximum(x, lo), hi)`` of Relax operators becomes a clip
    too). The TE functions no call uses any more are removed."""
    return _apply(mod, _as_clip)


def clip_as_min_max(mod: tvm.IRModule) -> tvm.IRModule:
    """Each ``clip(x, lo, hi)`` as ``minimum(maximum(x, lo), hi)``: binary operators with a constant, which
    ConvertLayout moves to any layout (it has no rule for clip); :func:`ClipAsOperators` puts the clips back."""
    return _apply(mod, _as_min_max)
