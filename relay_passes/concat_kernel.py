"""Where a concatenation kernel puts each of its inputs, read from the kernel itself.

A concat call's arguments are not always in concatenation order: when TVM's fusion pulls the
tuple fields of a vendor call's output into the concat's group, the fused kernel takes those
inputs first (``fused_concatenate(vendor_a, vendor_b, tvm_c, tvm_d, out)`` for
``concat(tvm_c, vendor_a, vendor_b, tvm_d)``). So the slice each input lands in is read off the
PrimFunc: at the output's origin (every loop and block variable 0) input ``i`` is loaded at element
``-start_i``, whatever the schedule (DLight's fused thread indices, a tuned split) made of the index
expressions. That needs no knowledge of the schedule, only that the kernel is a plain concat.
"""
from __future__ import annotations

import math

import tvm
import tvm_ffi

_TensorLoad = tvm.ir.expr.TensorLoad
_Var = tvm.ir.expr.Var


def _strides(shape) -> list[int]:
    return [math.prod(shape[k + 1:]) for k in range(len(shape))]


def _at_origin(expr) -> int | None:
    """``expr`` with every variable set to 0, or None if that is not a constant."""
    variables = []
    tvm_ffi.structural_walk(expr, (_Var, variables.append))
    analyzer = tvm.sym.Analyzer()
    for var in variables:
        analyzer.bind(var, tvm.tirx.IntImm(var.ty.dtype, 0))
    value = analyzer.simplify(expr)
    return int(value.value) if isinstance(value, tvm.tirx.IntImm) else None


def slice_starts(func: tvm.tirx.PrimFunc, input_shapes: list[tuple[int, ...]]) -> list[int] | None:
    """For each input parameter of the concat kernel ``func`` (all but the last, the output), the
    element of the output where its data starts; None where the kernel does not say so plainly
    (an input never loaded, or loaded at two different places at the origin)."""
    params = list(func.params)[:-1]
    if len(params) != len(input_shapes):
        return None
    loads = []
    tvm_ffi.structural_walk(func.body, (_TensorLoad, loads.append))
    starts: list[int | None] = [None] * len(params)
    for load in loads:
        which = next((i for i, p in enumerate(params) if p.same_as(load.source)), None)
        if which is None:
            continue
        shape = input_shapes[which]
        index = [_at_origin(e) for e in load.indices]
        if any(i is None for i in index) or len(index) not in (1, len(shape)):
            return None
        linear = index[0] if len(index) == 1 else sum(i * s for i, s in zip(index, _strides(shape)))
        if starts[which] is not None and starts[which] != -linear:
            return None
        starts[which] = -linear
    return None if any(s is None for s in starts) else starts


def tiles_output(starts: list[int], sizes: list[int], out_size: int) -> bool:
    """Whether the slices ``[start, start + size)`` cover ``[0, out_size)`` exactly, without overlap."""
    end = 0
    for start, size in sorted(zip(starts, sizes)):
        if start != end:
            return False
        end += size
    return end == out_size
