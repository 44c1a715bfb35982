"""What the providers' matchers share: a dataflow block's bindings as chains, and the vendor call.

A matcher gets the anchor binding (``var = call``) and returns ``(removed, last, (vendor call,
scale))`` -- the vars it folds into the call, the var the call's result replaces, and a constant
the result is multiplied with (or None) -- or None when the chain is not its to take (after
adding the reason to the report's ``kept`` list).

The operators of a chain's steps are TVM's dataflow patterns (``tvm.relax.dpl``), matched at a binding's value
through the block's bindings (a constant bound to a var, or reshaped, is still a constant). What a pattern cannot
say stays in Python beside it: shapes and dtypes, scalar constants within a tolerance, and that every intermediate
value is read only inside the chain and by no chain replaced already. A chain is matched from its anchor forward,
one step at a time (:meth:`Chains.follow` finds the step's binding): DPL matches an expression back through its
operands, never from a value to its users, so that walk to the next binding stays a walk.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.dpl import DFPattern, is_const, is_expr, is_op, wildcard

from ..host_arrays import as_numpy

#: the vendor calls' activation codes (ACT_GELU_TANH: GELU's tanh approximation, GPT-2's ``gelu_new``)
ACT_NONE, ACT_RELU, ACT_RELU6, ACT_GELU, ACT_GELU_TANH = 0, 1, 2, 3, 4
#: every activation code (a kernel's matcher passes the subset it computes)
ACTS = frozenset({ACT_NONE, ACT_RELU, ACT_RELU6, ACT_GELU, ACT_GELU_TANH})
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


def float32_bits(value: float) -> int:
    """``value`` as a float32's bits (an int attribute: a vendor call's ``attrs`` hold integers only)."""
    return struct.unpack("<I", struct.pack("<f", value))[0]


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


class Const:
    """A constant operand as the models spell it: a constant, or a reshape of one (the ONNX importer's biases and
    scalars), inline or bound to a var. A new one for each place in a pattern: DPL matches a node to one expression."""

    def __init__(self):
        self.data = is_const()
        self.pattern = self.data | is_op("relax.reshape")(self.data, wildcard())

    def array(self, matches) -> np.ndarray | None:
        """The matched constant, in the reshape's shape where it is reshaped (None where that shape is not static)."""
        data, operand = as_numpy(matches[self.data].value), matches[self.pattern]  # (read-only: the module's)
        if isinstance(operand, Constant):
            return data
        shape = known_shape(operand)
        return data.reshape(shape) if shape is not None else None


class Chains:
    """The bindings of one dataflow block, and how often each var is used in the whole function."""

    def __init__(self, block, uses):
        self.value = {b.var: b.value for b in block.bindings}
        self.var_of = {b.value: b.var for b in block.bindings}  # a matched value -> the var bound to it
        self.var2val = tvm.runtime.convert(self.value)  # what a pattern sees through (once per block, not per match)
        self.uses = uses
        self.claimed: set = set()  # vars of chains already replaced
        self.consumers: dict = {}  # var -> the bindings of this block that take it as an argument, in order
        for b in block.bindings:
            for a in operands(b.value):
                if isinstance(a, relax.Var):
                    self.consumers.setdefault(a, []).append(b.var)
        # vars the block outputs (a non-dataflow var, or a field of the tuple one is bound to): materialized anyway
        self.outputs: set = set()
        for b in block.bindings:
            if not isinstance(b.var, relax.DataflowVar):
                fields = b.value.fields if isinstance(b.value, relax.Tuple) else [b.value]
                self.outputs.update(f for f in fields if isinstance(f, relax.Var))
        self._const = Const()

    def output(self, var) -> bool:
        """Whether ``var`` leaves the block (itself or as a field of its output tuple: a decode step's logits, which
        its argmax reads too), so that it is written to memory whatever reads it inside."""
        return not isinstance(var, relax.DataflowVar) or var in self.outputs

    def single_use(self, var) -> bool:
        return self.uses.get(var, 0) == 1

    def match(self, pattern: DFPattern, expr):
        """The expressions ``pattern``'s nodes matched at ``expr``, seeing through this block's bindings; else None."""
        return pattern.extract_matched_expr(expr, self.var2val)

    def pin(self, var) -> DFPattern:
        """A pattern of ``var``'s value and no other: the chain's operand of a step, so that the pattern's other
        operand is checked on the step's other input (DPL tries a commutative add's operands in both orders)."""
        return is_expr(self.value.get(var, var))

    def const(self, expr) -> np.ndarray | None:
        """The constant behind ``expr`` (see :class:`Const`), else None."""
        m = self.match(self._const.pattern, expr)
        return self._const.array(m) if m is not None else None

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
        bias = Const()
        m = self.match(is_op("relax.add")(self.pin(produced), bias.pattern), add)
        c = bias.array(m) if m is not None else None
        if c is None or c.ndim > len(out_shape):
            return None
        aligned = (1,) * (len(out_shape) - c.ndim) + tuple(int(d) for d in c.shape)
        channels = out_shape[axis]
        if any(d != (channels if i == axis % len(out_shape) else 1) for i, d in enumerate(aligned)):
            return None
        return c.reshape(channels)

    def residual_of(self, add, produced, out_shape, dtype: str, computed: bool = True):
        """The other operand of ``add(produced, other)`` when it is a var of the output's own shape and dtype (a
        residual connection), else None. ``computed``: only a tensor the model computes (no constant) and that is
        no chain's already replaced (the convolution epilogues); else any such var (cuBLASLt adds it as its C)."""
        other = ~Const().pattern if computed else wildcard()
        if self.match(is_op("relax.add")(self.pin(produced), other), add) is None:
            return None
        other = other_operand(add, produced)
        if not isinstance(other, relax.Var) or known_shape(other) != tuple(out_shape) or dtype_of(other) != dtype:
            return None
        return None if computed and other in self.claimed else other


_RELU = is_op("relax.nn.relu")(wildcard())
_CLIP = is_op("relax.clip")(wildcard(), wildcard(), wildcard())


def activation(expr) -> int | None:
    """The activation code of ``expr``: a ReLU, or a clip to [0, 6] (ReLU6); else None."""
    if _RELU.match(expr):
        return ACT_RELU
    if _CLIP.match(expr):
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
    if val is not None and (bias is not None or not residual_needs_bias):
        residual = chains.residual_of(val, last, out_shape, dtype)
        if residual is not None:
            removed, last = removed + [last], nxt
            nxt, val = chains.follow(last)
    if val is not None and activation(val) is not None:
        act, removed, last = activation(val), removed + [last], nxt
    return removed, last, bias, residual, act


def _gelu(x: DFPattern):
    """The exact (erf) GELU of ``x``: ``relax.nn.gelu``, or the five operators ONNX exports spell it with,
    ``x * (1 + erf(x / sqrt(2))) * 0.5`` (torch.onnx, timm) or ``x * 0.5 * (1 + erf(x / sqrt(2)))`` (Hugging Face).
    Returns (pattern, its steps before the result, its scalar constants with the values they must have)."""
    root2, one = Const(), Const()
    div = is_op("relax.divide")(x, root2.pattern)
    erf = is_op("relax.erf")(div)
    plus_one = is_op("relax.add")(erf, one.pattern)
    pattern, products, half = _half_x_times(x, plus_one, "relax.nn.gelu")
    return pattern, (div, erf, plus_one, *products), {root2: 2 ** 0.5, one: 1.0, half: 0.5}


def _half_x_times(x: DFPattern, plus_one: DFPattern, op: str):
    """A GELU's last step, ``x * (1 + f(x)) * 0.5`` in either order exporters write it, or the operator ``op`` of
    ``x``: (pattern, its two products before the result, the 0.5 constant)."""
    half = Const()
    times_x, half_x = is_op("relax.multiply")(x, plus_one), is_op("relax.multiply")(x, half.pattern)
    pattern = (is_op(op)(x) | is_op("relax.multiply")(times_x, half.pattern)
               | is_op("relax.multiply")(half_x, plus_one))
    return pattern, (times_x, half_x), half


def _gelu_tanh(x: DFPattern):
    """GELU's tanh approximation of ``x`` (GPT-2's ``gelu_new``, cuBLASLt's GELU epilogue): ``relax.nn.gelu_tanh``
    (ONNX Gelu with approximate="tanh"), or ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`` as
    exporters spell it (the cube a ``Pow`` or ``x * x * x``). Returns what :func:`_gelu` does."""
    three, k, scale, one = Const(), Const(), Const(), Const()
    square = is_op("relax.multiply")(x, x)
    cube = is_op("relax.power")(x, three.pattern) | is_op("relax.multiply")(square, x)
    k_cube = is_op("relax.multiply")(cube, k.pattern)
    inner = is_op("relax.add")(x, k_cube)
    scaled = is_op("relax.multiply")(inner, scale.pattern)
    tanh = is_op("relax.tanh")(scaled)
    plus_one = is_op("relax.add")(tanh, one.pattern)
    pattern, products, half = _half_x_times(x, plus_one, "relax.nn.gelu_tanh")
    return (pattern, (square, cube, k_cube, inner, scaled, tanh, plus_one, *products),
            {three: 3.0, k: 0.044715, scale: (2 / np.pi) ** 0.5, one: 1.0, half: 0.5})


#: how far a scalar of the tanh GELU may be from its value: the exporters' constants rounded to the compute dtype
#: (fp16's 0.044715 is 0.0447082...); the erf form's are matched exactly, as the erf GELU always was
_ROUNDED = {"float32": 1e-6, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def gelu_of(chains, x):
    """``(removed, last, act)`` when every use of ``x`` is one GELU of it, exact (:func:`_gelu`, ``ACT_GELU``) or
    the tanh approximation (:func:`_gelu_tanh`, ``ACT_GELU_TANH``), else None: ``removed`` are the vars before the
    GELU's result, ``last`` the var holding it. Each intermediate is read only by the GELU, and no var of it is in a
    chain replaced already. The result is a user of ``x`` (``relax.nn.gelu``) or the consumer of one (the multiply
    after ``x * ...``), found by that step forward."""
    users = [v for v in chains.consumers.get(x, []) if v not in chains.claimed]
    if not users or chains.uses.get(x, 0) != len(users):
        return None
    forms = ((_gelu(chains.pin(x)), ACT_GELU, 1e-6),
             (_gelu_tanh(chains.pin(x)), ACT_GELU_TANH, _ROUNDED.get(dtype_of(x), 1e-6)))
    for root in users + [chains.follow(u)[0] for u in users]:
        for (pattern, steps, scalars), act, rel in forms:
            m = chains.match(pattern, chains.value[root]) if root is not None else None
            if m is None or not all(_near(c.array(m), target, rel) for c, target in scalars.items() if c.data in m):
                continue
            removed = [x] + list(dict.fromkeys(chains.var_of.get(m[step]) for step in steps if step in m))
            if (None not in removed and set(users) <= set(removed[1:]) | {root}
                    and all(chains.single_use(v) for v in removed[1:])
                    and not any(v in chains.claimed for v in removed + [root])):
                return removed, root, act
    return None


def _near(value, target: float, rel: float) -> bool:
    return value is not None and value.size == 1 and abs(float(value.reshape(())) - target) <= rel * abs(target)


@dataclass(frozen=True)
class Columns:
    """A matcher's call writes more columns than the chain's value has (a GEMM padded to aligned rows): the value is
    the first ``n`` of the last axis, a strided slice after the call (TVM fuses it into what reads it)."""

    n: int


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


@relax.expr_functor.mutator
class Substitute(relax.PyExprMutator):
    """An expression with the vars of ``var_map`` replaced by what it maps them to."""

    def __init__(self, var_map: dict):
        super().__init__()
        self.var_map = var_map

    def visit_var_(self, var):
        return self.var_map.get(var, var)

    def visit_dataflow_var_(self, var):
        return self.var_map.get(var, var)


def rewrite_dataflow_blocks(func: relax.Function, rewrite_block) -> tuple[relax.Function, int]:
    """``func`` with each dataflow block replaced by ``rewrite_block(block, uses)`` 's block (``uses``: the function's
    use counts), which also says how many rewrites it made; ``func`` itself where none made any."""
    uses = use_counts(func)
    blocks, made = [], 0
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        new, n = rewrite_block(block, uses)
        blocks.append(new)
        made += n
    if not made:
        return func, 0
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs,
                          func.span), made
