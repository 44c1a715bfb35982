"""The Relax pass that runs Nimble's stream assignment and writes it into the IR.

The pass runs on the lowered form (after ``CallTIRRewrite``), where one call of a PrimFunc
is one kernel launch. It inserts three kinds of marker calls, so ``mod.show()`` reads as
the schedule itself::

    R.call_packed("nimble.set_stream", 2)    # the next kernel runs on stream 2
    R.call_packed("nimble.wait_event", 0)    # ...after waiting for event 0
    fused_conv2d_relu(x, w, alloc)
    R.call_packed("nimble.record_event", 1)  # event 1 marks this kernel done

The markers are plain packed calls: later TVM passes keep them, the VM can run them
(``tvm_nimble`` registers them), and codegen reads them back into the launch plan.
"""
from __future__ import annotations

import tvm
from tvm import relax

from tvm_nimble.contract.markers import RECORD_EVENT, SET_STREAM, WAIT_EVENT

from .lowered_ir import is_vendor_call, read_lowered_function
from .stream_assignment import StreamAssignment, assign_streams

ATTR_NUM_STREAMS = "nimble_num_streams"
ATTR_NUM_EVENTS = "nimble_num_events"
ATTR_NUM_SYNCS = "nimble_num_syncs"


def _marker(name: str, value: int) -> relax.VarBinding:
    call = relax.Call(relax.ExternFunc(name), [relax.prim_value(tvm.tirx.IntImm("int64", value))],
                      ty_args=[relax.ObjectType()])
    return relax.VarBinding(relax.Var("_", relax.ObjectType()), call)


def events_for(assignment: StreamAssignment) -> tuple[dict[int, int], dict[int, list[int]]]:
    """One event per producer with a cross-stream consumer: (producer -> event, consumer -> events)."""
    record: dict[int, int] = {}
    waits: dict[int, list[int]] = {}
    for producer, consumer in sorted(assignment.syncs):
        if producer not in record:
            record[producer] = len(record)
        waits.setdefault(consumer, []).append(record[producer])
    return record, waits


def _is_kernel_call(value, prim_names: set[str]) -> bool:
    return (isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar) and value.op.name_hint in prim_names
            or is_vendor_call(value))


def annotate_function(mod: tvm.IRModule, func_name: str = "main", max_streams: int | None = None,
                      program=None, costs=None):
    """Return (annotated function, assignment) for ``mod[func_name]``; ``program`` is that function
    already read with ``read_lowered_function``, when the caller has it. ``costs`` (one per kernel of
    ``program``, e.g. measured times) make a stream cap cost-aware (see ``assign_streams``)."""
    program = program if program is not None else read_lowered_function(mod, func_name)
    if any(k.stream is not None for k in program.kernels):
        raise ValueError(f"function '{func_name}' is already stream-annotated")
    assignment = assign_streams(len(program.kernels), program.dependency_edges(), max_streams=max_streams,
                                costs=costs)
    record, waits = events_for(assignment)
    prim_names = {gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}

    func = mod[func_name]
    # Kernels are emitted in the assignment's topological order, so that every stream's
    # program order is the order of the launch list (codegen relies on it).
    kernel_pos = {k: i for i, k in enumerate(assignment.order)}
    blocks = []
    k = 0
    for block in func.body.blocks:
        # non-kernel bindings (allocations, aliases, views), keyed by how many kernels preceded them
        others: dict[int, list] = {}
        kernel_groups = {}
        for binding in block.bindings:
            if _is_kernel_call(binding.value, prim_names):
                group = [_marker(SET_STREAM, assignment.stream_of[k])]
                group += [_marker(WAIT_EVENT, e) for e in waits.get(k, [])]
                group.append(binding)
                if k in record:
                    group.append(_marker(RECORD_EVENT, record[k]))
                kernel_groups[k] = group
                k += 1
            else:
                others.setdefault(k, []).append(binding)
        # Allocations and views stay just before the first kernel that followed them in the
        # original order; kernels are emitted in the assignment's topological order.
        bindings = []
        for kk in sorted(kernel_groups, key=kernel_pos.__getitem__):
            for before_k in sorted(src for src in others if src <= kk):
                bindings += others.pop(before_k)
            bindings += kernel_groups[kk]
        for before_k in sorted(others):
            bindings += others[before_k]
        blocks.append(relax.BindingBlock(bindings))
    new_func = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                              func.is_pure, func.attrs, func.span)
    new_func = new_func.with_attr(ATTR_NUM_STREAMS, assignment.num_streams)
    new_func = new_func.with_attr(ATTR_NUM_EVENTS, len(record))
    new_func = new_func.with_attr(ATTR_NUM_SYNCS, len(assignment.syncs))
    return new_func, assignment


def AnnotateStreams(max_streams: int | None = None, func_name: str = "main") -> tvm.transform.Pass:
    """Module pass: Nimble stream assignment + explicit synchronization markers on ``func_name``."""

    @tvm.transform.module_pass(opt_level=0, name="nimble.AnnotateStreams")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        new_func, _ = annotate_function(mod, func_name, max_streams)
        mod = mod.clone()
        mod[func_name] = new_func
        return relax.transform.Normalize()(mod)

    return _pass
