"""Every ``relax.take`` in ``"fast"`` mode as one that clips its indices (``mode="clip"``).

TVM's ONNX importer writes each Gather as ``relax.take`` in its default ``"fast"`` mode: an index out of bounds
reads outside the tensor, and legalizing it (topi's ``take``) logs a warning on the process's stderr each time
("Fast mode segfaults when there are out-of-bounds indices"), lines a user of the Python API cannot act on. In
``"clip"`` mode an index is clamped into range: a min and a max per index, no undefined behaviour, and the same
values for every index in range (the executor's input check refuses token ids outside the embedding's table
before they reach a kernel). ``"wrap"`` takes, which the importer writes for negative shape indices, are kept.
"""
from __future__ import annotations

import tvm
from tvm import relax

_TAKE = tvm.ir.Op.get("relax.take")


@relax.expr_functor.mutator
class _ClipTakes(relax.PyExprMutator):
    """One walk over the function's calls. (Not ``tvm.relax.dpl.rewrite_call``: it repeats its walk until the
    function stops changing, comparing it structurally each time, with every weight tensor's bytes: 0.75 s of
    each GPT-2 import for three takes.)"""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if call.op.same_as(_TAKE) and str(call.attrs.mode) == "fast":
            axis = None if call.attrs.axis is None else int(call.attrs.axis)
            return relax.op.take(call.args[0], call.args[1], axis=axis, mode="clip")
        return call


@relax.transform.function_pass(opt_level=0, name="nimble.ClipTakeIndices")
class ClipTakeIndices:
    """Each fast-mode take of every Relax function as a clipping one."""

    def transform_function(self, func, mod, _ctx):
        return _ClipTakes(mod).visit_expr(func)


def clip_take_indices(mod: tvm.IRModule) -> tvm.IRModule:
    return ClipTakeIndices()(mod)
