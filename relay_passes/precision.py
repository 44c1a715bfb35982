"""Precision: the names a build takes, the mixed-precision policy, and the pass that applies it.

A model is imported in float32. ``to_precision(mod, "float16")`` (or ``"bfloat16"``) rewrites it so
that the operators of :data:`REDUCED` compute in the reduced dtype, the operators of :data:`KEEP_FP32`
compute in float32, and every other operator follows its inputs (reduced when they all are, float32
otherwise), in the spirit of PyTorch autocast's op lists. Inputs and outputs keep the model's dtypes.
Every provider, TVM's kernels included, then sees operators in the dtype they compute in; a provider
accepts an operator when :func:`compute_dtype` is one of the dtypes it declares.

Why our own pass and not TVM's ``ToMixedPrecision``: TVM's pass knows float16 only (a bfloat16 run
stops at the first bias add, "Binary operators must have the same datatype"), its op lists live in
global op attributes a user cannot change for one build, and it keeps layer_norm in float16.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

#: the compute dtypes a build can ask for
DTYPES = ("float32", "float16", "bfloat16")

#: user-facing precision names -> (compute dtype, TF32 tensor cores for float32 GEMMs/convolutions)
PRECISIONS = {"fp32": ("float32", False), "tf32": ("float32", True),
              "fp16": ("float16", False), "bf16": ("bfloat16", False)}
#: the dtype spellings also taken as precision names
ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16"}

#: compute in the reduced dtype: the operators tensor cores make fast (vendor kernels accumulate in fp32)
REDUCED = ("conv1d", "conv2d", "conv3d", "conv2d_transpose", "matmul")
#: lookups in a constant table by runtime ids (an embedding): in the reduced dtype, like a GEMM's weight
LOOKUPS = ("relax.take", "relax.gather_elements", "relax.gather_nd")
#: compute in float32, output in the dtype their inputs had: softmax and normalizations, whose sums and
#: statistics need fp32 but whose outputs are as well rounded as any activation (as PyTorch's fp16
#: kernels do; TVM fuses the two casts into the operator's kernel)
FP32_MATH = ("softmax", "log_softmax", "layer_norm", "group_norm", "rms_norm", "batch_norm", "instance_norm")
#: of those, the ones whose TVM kernel already keeps its statistics in fp32 for float16 input (topi's
#: layer_norm): no casts around them in fp16, which would cost a kernel (TVM does not fuse the input cast)
FP32_INSIDE_FOR_FP16 = ("layer_norm",)
#: compute in float32, output float32 (cast down only where a reduced operator reads them): reductions and
#: the functions that overflow or lose digits in 16 bits
KEEP_FP32 = ("mean", "sum", "prod", "variance", "std", "cumsum", "exp", "log", "power", "cross_entropy_with_logits")


def precision_name(name: str) -> str:
    """The canonical precision name of ``name`` ("fp16" for "float16"); a ValueError for anything else."""
    canonical = ALIASES.get(name, name)
    if canonical not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
    return canonical


@dataclass(frozen=True)
class Policy:
    """Which operators compute in the reduced dtype, which compute in float32 (``fp32_math``: output in
    their inputs' dtype; ``keep_fp32``: output float32); op names without the ``relax.``/``relax.nn.``
    prefix, e.g. ``softmax``. Every other operator follows its inputs."""

    reduced: tuple[str, ...] = REDUCED
    fp32_math: tuple[str, ...] = FP32_MATH
    keep_fp32: tuple[str, ...] = KEEP_FP32

    def with_fp32(self, names) -> "Policy":
        """This policy with ``names`` moved to float32 (e.g. ``("matmul",)`` keeps every GEMM in fp32)."""
        names = (names,) if isinstance(names, str) else tuple(names)
        unknown = [n for n in names if not (isinstance(n, str) and _is_relax_op(n))]
        if unknown:
            raise ValueError(f"keep_fp32 takes Relax operator names such as matmul, conv2d or softmax; "
                             f"{unknown[0]!r} is none")
        return Policy(tuple(n for n in self.reduced if n not in names),
                      tuple(n for n in self.fp32_math if n not in names), tuple(dict.fromkeys(self.keep_fp32 + names)))

    def rule(self, op_name: str) -> str:
        """``reduced``, ``fp32_math``, ``fp32`` or ``follow`` for a Relax op name such as ``relax.nn.conv2d``."""
        short = op_name.rsplit(".", 1)[-1]
        if short in self.reduced:
            return "reduced"
        return "fp32_math" if short in self.fp32_math else "fp32" if short in self.keep_fp32 else "follow"

    def describe(self) -> str:
        return (f"reduced precision: {', '.join(self.reduced) or 'nothing'}; float32 math, output as its input: "
                f"{', '.join(self.fp32_math) or 'nothing'}; float32: {', '.join(self.keep_fp32)}; "
                "everything else follows its inputs")


def _is_relax_op(name: str) -> bool:
    for prefix in ("relax.", "relax.nn."):
        try:
            tvm.ir.Op.get(prefix + name)
            return True
        except Exception:  # noqa: BLE001 -- TVM raises its own error type for an unknown op
            continue
    return False


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


def to_precision(mod: tvm.IRModule, dtype: str, policy: Policy | None = None) -> tvm.IRModule:
    """``mod`` computing in ``dtype`` under ``policy`` (default :class:`Policy`); inputs and outputs keep
    their dtypes. The casts of float32 weights are folded into constants here, once, instead of by the
    ``FoldConstant`` of every later build (seconds each)."""
    if dtype not in DTYPES:
        raise ValueError(f"precision must be one of {DTYPES}, got {dtype!r}")
    if dtype == "float32":
        return mod
    out = tvm.IRModule({gv: (_MixedPrecision(mod, dtype, policy or Policy()).visit_expr(f)
                             if isinstance(f, relax.Function) else f) for gv, f in mod.functions.items()},
                       attrs=mod.attrs)
    return relax.transform.FoldConstant()(out)


#: numpy's spelling of each compute dtype (bfloat16 from ml_dtypes, which TVM's tensors take)
_NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _float_dtype(expr) -> str | None:
    ty = expr.ty
    if isinstance(ty, relax.TensorType) and str(ty.dtype) in DTYPES:
        return str(ty.dtype)
    return None


@relax.expr_functor.mutator
class _MixedPrecision(relax.PyExprMutator):
    """One forward walk: each call's float arguments are cast to the dtype its rule asks for (one cast
    per value and dtype, which TVM's fusion then folds into the consumer's kernel)."""

    def __init__(self, mod, dtype, policy):
        super().__init__(mod)
        self.dtype, self.policy = dtype, policy
        self.casts: dict[tuple, relax.Expr] = {}

    def _cast(self, arg, to: str):
        if isinstance(arg, relax.Tuple):
            return relax.Tuple([self._cast(f, to) for f in arg.fields])
        have = _float_dtype(arg)
        if have is None or have == to:
            return arg
        if isinstance(arg, Constant):  # cast here: FoldConstant leaves scalar casts, which hide a scale
            return relax.const(tvm.runtime.tensor(arg.value.numpy().astype(_NUMPY[to])))
        key = (arg, to)
        if key not in self.casts:
            self.casts[key] = self.builder_.emit(relax.op.astype(arg, to))
        return self.casts[key]

    def _leaves(self, args):
        for a in args:
            if isinstance(a, relax.Tuple):
                yield from self._leaves(a.fields)
            elif _float_dtype(a) is not None:
                yield a

    def _is_constant(self, expr, depth: int = 0) -> bool:
        """A constant, or a value computed from constants only (FoldConstant makes it one), e.g. a
        bias reshaped to [1, C, 1, 1]; read through the bindings this pass has emitted."""
        if isinstance(expr, Constant):
            return True
        if not isinstance(expr, relax.Var) or depth > 8:
            return False
        value = self.lookup_binding(expr)
        return isinstance(value, relax.Call) and all(
            self._is_constant(a, depth + 1) or isinstance(a, relax.ShapeExpr) for a in value.args)

    def _target(self, rule: str, args, reduced: bool | None, op_name: str) -> str | None:
        """The dtype the call computes in under ``rule`` (``reduced``: :meth:`_all_reduced` of ``args``),
        None to leave it as it is."""
        if rule == "reduced" or (op_name in LOOKUPS and reduced is None and any(
                isinstance(a, relax.Var) and not self._is_constant(a) for a in args)):
            return self.dtype  # (a lookup in a weight table by runtime ids: the table is a weight)
        if rule in ("fp32", "fp32_math"):
            return "float32"
        return None if reduced is None else self.dtype if reduced else "float32"

    def _all_reduced(self, args) -> bool | None:
        """Whether every non-constant float argument is in the reduced dtype; None when there are none
        (constants only: FoldConstant computes it, in the model's dtype)."""
        variables = [a for a in self._leaves(args) if not self._is_constant(a)]
        return all(_float_dtype(a) == self.dtype for a in variables) if variables else None

    def visit_call_(self, call):
        args = [self.visit_expr(a) for a in call.args]  # the rewritten arguments, before any type inference
        back = None
        if isinstance(call.op, tvm.ir.Op) and call.op.name != "relax.astype":
            rule = self.policy.rule(call.op.name)
            if rule == "fp32_math" and self.dtype == "float16" and call.op.name.rsplit(".", 1)[-1] in FP32_INSIDE_FOR_FP16:
                rule = "follow"
            reduced = self._all_reduced(args)
            back = self.dtype if rule == "fp32_math" and reduced else None
            to = self._target(rule, args, reduced, call.op.name)
            if to is not None:
                args = [self._cast(a, to) for a in args]
        if all(a.same_as(b) for a, b in zip(args, call.args)):
            return call
        new = relax.Call(call.op, args, call.attrs, call.ty_args, call.span)
        if back is not None and isinstance(call.ty, relax.TensorType):  # fp32 math, output as its inputs
            return relax.op.astype(self.builder_.emit(new), back)
        return new

    def visit_var_binding_(self, binding):
        if isinstance(binding.var, relax.DataflowVar):
            return super().visit_var_binding_(binding)
        # a function's outputs (the dataflow block's output vars) keep the model's dtypes
        value = self._restore(self.builder_.normalize(self.visit_expr(binding.value)), binding.var.ty)
        self.set_var_remap(binding.var, self.builder_.emit_output(value, binding.var.name))

    def _restore(self, value, before):
        if isinstance(before, relax.TensorType):
            have = _float_dtype(value)
            return relax.op.astype(self.builder_.emit(value), str(before.dtype)) \
                if have is not None and have != str(before.dtype) else value
        if isinstance(before, relax.TupleType) and isinstance(value, relax.Tuple):
            return relax.Tuple([self._restore(f, b) for f, b in zip(value.fields, before.fields)])
        return value
