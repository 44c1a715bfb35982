"""RMSNorm as one operator: ``weight * (x / sqrt(mean(x * x, -1) + eps))``, as an ONNX export of Llama, Qwen2 or
Mistral spells it out (Pow or Mul, ReduceMean, Add, Sqrt, Reciprocal, two Muls, a no-op Cast), becomes
``R.nn.rms_norm(x, weight, axes=[-1], epsilon=eps)``.

Why: TVM's FuseOps never fuses an elementwise producer into a reduction, so the spelled-out form is two kernels
per norm (the square, then the mean with the rest), two norms a decoder layer; ``rms_norm`` is one kernel. The
rewrite runs after the precision pass (the norm computes in the dtype the policy gave the spelled-out form, float32
in a reduced-precision build, as PyTorch's LlamaRMSNorm does), through TVM's dataflow patterns (``tvm.relax.dpl``).
"""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.dpl import is_const, is_op, wildcard

from .light_rewrite import rewrite_call_light


def _either(op: str, a, b):
    """``op(a, b)`` or ``op(b, a)``."""
    return is_op(op)(a, b) | is_op(op)(b, a)


def _pattern():
    x, weight, eps, two, one = wildcard(), wildcard(), is_const(), is_const(), is_const()
    square = is_op("relax.multiply")(x, x) | is_op("relax.power")(x, two)
    mean = is_op("relax.mean")(square)
    root = is_op("relax.sqrt")(is_op("relax.add")(mean, eps))
    inverse = is_op("relax.divide")(one, root) | is_op("relax.rsqrt")(is_op("relax.add")(mean, eps))
    normed = _either("relax.multiply", x, inverse) | is_op("relax.divide")(x, root)
    normed = normed | is_op("relax.astype")(normed)
    out = _either("relax.multiply", weight, normed)
    return out, dict(x=x, weight=weight, eps=eps, two=two, one=one, mean=mean, normed=normed)


def _scalar(expr) -> float | None:
    data = expr.value.numpy() if isinstance(expr, Constant) else None
    return float(data) if data is not None and data.size == 1 else None


def _rewriter(parts):
    def rewrite(expr, matches):
        x, weight, mean = matches[parts["x"]], matches[parts["weight"]], matches[parts["mean"]]
        xs, ws = x.ty, weight.ty
        if not (isinstance(xs, relax.TensorType) and isinstance(ws, relax.TensorType)) or xs.ndim < 1:
            return expr
        axis = [int(a) for a in mean.attrs.axis] if mean.attrs.axis is not None else None
        if axis not in ([-1], [xs.ndim - 1]) or not bool(mean.attrs.keepdims):
            return expr
        if str(xs.dtype) != str(ws.dtype) or str(expr.ty.dtype) != str(xs.dtype) or ws.ndim != 1:
            return expr  # (a weight in another dtype would change where the product rounds)
        if parts["two"] in matches and _scalar(matches[parts["two"]]) != 2.0:
            return expr
        if parts["one"] in matches and _scalar(matches[parts["one"]]) != 1.0:
            return expr
        eps = _scalar(matches[parts["eps"]])
        if eps is None or eps < 0:
            return expr
        return relax.op.nn.rms_norm(x, weight, axes=[-1], epsilon=eps)
    return rewrite


@relax.transform.function_pass(opt_level=0, name="FuseRmsNorm")
class FuseRmsNorm:
    """Every spelled-out RMSNorm over the last axis, in every Relax function of the module, as ``R.nn.rms_norm``."""

    def __init__(self):
        pattern, parts = _pattern()
        self.pattern, self.rewrite = pattern, _rewriter(parts)

    def transform_function(self, func, _mod, _ctx):
        new = rewrite_call_light(self.pattern, self.rewrite, func)
        return func if new.same_as(func) else relax.analysis.remove_all_unused(new)


def fuse_rms_norm(mod: tvm.IRModule) -> tvm.IRModule:
    return FuseRmsNorm()(mod)
