"""Precision: the one list of compute dtypes and the one place that decides an operator's dtype.

A model is imported in float32. ``to_precision(mod, "float16")`` rewrites it to compute in fp16 with
TVM's own ``ToMixedPrecision`` (inputs and outputs stay float32), so every provider, TVM's kernels
included, then sees fp16 operators; a provider accepts an operator when :func:`compute_dtype`
is one of the dtypes it declares.
"""
from __future__ import annotations

import tvm
from tvm import relax

#: the compute dtypes a build can ask for (``BuildOptions.precision``)
DTYPES = ("float32", "float16")


def compute_dtype(call) -> str | None:
    """The dtype ``call`` computes in: its output's, when every tensor argument has that dtype too
    (a mixed-dtype operator, e.g. an fp16 matmul accumulating into fp32, has none)."""
    ty = call.ty
    if not isinstance(ty, relax.TensorType):
        return None
    dtype = str(ty.dtype)
    for a in getattr(call, "args", ()):
        if isinstance(a.ty, relax.TensorType) and str(a.ty.dtype) != dtype:
            return None
    return dtype


def to_precision(mod: tvm.IRModule, dtype: str) -> tvm.IRModule:
    """``mod`` computing in ``dtype``; inputs and outputs stay float32.

    ``ToMixedPrecision`` leaves a cast of every fp32 weight in the graph; they are folded into
    constants here, once, instead of by the ``FoldConstant`` of every later build (seconds each)."""
    if dtype not in DTYPES:
        raise ValueError(f"precision must be one of {DTYPES}, got {dtype!r}")
    if dtype == "float32":
        return mod
    return relax.transform.FoldConstant()(relax.transform.ToMixedPrecision(out_dtype=dtype)(mod))
