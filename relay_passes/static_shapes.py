"""``shape_of`` of a tensor whose shape is static becomes that shape.

TVM's ONNX importer computes a Gather's index with ``shape_of`` (to wrap negative indices), so the
tensor the Gather reads stays "used" by a shape query that reads none of its data. With the shape
written in, the fused-attention provider can drop the head-split views of the QKV tensor, and later
constant folding sees plain integers.
"""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

_SHAPE_OF = tvm.ir.Op.get("relax.shape_of")


@mutator
class _StaticShapeOf(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if call.op.same_as(_SHAPE_OF):
            ty = call.args[0].ty
            if isinstance(ty, relax.TensorType) and ty.shape is not None:
                try:
                    return relax.ShapeExpr([int(d) for d in ty.shape.values])
                except TypeError:  # a symbolic dimension: keep the query
                    pass
        return call


@tvm.transform.module_pass(opt_level=0, name="nimble.FoldStaticShapeOf")
def FoldStaticShapeOf(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    out = mod.clone()
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = _StaticShapeOf().visit_expr(func)
    return out
