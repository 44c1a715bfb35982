"""Lower a stream-annotated Relax module to a :class:`tvm_nimble.contract.plan.Plan`.

Input: the output of stage 1 (``relay_passes``): ``main`` after ``CallTIRRewrite`` with
``nimble.*`` markers. Output: the launch plan with a concurrency-safe memory plan, plus the
constants (weights) the plan's constant tensors refer to.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_nimble.contract.plan import (CONST, INPUT, INTERMEDIATE, OUTPUT, POOL, STATE, Launch, Plan, Storage,
                                      TensorSlot)
from tvm_nimble.relay_passes.annotate import ATTR_NUM_EVENTS, ATTR_NUM_STREAMS
from tvm_nimble.relay_passes.host_arrays import as_numpy
from tvm_nimble.relay_passes.lowered_ir import LoweredIRError, LoweredProgram, read_lowered_function

from .happens_before import access_masks, happens_before, sequential_order, write_ready
from .memory_plan import best_pool_plan, no_reuse_bytes

#: How tensors share storage: "concurrent" (safe under the schedule's happens-before),
#: "sequential" (TVM-style, only safe on one stream; kept to demonstrate the race) or "none".
REUSE_MODES = ("concurrent", "sequential", "none")


def _kinds(program: LoweredProgram) -> dict[int, str]:
    """value id -> the plan's tensor kind: its root's, an input's or constant's views included."""
    kinds = {}
    output_roots = {program.root(o) for o in program.outputs}
    for v in program.values:
        r = program.root(v.id)
        base = program.values[r].kind
        if base == "input":
            kinds[v.id] = STATE if r in program.states else INPUT
        elif base == "const":
            kinds[v.id] = CONST
        elif r in output_roots:
            kinds[v.id] = OUTPUT
        else:
            kinds[v.id] = INTERMEDIATE
    return kinds


def build_plan(mod: tvm.IRModule, target: dict, reuse: str = "concurrent", func_name: str = "main",
               constants_of: dict[str, np.ndarray] | None = None) -> tuple[Plan, dict[str, np.ndarray]]:
    """Return (plan, constants by name ``c<tensor id>``). ``constants_of``: the constants of another plan of the
    same lowered function (another stream schedule: the same values, ids and constants), given back instead of
    copied out of the module again (a model's weights, once per schedule the stream choice tries)."""
    if reuse not in REUSE_MODES:
        raise ValueError(f"reuse must be one of {REUSE_MODES}, got {reuse!r}")
    program = read_lowered_function(mod, func_name)
    func = mod[func_name]
    if program.kernels and any(k.stream is None for k in program.kernels):
        raise LoweredIRError("the module is not stream-annotated: run relay_passes.AnnotateStreams first")
    num_streams = int(func.attrs[ATTR_NUM_STREAMS]) if func.attrs and ATTR_NUM_STREAMS in func.attrs else 1
    num_events = int(func.attrs[ATTR_NUM_EVENTS]) if func.attrs and ATTR_NUM_EVENTS in func.attrs else 0
    kinds = _kinds(program)
    launches = [Launch(k.index, k.func, list(k.args), list(k.writes), k.stream, list(k.waits), list(k.records),
                       [list(lit) for lit in k.literals]) for k in program.kernels]

    # memory: dedicated storage for inputs, outputs and constants; a shared pool for the rest
    roots = [v.id for v in program.values if v.base is None]
    storage_of: dict[int, int] = {}
    storages: list[Storage] = []
    for r in roots:
        if kinds[r] != INTERMEDIATE:
            storage_of[r] = len(storages)
            storages.append(Storage(len(storages), program.values[r].nbytes, kinds[r]))
    pool = [r for r in roots if kinds[r] == INTERMEDIATE]
    nbytes = _root_bytes(program)
    first_write, accesses = access_masks(((k.index, k.args, k.writes) for k in program.kernels), program.root)
    pool = [r for r in pool if r in first_write]  # allocated but never written: dead
    n = len(launches)
    hb = happens_before([l.stream for l in launches], [l.waits for l in launches], [l.records for l in launches])
    kernels = [(k.index, k.args, k.writes) for k in program.kernels]
    seq = sequential_order(n)
    concurrent = best_pool_plan(pool, nbytes, first_write, accesses, hb, write_ready(kernels, program.root, hb))
    sequential = best_pool_plan(pool, nbytes, first_write, accesses, seq, write_ready(kernels, program.root, seq))
    chosen = {"concurrent": concurrent, "sequential": sequential}.get(reuse)
    if chosen is None:  # no reuse
        block_of = {r: i for i, r in enumerate(pool)}
        sizes = [nbytes[r] for r in pool]
    else:
        block_of, sizes = chosen.block_of, chosen.block_sizes
    base = len(storages)
    storages += [Storage(base + i, s, POOL) for i, s in enumerate(sizes)]
    for r in pool:
        storage_of[r] = base + block_of[r]

    tensors = []
    for v in program.values:
        r = program.root(v.id)
        if r not in storage_of:  # never written, never read: give it its own (empty) storage
            storage_of[r] = len(storages)
            storages.append(Storage(len(storages), nbytes[r], POOL))
        offset = program.region(v.id)[1]  # roots sit at the start of their storage
        tensors.append(TensorSlot(v.id, v.name, list(v.shape), v.dtype, kinds[v.id], storage_of[r], offset, v.base))
    constants = [v.id for v in program.values if v.kind == "const"]
    params = _constants(program, constants_of)
    memory = {
        "pool_bytes": sum(sizes),
        "pool_bytes_concurrent_safe": concurrent.total_bytes,
        "pool_bytes_sequential": sequential.total_bytes,
        "pool_bytes_no_reuse": no_reuse_bytes(pool, nbytes),
        "reuse": reuse,
        **({"state_bytes": sum(program.values[s].nbytes for s in program.states)} if program.states else {}),
    }
    plan = Plan(target=dict(target), num_streams=max(num_streams, 1), num_events=num_events, tensors=tensors,
                storages=storages, launches=launches, inputs=list(program.inputs), outputs=list(program.outputs),
                constants=constants, output_is_tuple=program.output_is_tuple, memory=memory,
                states=list(program.states))
    plan.validate()
    return plan, params


def _constants(program: LoweredProgram, known: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The constants' values by name ``c<id>``: ``known``'s where it holds these names with these shapes and dtypes
    (the same lowered function's), else copied out of the module."""
    consts = {f"c{v.id}": v for v in program.values if v.kind == "const"}

    def same(name: str, v) -> bool:
        a = known.get(name)
        return a is not None and tuple(a.shape) == tuple(v.shape) and str(a.dtype) == v.dtype

    if known is not None and len(known) == len(consts) and all(same(n, v) for n, v in consts.items()):
        return {n: known[n] for n in consts}
    return {n: as_numpy(v.constant.value) for n, v in consts.items()}


def _root_bytes(program: LoweredProgram) -> dict[int, int]:
    """Bytes of each root's storage: it must also hold every view of it (views may be larger in theory).
    One pass over the values (a pass per root was quadratic: 0.2 s per schedule on a 100-kernel net, and
    the stream choice schedules a dozen times)."""
    size = {v.id: v.nbytes for v in program.values if v.base is None}
    for v in program.values:
        r, _, end = program.region(v.id)
        size[r] = max(size[r], end)
    return size


def tvm_static_plan_bytes(mod: tvm.IRModule, func_name: str = "main") -> int:
    """Bytes TVM's own ``StaticPlanBlockMemory`` allocates for ``func_name`` (its sequential plan)."""
    planned = relax.transform.StaticPlanBlockMemory()(mod)
    total = 0

    def visit(expr):
        nonlocal total
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.memory.alloc_storage":
            total += int(expr.args[0].values[0])

    relax.analysis.post_order_visit(planned[func_name].body, visit)
    return total
