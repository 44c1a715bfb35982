"""Relax modules of element-wise and row-normalization kernels for the schedule tests (CPU: how they are scheduled;
GPU: what they compute).

``silu_multiply(dtype, rows, width, gate_at)`` is a 16-bit decoder's SiLU-multiply as the merged gate/up projection
feeds it: ``silu(x[:, gate]) * x[:, up]`` of one ``[rows, 2 * width]`` tensor, computed in float32 (the precision
policy's form) and rounded to ``dtype``. ``gate_at`` moves the gate's columns (the up half stays at ``width``), so a
test can misalign them. ``lead`` puts axes before the rows: a model's tensors are ``[1, rows, 2 * width]`` (batch 1).
``row_norm(kind, rows, width)`` is a normalization over the last axis of ``[1, rows, width]`` float32 (a decoder's
residual stream): RMSNorm, LayerNorm or a softmax, rounded to ``dtype``.
"""
from __future__ import annotations

import numpy as np
from tvm import relax


def silu_multiply(dtype: str = "float16", rows: int = 512, width: int = 4864, gate_at: int = 0,
                  lead: tuple[int, ...] = ()):
    x = relax.Var("x", relax.TensorType((*lead, rows, 2 * width), dtype))
    last = len(lead) + 1
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gate = bb.emit(relax.op.astype(relax.op.strided_slice(x, [last], [gate_at], [gate_at + width]), "float32"))
            up = bb.emit(relax.op.astype(relax.op.strided_slice(x, [last], [width], [2 * width]), "float32"))
            y = bb.emit(relax.op.multiply(relax.op.multiply(gate, relax.op.sigmoid(gate)), up))
            out = bb.emit_output(relax.op.astype(y, dtype))
        bb.emit_func_output(out)
    return bb.get()


def silu_multiply_reference(x: np.ndarray, width: int, gate_at: int = 0) -> np.ndarray:
    """What :func:`silu_multiply` computes, in float64."""
    x = x.astype(np.float64)
    gate, up = x[..., gate_at:gate_at + width], x[..., width:]
    return gate / (1 + np.exp(-gate)) * up


def rotary(dtype: str = "float16", heads: int = 16, seq: int = 512, dim: int = 64, split_at: int | None = None):
    """A rotary embedding as a decoder exports it: ``x * cos + rotate_half(x) * sin`` over ``x [1, heads, seq, dim]``
    (``cos``, ``sin`` ``[1, 1, seq, dim]`` float32 inputs), ``rotate_half(x) = concat(-x[..., s:], x[..., :s])`` with
    ``s = split_at`` (default ``dim / 2``), computed in float32 and rounded to ``dtype``."""
    s = dim // 2 if split_at is None else split_at
    x = relax.Var("x", relax.TensorType((1, heads, seq, dim), dtype))
    cos = relax.Var("cos", relax.TensorType((1, 1, seq, dim), "float32"))
    sin = relax.Var("sin", relax.TensorType((1, 1, seq, dim), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, cos, sin]):
        with bb.dataflow():
            high = relax.op.negative(relax.op.strided_slice(x, [3], [s], [dim]))
            rotated = bb.emit(relax.op.concat([high, relax.op.strided_slice(x, [3], [0], [s])], axis=3))
            y = relax.op.add(relax.op.multiply(relax.op.astype(x, "float32"), cos),
                             relax.op.multiply(relax.op.astype(rotated, "float32"), sin))
            out = bb.emit_output(relax.op.astype(y, dtype))
        bb.emit_func_output(out)
    return bb.get()


def rotary_reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, split_at: int | None = None) -> np.ndarray:
    """What :func:`rotary` computes, in float64."""
    x = x.astype(np.float64)
    s = x.shape[-1] // 2 if split_at is None else split_at
    rotated = np.concatenate([-x[..., s:], x[..., :s]], axis=-1)
    return x * cos + rotated * sin


#: the normalizations of :func:`row_norm`
ROW_NORMS = ("rms_norm", "layer_norm", "softmax")


def row_norm(kind: str, rows: int = 512, width: int = 896, dtype: str = "float16"):
    """``kind`` (one of :data:`ROW_NORMS`) over the last axis of ``x [1, rows, width]`` float32 with ``weight`` and
    ``bias`` ``[width]`` float32 (RMSNorm: eps 1e-6, the weight alone; LayerNorm: eps 1e-5; softmax: neither),
    rounded to ``dtype``."""
    x = relax.Var("x", relax.TensorType((1, rows, width), "float32"))
    weight = relax.Var("weight", relax.TensorType((width,), "float32"))
    bias = relax.Var("bias", relax.TensorType((width,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, weight, bias]):
        with bb.dataflow():
            if kind == "rms_norm":
                y = relax.op.nn.rms_norm(x, weight, axes=[-1], epsilon=1e-6)
            elif kind == "layer_norm":
                y = relax.op.nn.layer_norm(x, weight, bias, axes=[-1], epsilon=1e-5)
            else:
                y = relax.op.nn.softmax(x, axis=-1)
            out = bb.emit_output(relax.op.astype(y, dtype))
        bb.emit_func_output(out)
    return bb.get()


def row_norm_reference(kind: str, x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """What :func:`row_norm` computes, in float64."""
    x, weight, bias = (a.astype(np.float64) for a in (x, weight, bias))
    if kind == "rms_norm":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * weight
    if kind == "layer_norm":
        centred = x - x.mean(-1, keepdims=True)
        return centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + 1e-5) * weight + bias
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
