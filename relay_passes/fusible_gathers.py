"""Gathers (``relax.take``: embedding lookups, a mask's row picks) fused with their neighbours like any injective op.

TVM's ``AnnotateTIROpPattern`` marks a kernel whose load index is itself a load (``A[ids[i], j]``) opaque, and
``FuseOps`` fuses nothing across an opaque kernel: a decoder's prologue stays eight launches (the ids' and positions'
index wrap, the two embedding lookups, their cast and sum, the mask's three), a decode step's 71 in all for GPT-2
small, where each launch costs about as much as the work. Relay called ``take`` injective, and it is: each output
element reads one element of the table, the index computed from the same output position. :func:`fusible_gathers`
(after ``AnnotateTIROpPattern``, before ``FuseOps``) gives such a kernel the injective pattern, so the index's
computation, the lookup and the element-wise ops after it become one kernel.

A kernel qualifies when it is one spatial block (no reduction, no other block) storing its output at its own
indices, none of its loads reads the output, and at least one load is a gather: its indices hold loads of the
kernel's other inputs.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

#: TVM's op patterns (``tvm/relax/op_attr_types.h``)
INJECTIVE, OPAQUE = 2, 8


def is_gather(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one spatial block whose value reads its inputs, some at indices loaded from others (see
    the module docstring)."""
    blocks = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlockRealize, blocks.append)], order="post")
    blocks = [r.block for r in blocks if r.block.name_hint != "root"]
    if len(blocks) != 1:
        return False
    block = blocks[0]
    store = block.body
    if (not isinstance(store, tirx.BufferStore) or block.init is not None
            or any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars)
            or len(store.indices) != len(block.iter_vars)
            or not all(i.same_as(iv.var) for i, iv in zip(store.indices, block.iter_vars))):
        return False
    loads = []
    tvm_ffi.structural_walk(store.value, [(tvm.ir.expr.TensorLoad, loads.append)], order="post")
    gathered = False
    for load in loads:
        if load.source.same_as(store.buffer):
            return False
        inner = []
        for index in load.indices:
            tvm_ffi.structural_walk(index, [(tvm.ir.expr.TensorLoad, inner.append)], order="post")
        gathered |= bool(inner)
    return gathered


@tvm.transform.module_pass(opt_level=0, name="nimble.FusibleGathers")
def fusible_gathers(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every opaque gather kernel of ``mod`` (:func:`is_gather`) marked injective, for ``FuseOps``."""
    updates = {}
    for gv, func in mod.functions.items():
        if (isinstance(func, tirx.PrimFunc) and func.attrs is not None
                and int(func.attrs.get("op_pattern", -1)) == OPAQUE and is_gather(func)):
            updates[gv] = func.with_attr("op_pattern", INJECTIVE)
    for gv, func in updates.items():
        mod[gv] = func
    return mod
