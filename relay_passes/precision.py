"""Precision: the names a build takes, the mixed-precision policy, and the pass that applies it.

A model is imported in float32. ``to_precision(mod, "float16")`` (or ``"bfloat16"``) rewrites it so
that the operators of :data:`REDUCED` compute in the reduced dtype, the operators of :data:`KEEP_FP32`
compute in float32, and every other operator follows its inputs (reduced when they all are, float32
otherwise), in the spirit of PyTorch autocast's op lists. Inputs and outputs keep the model's dtypes.
Every provider, TVM's kernels included, then sees operators in the dtype they compute in; a provider
accepts an operator when :func:`compute_dtype` is one of the dtypes it declares.

Element-wise chains (a bias add, GELU spelled as divide/erf/add/multiply/multiply, ReLU, a residual
add) that are left on TVM's kernels after the providers took theirs compute in float32 in the dtypes
of :attr:`Policy.elementwise_fp32` (float16 and bfloat16 by default): :func:`widen_elementwise`, the first pass of
the lowering, casts their reduced inputs up and rounds the value to the reduced dtype once, where it
leaves the chain, as PyTorch's fused kernels (and cuDNN's / cuBLASLt's epilogues) do. It runs after
the vendor offload, which therefore matches the same bf16 chains as before, and rounds every result,
so that FuseOps makes the same kernels; :func:`round_once_per_kernel`, after FuseOps, drops the roundings
inside each kernel. ``to_precision`` only records the request on the function (:data:`ATTR_ELEMENTWISE_FP32`).

Why our own pass and not TVM's ``ToMixedPrecision``: TVM's pass knows float16 only (a bfloat16 run
stops at the first bias add, "Binary operators must have the same datatype"), its op lists live in
global op attributes a user cannot change for one build, and it keeps layer_norm in float16.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant

from tvm_nimble import env

from .fold_constants import BatchedFoldConstant
from .host_arrays import aligned_empty, as_numpy, as_tensor

#: the compute dtypes a build can ask for
DTYPES = ("float32", "float16", "bfloat16")
#: the reduced (16-bit) ones among them
REDUCED_DTYPES = ("float16", "bfloat16")

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
#: layer_norm): they follow their input in fp16, without casts around them, which would cost a kernel
#: (TVM does not fuse the input cast); ``Policy.follow_in_fp16``
FP32_INSIDE_FOR_FP16 = ("layer_norm",)
#: compute in float32, output float32 (cast down only where a reduced operator reads them): reductions and
#: the functions that overflow or lose digits in 16 bits
KEEP_FP32 = ("mean", "sum", "prod", "variance", "std", "cumsum", "exp", "log", "power", "cross_entropy_with_logits")
#: element-wise arithmetic that, in the dtypes of ``Policy.elementwise_fp32``, computes in float32 on its
#: reduced inputs, the value rounded to the reduced dtype once where its chain ends (:func:`widen_elementwise`);
#: data movement (reshape, concat, pools, where) rounds nothing and is not listed
ELEMENTWISE = ("add", "subtract", "multiply", "divide", "negative", "abs", "square", "sqrt", "rsqrt", "erf",
               "tanh", "sigmoid", "relu", "leakyrelu", "clip", "gelu", "gelu_tanh", "silu", "maximum", "minimum")
#: the reduced dtypes whose element-wise chains compute in float32 by default. bfloat16 (8 bits of
#: mantissa): rounding after every operator of a GELU or a bias + residual chain is what made its error
#: twice PyTorch's on the H100. float16 too: on llvm (whose half arithmetic rounds every operator) it lowers
#: the zoo nets' fp16 error by 4-15%, at no cost in kernels or in the dtypes between them
ELEMENTWISE_FP32 = REDUCED_DTYPES
#: the function attribute by which ``to_precision`` asks :func:`widen_elementwise` for fp32 element-wise
#: chains: ``"<reduced dtype>:<op>,<op>,..."``
ATTR_ELEMENTWISE_FP32 = "nimble_elementwise_fp32"


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
    prefix, e.g. ``softmax``. Every other operator follows its inputs.

    ``elementwise_fp32``: the reduced dtypes in which the ``elementwise`` operators compute in float32,
    each chain of them rounded once where it ends (True: float16 and bfloat16; False: none, every
    operator rounds its output, the policy before issue #31). ``follow_in_fp16``: of ``fp32_math``, the
    operators that follow their input in float16 (their TVM kernel keeps its statistics in fp32)."""

    reduced: tuple[str, ...] = REDUCED
    fp32_math: tuple[str, ...] = FP32_MATH
    keep_fp32: tuple[str, ...] = KEEP_FP32
    elementwise: tuple[str, ...] = ELEMENTWISE
    elementwise_fp32: tuple[str, ...] = ELEMENTWISE_FP32
    follow_in_fp16: tuple[str, ...] = FP32_INSIDE_FOR_FP16

    def __post_init__(self):
        wide = self.elementwise_fp32
        wide = REDUCED_DTYPES if wide is True else () if wide in (False, None) else \
            (wide,) if isinstance(wide, str) else tuple(wide)
        wide = tuple(dict.fromkeys(PRECISIONS.get(ALIASES.get(w, w), (w,))[0] for w in wide))  # bf16 -> bfloat16
        bad = [w for w in wide if w not in REDUCED_DTYPES]
        if bad:
            raise ValueError(f"elementwise_fp32 takes reduced dtypes (float16, bfloat16), True or False; got {bad[0]!r}")
        object.__setattr__(self, "elementwise_fp32", wide)

    def with_fp32(self, names) -> "Policy":
        """This policy with ``names`` moved to float32 (e.g. ``("matmul",)`` keeps every GEMM in fp32)."""
        names = (names,) if isinstance(names, str) else tuple(names)
        unknown = [n for n in names if not (isinstance(n, str) and _is_relax_op(n))]
        if unknown:
            raise ValueError(f"keep_fp32 takes Relax operator names such as matmul, conv2d or softmax; "
                             f"{unknown[0]!r} is none")
        return replace(self, reduced=tuple(n for n in self.reduced if n not in names),
                       fp32_math=tuple(n for n in self.fp32_math if n not in names),
                       keep_fp32=tuple(dict.fromkeys(self.keep_fp32 + names)))

    def rule(self, op_name: str, dtype: str | None = None) -> str:
        """``reduced``, ``fp32_math``, ``fp32`` or ``follow`` for a Relax op name such as ``relax.nn.conv2d``
        in a build computing in ``dtype``."""
        short = op_name.rsplit(".", 1)[-1]
        if short in self.reduced:
            return "reduced"
        if short in self.fp32_math:
            return "follow" if dtype == "float16" and short in self.follow_in_fp16 else "fp32_math"
        return "fp32" if short in self.keep_fp32 else "follow"

    def describe(self) -> str:
        wide = " and ".join(ALIASES[d] for d in self.elementwise_fp32)
        return (f"reduced precision: {', '.join(self.reduced) or 'nothing'}; float32 math, output as its input: "
                f"{', '.join(self.fp32_math) or 'nothing'}; float32: {', '.join(self.keep_fp32)}; "
                "everything else follows its inputs" +
                (f"; element-wise chains in float32, rounded once, in {wide}" if wide else ""))


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


def to_precision(mod: tvm.IRModule, dtype: str, policy: Policy | None = None, fold: bool = True,
                 narrowed_weights: dict | None = None) -> tvm.IRModule:
    """``mod`` computing in ``dtype`` under ``policy`` (default :class:`Policy`); inputs and outputs keep
    their dtypes. The casts of float32 weights are folded into constants here, once, instead of by the
    ``FoldConstant`` of every later build (seconds each); ``fold=False`` leaves them (what the folding gets).
    ``narrowed_weights``: a dict kept between calls whose modules bind the same weight tensors (a generator's
    steps): each is narrowed once (see :func:`narrowed_constant`)."""
    if dtype not in DTYPES:
        raise ValueError(f"precision must be one of {DTYPES}, got {dtype!r}")
    if dtype == "float32":
        return mod
    policy = policy or Policy()
    wide = f"{dtype}:{','.join(policy.elementwise)}" if dtype in policy.elementwise_fp32 else None

    def convert(f):
        f = _MixedPrecision(mod, dtype, policy, narrowed_weights).visit_expr(f)
        return f.with_attr(ATTR_ELEMENTWISE_FP32, wide) if wide else f

    out = tvm.IRModule({gv: convert(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions.items()},
                       attrs=mod.attrs)
    if not fold:
        return out
    return relax.transform.FoldConstant()(BatchedFoldConstant()(out))  # one LLVM build per round, not per cast


_CALL_TIR = tvm.ir.Op.get("relax.call_tir")

#: numpy's spelling of each compute dtype (bfloat16 from ml_dtypes, which TVM's tensors take)
_NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _float_dtype(expr) -> str | None:
    ty = expr.ty
    if isinstance(ty, relax.TensorType) and str(ty.dtype) in DTYPES:
        return str(ty.dtype)
    return None


#: a float32 value at least this large in magnitude stands for an infinity (see :func:`narrowed`)
SENTINEL = float(np.finfo(np.float32).max) / 2
#: elements a thread of :func:`narrowed` takes at least: a decoder's weights (0.5B of them: ~3 s of one core's
#: casts) are cast in chunks on :func:`tvm_nimble.env.jobs` threads (numpy's casts and reductions release the GIL)
CHUNK_ELEMENTS = 1 << 22


def narrowed(value: np.ndarray, to: str) -> np.ndarray:
    """``value`` in the float dtype ``to``, float32's extreme values (``SENTINEL`` and over, in magnitude)
    saturated to its finite range: an attention mask's finfo(float32).min (what Hugging Face exports add for a
    masked key) is -inf in float16, and a query whose keys are all masked (a left-padded position) then has a
    softmax of -inf - (-inf) = NaN, where float32 gives a finite row. Saturated, the row stays finite as in float32.
    Any other value over the dtype's range is a real number the dtype cannot hold: it overflows to infinity, which
    the build's accuracy check reports, rather than becoming a wrong finite number."""
    dtype = _NUMPY[to]
    value = value if value.flags.c_contiguous else value.copy(order="C")  # (ascontiguousarray makes a scalar 1-D)
    flat = value.reshape(-1)
    if np.issubdtype(value.dtype, np.floating) and value.dtype.itemsize > np.dtype(dtype).itemsize and value.size:
        # (two reads that skip NaN and copy nothing: a weight has no extreme value, and is only cast)
        ranges = _in_chunks(lambda c: (np.fmax.reduce(flat[c]), np.fmin.reduce(flat[c])), value.size)
        if max(hi for hi, _ in ranges) >= SENTINEL or min(lo for _, lo in ranges) <= -SENTINEL:
            info = ml_dtypes.finfo(dtype)
            extreme = np.isfinite(value) & (np.abs(value) >= SENTINEL)
            value = np.where(extreme, np.sign(value) * float(info.max), value)
            flat = value.reshape(-1)
    out = aligned_empty(value.shape, dtype)  # (TVM takes it as it is: narrowed_constant)
    out_flat = out.reshape(-1)
    _in_chunks(lambda c: np.copyto(out_flat[c], flat[c], casting="unsafe"), value.size)
    return out


def _in_chunks(fn, n: int) -> list:
    """``fn`` of each slice of ``n`` elements: at most :func:`tvm_nimble.env.jobs` slices of at least
    :data:`CHUNK_ELEMENTS`, on as many threads (a small tensor: one slice, on this one)."""
    parts = max(1, min(env.jobs(), n // CHUNK_ELEMENTS))
    bounds = [n * i // parts for i in range(parts + 1)]
    chunks = [slice(a, b) for a, b in zip(bounds, bounds[1:])]
    if parts == 1:
        return [fn(chunks[0])]
    with ThreadPoolExecutor(parts) as pool:
        return list(pool.map(fn, chunks))


def narrowed_constant(value, to: str, memo: dict | None = None):
    """The tensor ``value`` (a constant's) :func:`narrowed` to ``to``, as a TVM tensor; with ``memo``, once per source
    tensor (by its data, which the memo keeps alive so that the address is not reused) and dtype."""
    key = (value.data_ptr(), tuple(value.shape), str(value.dtype), to)
    if memo is not None and key in memo:
        return memo[key][1]
    out = as_tensor(narrowed(as_numpy(value), to))
    if memo is not None:
        memo[key] = (value, out)
    return out


def _saturated_extremes(x: relax.Expr, have: str, to) -> relax.Expr:
    """``x`` with its values of magnitude ``SENTINEL`` and over replaced by ``to``'s largest finite value, sign kept
    (what :func:`narrowed` does to a constant; ``x`` is computed from constants, so FoldConstant evaluates this)."""
    top = float(ml_dtypes.finfo(to).max)

    def const(v):
        return relax.const(v, have)

    low = relax.op.where(relax.op.less_equal(x, const(-SENTINEL)), const(-top), x)
    return relax.op.where(relax.op.greater_equal(low, const(SENTINEL)), const(top), low)


@relax.expr_functor.mutator
class _MixedPrecision(relax.PyExprMutator):
    """One forward walk: each call's float arguments are cast to the dtype its rule asks for (one cast
    per value and dtype, which TVM's fusion then folds into the consumer's kernel)."""

    def __init__(self, mod, dtype, policy, narrowed_weights: dict | None = None):
        super().__init__(mod)
        self.dtype, self.policy, self.narrowed_weights = dtype, policy, narrowed_weights
        self.casts: dict[tuple, relax.Expr] = {}

    def _cast(self, arg, to: str):
        if isinstance(arg, relax.Tuple):
            return relax.Tuple([self._cast(f, to) for f in arg.fields])
        have = _float_dtype(arg)
        if have is None or have == to:
            return arg
        if isinstance(arg, Constant):  # cast here: FoldConstant leaves scalar casts, which hide a scale
            return relax.const(narrowed_constant(arg.value, to, self.narrowed_weights))
        key = (arg, to)
        if key not in self.casts:
            source = arg
            if np.dtype(_NUMPY[to]).itemsize < np.dtype(_NUMPY[have]).itemsize and self._is_constant(arg):
                # a value computed from constants (a causal mask's where(.., 0, finfo.min)), which FoldConstant
                # casts: its extreme values saturated as narrowed() saturates a constant's
                source = self.builder_.emit(_saturated_extremes(arg, have, _NUMPY[to]))
            self.casts[key] = self.builder_.emit(relax.op.astype(source, to))
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
        if call.op.same_as(_CALL_TIR) and isinstance(call.args[1], relax.Tuple):
            # an opaque TE call (TVM's ONNX importer writes Pad as one): its PrimFunc takes the dtypes it was made
            # for, so its inputs keep them. Cast to fp16 instead, nasnetalarge's padded inputs failed in FuseTIR
            # ("Inconsistent buffers ... mapped to the same relax var"); its output keeps its dtype too
            args[1] = relax.Tuple([self._cast(a, _float_dtype(b)) if _float_dtype(b) else a
                                   for a, b in zip(args[1].fields, call.args[1].fields)])
        elif isinstance(call.op, tvm.ir.Op) and call.op.name != "relax.astype":
            rule = self.policy.rule(call.op.name, self.dtype)
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


# ---- element-wise chains in float32 ------------------------------------------------------------------
#: the module attribute by which :func:`widen_elementwise` asks :func:`round_once_per_kernel` to take the
#: roundings inside each fused kernel out
ATTR_ROUND_ONCE = "nimble_round_once"


@tvm.transform.module_pass(opt_level=0, name="nimble.WidenElementwise")
def widen_elementwise(mod: tvm.IRModule, _ctx=None) -> tvm.IRModule:
    """The element-wise operators of every function ``to_precision`` marked (:data:`ATTR_ELEMENTWISE_FP32`)
    computing in float32: each listed operator computing in the reduced dtype gets its reduced inputs cast
    up (one cast per use, so that each fuses into its reader's kernel) and its value rounded back, bound
    to the same var. The graph keeps its dtypes, so TVM's FuseOps makes the same kernels as without it;
    :func:`round_once_per_kernel` then removes the rounding of every value that stays inside one kernel,
    and a chain is rounded once, where it leaves its kernel. The lowering's first pass, after the vendor
    offload took its chains (whose epilogues compute in fp32 in cuDNN / cuBLASLt)."""
    updates = {}
    for gv, func in mod.functions.items():
        mark = func.attrs.get(ATTR_ELEMENTWISE_FP32) if isinstance(func, relax.Function) and func.attrs else None
        if mark is None:
            continue
        dtype, names = str(mark).split(":", 1)
        ops = {f"{prefix}{o}" for o in names.split(",") for prefix in ("relax.", "relax.nn.")}
        updates[gv] = _Widen(mod, dtype, ops, func).visit_expr(func).without_attr(ATTR_ELEMENTWISE_FP32)
    if not updates:
        return mod
    mod = mod.clone()
    for gv, func in updates.items():
        mod[gv] = func
    return mod.with_attr(ATTR_ROUND_ONCE, 1)


def _reads(expr, into: list) -> list:
    if isinstance(expr, relax.Var):
        into.append(expr)
    elif isinstance(expr, relax.Tuple):
        for f in expr.fields:
            _reads(f, into)
    elif isinstance(expr, relax.TupleGetItem):
        _reads(expr.tuple_value, into)
    elif isinstance(expr, relax.Call):
        for a in expr.args:
            _reads(a, into)
    return into


def _values_and_uses(func: relax.Function) -> tuple[dict, dict]:
    """({var: the value bound to it}, {var: how many times it is read}) of ``func``'s bindings."""
    values, uses = {}, {}
    for block in func.body.blocks:
        for b in block.bindings:
            values[b.var] = b.value
            for v in _reads(b.value, []):
                uses[v] = uses.get(v, 0) + 1
    for v in _reads(func.body.body, []):
        uses[v] = uses.get(v, 0) + 1
    return values, uses


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    def __init__(self, mod, dtype, ops, func):
        super().__init__(mod)
        self.dtype, self.ops = dtype, ops
        self.values, self.uses = _values_and_uses(func)

    def _listed(self, value) -> bool:
        return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in self.ops
                and compute_dtype(value) == self.dtype)

    def _anchors(self, var, depth: int = 0) -> frozenset:
        """The producers other than element-wise operators and casts (a convolution, a pool, a reshape) that
        FuseOps may put in one kernel with the reader of ``var``: ``var`` itself when it is read once, or
        through the element-wise operators it is computed by; none for a value read several times."""
        value = self.values.get(var)
        if not isinstance(var, relax.DataflowVar) or self.uses.get(var, 0) != 1 or not isinstance(value, relax.Call):
            return frozenset()
        if depth < 32 and isinstance(value.op, tvm.ir.Op) and (self._listed(value) or value.op.name == "relax.astype"):
            return frozenset().union(*(self._anchors(a, depth + 1) for a in value.args))
        return frozenset([var])

    def _widens(self, binding) -> bool:
        """A listed operator computing in the reduced dtype whose operands come from at most one other
        kernel's producer: with two (an add of two convolutions' outputs), one of them is another kernel's
        output and its cast to float32 would end up there, a float32 tensor between kernels."""
        value = binding.value
        return (isinstance(binding.var, relax.DataflowVar) and self._listed(value)
                and len(frozenset().union(*(self._anchors(a) for a in value.args))) <= 1)

    def _up(self, arg):
        if _float_dtype(arg) != self.dtype:
            return arg
        if isinstance(arg, Constant):
            return relax.const(tvm.runtime.tensor(arg.value.numpy().astype(np.float32)))
        return self.builder_.emit(relax.op.astype(arg, "float32"))

    def _accumulating_in_fp32(self, value):
        """A convolution or GEMM left on TVM's kernels (the vendor offload ran before), computing in the
        reduced dtype, as the same operator with a float32 output: TVM's CUDA schedules keep the
        accumulator in the output dtype, so without this a bf16 GEMM sums K products in bf16. None for
        anything else. The rounding after it fuses into the kernel's epilogue."""
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name in ("relax.nn.conv2d", "relax.matmul") and compute_dtype(value) == self.dtype
                and _float_dtype(value) == self.dtype):
            return None
        args = [self.visit_expr(a) for a in value.args]
        if value.op.name == "relax.matmul":
            return relax.op.matmul(*args, out_dtype="float32")
        a = value.attrs
        return relax.op.nn.conv2d(*args, strides=a.strides, padding=a.padding, dilation=a.dilation, groups=a.groups,
                                  data_layout=a.data_layout, kernel_layout=a.kernel_layout, out_layout=a.out_layout,
                                  out_dtype="float32")

    def visit_var_binding_(self, binding):
        value = binding.value
        wide = self._accumulating_in_fp32(value)
        if wide is not None:
            wide = self.builder_.emit(wide, binding.var.name + "_fp32")
            self.set_var_remap(binding.var, self.builder_.emit(relax.op.astype(wide, self.dtype), binding.var.name))
        elif self._widens(binding):
            args = [self._up(self.visit_expr(a)) for a in value.args]
            wide = self.builder_.emit(relax.Call(value.op, args, value.attrs, value.ty_args, value.span),
                                      binding.var.name + "_fp32")
            self.set_var_remap(binding.var, self.builder_.emit(relax.op.astype(wide, self.dtype), binding.var.name))
        else:
            super().visit_var_binding_(binding)


#: data movement that a cast commutes with exactly (it moves the elements, rounds none)
MOVES = ("relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims", "relax.flatten")


@tvm.transform.module_pass(opt_level=0, name="nimble.HoistCasts")
def hoist_casts(mod: tvm.IRModule, _ctx=None) -> tvm.IRModule:
    """Every narrowing cast read through data movement (:data:`MOVES`) moved in front of it: ``astype(reshape(
    permute_dims(mean(x))))`` becomes ``reshape(permute_dims(astype(mean(x))))``. The values are the same, bit for
    bit; the cast now sits on its producer and fuses into its kernel, and the movement of a tensor with unit
    axes is a view. A half-precision classifier's input (the fp32 mean, the permutation back from channels-last,
    the flattening reshape, the cast to the GEMM's dtype) was a kernel of its own, on every model's longest chain."""
    updates = {gv: _Hoist(mod, func).visit_expr(func) for gv, func in mod.functions.items()
               if isinstance(func, relax.Function)}
    if not updates:
        return mod
    mod = mod.clone()
    for gv, func in updates.items():
        mod[gv] = relax.analysis.remove_all_unused(func)
    return mod


@relax.expr_functor.mutator
class _Hoist(relax.PyExprMutator):
    def __init__(self, mod, func):
        super().__init__(mod)
        self.values, self.uses = _values_and_uses(func)

    def _moved(self, var) -> list:
        """The data movement ``var`` is computed by, outermost first, each read once (by the next)."""
        chain = []
        value = self.values.get(var)
        while (self.uses.get(var, 0) == 1 and isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
               and value.op.name in MOVES and isinstance(value.args[0], relax.Var)):
            chain.append(value)
            var = value.args[0]
            value = self.values.get(var)
        return chain

    def visit_var_binding_(self, binding):
        value = binding.value
        if not (isinstance(binding.var, relax.DataflowVar) and isinstance(value, relax.Call)
                and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.astype"
                and isinstance(value.args[0], relax.Var)):
            return super().visit_var_binding_(binding)
        chain = self._moved(value.args[0])
        to, have = str(value.attrs.dtype), _float_dtype(value.args[0])
        narrows = have is not None and np.dtype(_NUMPY.get(to, to)).itemsize < np.dtype(_NUMPY.get(have, have)).itemsize
        if not chain or not narrows:
            return super().visit_var_binding_(binding)
        out = self.builder_.emit(relax.op.astype(self.visit_expr(chain[-1].args[0]), to))
        for move in reversed(chain):
            out = self.builder_.emit(relax.Call(move.op, [out, *move.args[1:]], move.attrs, move.ty_args, move.span))
        self.set_var_remap(binding.var, out)


@tvm.transform.module_pass(opt_level=0, name="nimble.RoundOncePerKernel")
def round_once_per_kernel(mod: tvm.IRModule, _ctx=None) -> tvm.IRModule:
    """After FuseOps, in a module :func:`widen_elementwise` rewrote: inside each fused function, a float32
    value rounded to a 16-bit dtype and cast back to float32 for a reader in the same kernel is read as
    it was, unrounded. Only values that leave the kernel (the fused function's outputs) are rounded, so
    no float32 tensor crosses a kernel boundary that did not before."""
    if not (mod.attrs and mod.attrs.get(ATTR_ROUND_ONCE)):
        return mod
    updates = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs and func.attrs.get("Primitive"):
            new = _RoundOnce(mod).visit_expr(func)
            if not new.same_as(func):
                updates[gv] = relax.analysis.remove_all_unused(new)
    mod = mod.without_attr(ATTR_ROUND_ONCE)
    if updates:
        mod = mod.clone()
        for gv, func in updates.items():
            mod[gv] = func
    return mod


def _cast_of(mod, value):
    """(input, output dtype) when ``value`` calls a legalized ``astype`` kernel (``call_tir(cast*, (x,))``)."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.call_tir"):
        return None
    callee, args = value.args[0], value.args[1]
    if not (isinstance(callee, relax.GlobalVar) and callee.name_hint.startswith("cast")
            and isinstance(args, relax.Tuple) and len(args.fields) == 1):
        return None
    x = args.fields[0]
    if _float_dtype(x) is None or _float_dtype(value) is None or x.ty.shape is None or value.ty.shape is None:
        return None
    if not tvm_ffi.structural_equal(x.ty.shape, value.ty.shape):
        return None
    return x, _float_dtype(value)


@relax.expr_functor.mutator
class _RoundOnce(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.mod = mod
        self.down: dict = {}  # a 16-bit var rounded from float32 -> that float32 value

    def visit_var_binding_(self, binding):
        cast = _cast_of(self.mod, binding.value)
        if cast is not None:
            x, to = cast
            x = self.visit_expr(x)
            if to in REDUCED_DTYPES and _float_dtype(x) == "float32":
                self.down[binding.var] = x
            elif to == "float32" and binding.value.args[1].fields[0] in self.down:
                self.set_var_remap(binding.var, self.down[binding.value.args[1].fields[0]])
                return
        super().visit_var_binding_(binding)
