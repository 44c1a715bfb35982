"""What the providers' matchers share: a dataflow block's bindings as chains, and the vendor call.

A matcher gets the anchor binding (``var = call``) and returns ``(removed, last, (vendor call,
scale))`` -- the vars it folds into the call, the var the call's result replaces, and a constant
the result is multiplied with (or None) -- or None when the chain is not its to take (after
adding the reason to the report's ``kept`` list).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

ACT_NONE, ACT_RELU, ACT_RELU6, ACT_GELU = 0, 1, 2, 3  # the vendor calls' activation codes
#: scratch memory per vendor call; cuDNN/cuBLASLt pick the fastest algorithm that fits
DEFAULT_WORKSPACE_BYTES = 8 << 20
#: a GEMM's: split-K at batch 1 keeps M x N partial sums per split (ViT-B's [197, 768] in 16 splits: 9.7 MB);
#: PyTorch gives cuBLAS 32 MiB on Hopper
GEMM_WORKSPACE_BYTES = 32 << 20


@dataclass
class OffloadReport:
    """What the offload did: calls emitted per function, and operators kept on TVM with the reason."""

    offloaded: dict[str, int] = field(default_factory=dict)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (operator, reason)


def operator_of(expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def known_shape(expr) -> tuple[int, ...] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape.values)
    except TypeError:
        return None


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)


def operands(value) -> list:
    """What a binding's value reads: a call's arguments, or the tuple an item is taken from."""
    return [value.tuple_value] if isinstance(value, relax.TupleGetItem) else list(getattr(value, "args", []))


def other_operand(call, produced):
    """The operand of the binary ``call`` that is not ``produced`` (None when neither is)."""
    a, b = call.args
    return b if a.same_as(produced) else a if b.same_as(produced) else None


def ints(arr) -> list[int]:
    return [int(v) for v in arr]


def use_counts(func: relax.Function) -> dict:
    """How often each var of ``func`` is used, in its bindings and its result."""
    uses: dict = {}

    def visit(e):
        if isinstance(e, relax.Var):
            uses[e] = uses.get(e, 0) + 1

    for block in func.body.blocks:
        for b in block.bindings:
            relax.analysis.post_order_visit(b.value, visit)
    relax.analysis.post_order_visit(func.body.body, visit)
    return uses


def const_value(bound: dict, expr, depth: int = 0):
    """The value of a small constant integer expression (the ONNX importer computes a Gather's index
    with shape_of / take / less / where / add), else None. ``bound``: variable -> the value bound to it."""
    if depth > 12:
        return None
    if isinstance(expr, Constant):
        return expr.value.numpy()
    if isinstance(expr, relax.ShapeExpr):
        try:
            return np.array([int(v) for v in expr.values], dtype=np.int64)
        except TypeError:
            return None
    if isinstance(expr, relax.Var):
        return const_value(bound, bound[expr], depth + 1) if expr in bound else None
    op = operator_of(expr)
    if op == "relax.shape_of":
        shape = known_shape(expr.args[0])
        return None if shape is None else np.array(shape, dtype=np.int64)
    fns = {"relax.shape_to_tensor": lambda x: x, "relax.add": np.add, "relax.subtract": np.subtract,
           "relax.less": np.less, "relax.where": np.where,
           "relax.take": lambda x, i: np.take(x, i, axis=int(expr.attrs.axis or 0), mode="wrap")}
    if op not in fns:
        return None
    args = [const_value(bound, a, depth + 1) for a in expr.args]
    return None if any(a is None for a in args) else np.asarray(fns[op](*args))


class Chains:
    """The bindings of one dataflow block, and how often each var is used in the whole function."""

    def __init__(self, block, uses):
        self.value = {b.var: b.value for b in block.bindings}
        self.uses = uses
        self.claimed: set = set()  # vars of chains already replaced
        self.consumers: dict = {}  # var -> the bindings of this block that take it as an argument, in order
        for b in block.bindings:
            for a in operands(b.value):
                if isinstance(a, relax.Var):
                    self.consumers.setdefault(a, []).append(b.var)

    def single_use(self, var) -> bool:
        return self.uses.get(var, 0) == 1

    def const(self, expr) -> np.ndarray | None:
        """The constant behind ``expr`` (through a reshape of a constant), else None."""
        if isinstance(expr, relax.Var) and expr in self.value:
            expr = self.value[expr]
        if isinstance(expr, Constant):
            return expr.value.numpy()
        if operator_of(expr) == "relax.reshape" and isinstance(expr.args[0], Constant):
            shape = known_shape(expr)
            return expr.args[0].value.numpy().reshape(shape) if shape is not None else None
        return None

    def follow(self, var):
        """The binding that consumes ``var``, when ``var`` is used exactly once inside this block and that
        binding is not part of a chain already replaced."""
        if not self.single_use(var):
            return None, None
        for v in self.consumers.get(var, []):
            if v not in self.claimed:
                return v, self.value[v]
        return None, None

    def bias_of(self, add, produced, out_shape: tuple[int, ...], axis: int):
        """If ``add`` adds a constant to ``produced`` that varies along ``axis`` of ``out_shape`` only (a
        per-channel bias, as broadcasting aligns it from the right): that bias as a 1-D array, else None."""
        if operator_of(add) != "relax.add":
            return None
        other = other_operand(add, produced)
        if other is None:
            return None
        c = self.const(other)
        if c is None or c.ndim > len(out_shape):
            return None
        aligned = (1,) * (len(out_shape) - c.ndim) + tuple(int(d) for d in c.shape)
        channels = out_shape[axis]
        if any(d != (channels if i == axis % len(out_shape) else 1) for i, d in enumerate(aligned)):
            return None
        return c.reshape(channels)


def activation(expr) -> int | None:
    op = operator_of(expr)
    if op == "relax.nn.relu":
        return ACT_RELU
    if op == "relax.clip":
        lo, hi = (float(getattr(a, "value", 0)) for a in expr.args[1:3])
        if lo == 0 and hi == 6:
            return ACT_RELU6
    return None


def epilogue(chains, var, out_shape, dtype: str, channel_axis: int, with_bias: bool = True,
             residual_needs_bias: bool = False):
    """What follows ``var`` (a convolution's or pool's result) that a vendor call folds in: [+ bias] [+ residual]
    [-> relu | relu6]. Returns (removed, last, bias or None, residual or None, activation): the vars folded in, the
    var whose value the call computes. A residual is a computed tensor of the output's shape and dtype, not claimed
    by another chain; ``residual_needs_bias``: only after a bias (cuDNN's chains)."""
    removed, last, bias, residual, act = [], var, None, None, ACT_NONE
    nxt, val = chains.follow(last)
    b = chains.bias_of(val, last, out_shape, axis=channel_axis) if with_bias and val is not None else None
    if b is not None:
        bias, removed, last = b, [last], nxt
        nxt, val = chains.follow(last)
    if val is not None and operator_of(val) == "relax.add" and (bias is not None or not residual_needs_bias):
        other = other_operand(val, last)
        if (other is not None and known_shape(other) == tuple(out_shape) and dtype_of(other) == dtype
                and chains.const(other) is None and other not in chains.claimed):
            residual, removed, last = other, removed + [last], nxt
            nxt, val = chains.follow(last)
    if val is not None and activation(val) is not None:
        act, removed, last = activation(val), removed + [last], nxt
    return removed, last, bias, residual, act


def _scalar(chains, expr) -> float | None:
    c = chains.const(expr)
    return float(c) if c is not None and c.size == 1 else None


def _near(value, target: float) -> bool:
    return value is not None and abs(value - target) <= 1e-6 * abs(target)


def gelu_of(chains, x):
    """``(removed, last)`` when every use of ``x`` is the exact (erf) GELU of it, else None: ``relax.nn.gelu``
    or the five operators ONNX exports spell it with, ``x * (1 + erf(x / sqrt(2))) * 0.5`` (torch.onnx,
    timm) or ``x * 0.5 * (1 + erf(x / sqrt(2)))`` (Hugging Face). ``removed`` are the vars before the GELU's result, ``last`` the var holding it."""
    users = [v for v in chains.consumers.get(x, []) if v not in chains.claimed]
    if chains.uses.get(x, 0) != len(users):
        return None
    if len(users) == 1 and operator_of(chains.value[users[0]]) == "relax.nn.gelu":
        return [x], users[0]
    if len(users) != 2:
        return None
    by_op = {operator_of(chains.value[v]): v for v in users}
    if set(by_op) != {"relax.divide", "relax.multiply"}:
        return None
    div, half_or_prod = by_op["relax.divide"], by_op["relax.multiply"]
    if not _near(_scalar(chains, chains.value[div].args[1]), 2 ** 0.5):
        return None
    erf, erf_val = chains.follow(div)
    if operator_of(erf_val) != "relax.erf":
        return None
    one, one_val = chains.follow(erf)
    if operator_of(one_val) != "relax.add" or not _near(_scalar(chains, other_operand(one_val, erf)), 1.0):
        return None
    first = chains.value[half_or_prod]  # x * (1 + erf) or x * 0.5
    other = other_operand(first, x)
    second_var, second = chains.follow(half_or_prod)
    if operator_of(second) != "relax.multiply":
        return None
    if other is not None and other.same_as(one):  # (x * (1 + erf)) * 0.5
        if not chains.single_use(one) or not _near(_scalar(chains, other_operand(second, half_or_prod)), 0.5):
            return None
    elif _near(_scalar(chains, other), 0.5):  # (x * 0.5) * (1 + erf)
        if not chains.single_use(one) or other_operand(second, half_or_prod) is None \
                or not other_operand(second, half_or_prod).same_as(one):
            return None
    else:
        return None
    return [x, div, erf, one, half_or_prod], second_var


@dataclass
class MatchContext:
    """The offload's settings, as every matcher sees them."""

    workspace_bytes: int
    allow_tf32: bool
    report: OffloadReport

    @property
    def tf32(self) -> int:
        return int(self.allow_tf32)

    def call(self, name, args, out, dtype, workspace_bytes: int | None = None):
        """``call_dps_packed(name, args) -> (out, workspace)``; the caller binds item 0. The workspace is an
        extra output, so each call gets its own scratch memory in the concurrency-safe plan (a kernel that
        needs none asks for 1 byte)."""
        ws = self.workspace_bytes if workspace_bytes is None else workspace_bytes
        sinfo = [relax.TensorType(out, dtype), relax.TensorType((ws,), "uint8")]
        return relax.op.call_dps_packed(name, relax.Tuple(args), sinfo)
