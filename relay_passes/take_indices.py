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
from tvm.relax.dpl import is_op, wildcard

from .light_rewrite import rewrite_call_light

_TAKE = is_op("relax.take")(wildcard(), wildcard())


def _clipped(call, _matches):
    if str(call.attrs.mode) != "fast":
        return call
    axis = None if call.attrs.axis is None else int(call.attrs.axis)
    return relax.op.take(call.args[0], call.args[1], axis=axis, mode="clip")


@relax.transform.function_pass(opt_level=0, name="nimble.ClipTakeIndices")
class ClipTakeIndices:
    """Each fast-mode take of every Relax function as a clipping one."""

    def transform_function(self, func, _mod, _ctx):
        return rewrite_call_light(_TAKE, _clipped, func)


def clip_take_indices(mod: tvm.IRModule) -> tvm.IRModule:
    return ClipTakeIndices()(mod)
