"""TVM's dataflow-pattern rewriter (``tvm.relax.dpl.rewrite_call``) over a function whose large constants are set
aside for the rewrite.

Why: the rewriter's cost grows with the bytes of the constants in the function it walks, not only with its
bindings (40 takes over 2.7 GB of constants: 6.8 s against 0.01 s over 0.7 MB, on the 2-core CI machine); over a
0.5B decoder's weights each of the two rewrites of a step took 3.4 s, 14 s of a generator's 83 s build. So each
constant of at least ``lift_bytes`` becomes a parameter of the function for the rewrite (a pattern sees its shape
and dtype, as ``wildcard()`` matches it) and is bound back after it; the small ones, whose values a pattern may
read (an epsilon, an exponent), stay in place.
"""
from __future__ import annotations

import tvm_ffi
from tvm import relax
from tvm.runtime import DataType
from tvm.relax.dpl import DFPattern, rewrite_call
from tvm.relax.expr_functor import PyExprMutator, mutator

#: constants this large (bytes) are lifted for the rewrite: a weight matrix, not a scalar or a shape
LIFT_BYTES = 1 << 16


@mutator
class _Lift(PyExprMutator):
    """Each constant of at least ``lift_bytes`` as a variable (the same constant object: the same variable)."""

    def __init__(self, lift_bytes: int):
        super().__init__()
        self.lift_bytes = lift_bytes
        self.lifted: dict = {}  # constant -> its variable

    def visit_generic_const_(self, op):
        if not hasattr(op.value, "shape") or _nbytes(op.value) < self.lift_bytes:  # (a tensor constant)
            return op
        var = self.lifted.get(op)
        if var is None:
            var = self.lifted[op] = relax.Var(f"lifted{len(self.lifted)}", op.ty)
        return var


def _nbytes(data) -> int:
    dtype = DataType(str(data.dtype))
    n = (dtype.bits * dtype.lanes + 7) // 8
    for d in data.shape:
        n *= int(d)
    return n


def rewrite_call_light(pattern: DFPattern, rewriter, func: relax.Function,
                       lift_bytes: int = LIFT_BYTES) -> relax.Function:
    """``rewrite_call(pattern, rewriter, func)`` with the constants of ``lift_bytes`` or more lifted out of ``func``
    while it runs; ``func`` itself where nothing was rewritten."""
    lift = _Lift(lift_bytes)
    body = lift.visit_expr(func.body)
    if not lift.lifted:
        return rewrite_call(pattern, rewriter, func)
    params = list(func.params) + list(lift.lifted.values())
    light = relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
    new = rewrite_call(pattern, rewriter, light)
    if new.same_as(light) or tvm_ffi.structural_equal(new, light):  # (cheap: the large constants are out)
        return func
    return new.bind_params({var: const for const, var in lift.lifted.items()})
