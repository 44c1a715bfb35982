"""LayerNorm over the last axis as one kernel of the vendor extension (``nimble.norm.layer_norm``).

    [astype(float32)] -> layer_norm(x, gamma, beta, axes=[-1]) -> [astype(16-bit)]

gamma and beta must be constants. The casts are what the mixed-precision policy puts around a
16-bit model's LayerNorm (statistics in float32): the call takes the 16-bit tensor and float32
parameters, computes in float32 and writes the 16-bit result, so both casts disappear with the
chain.

Not used unless named (``providers=(..., "layer_norm")``): ``kernels="best"`` measured TVM's LayerNorm
faster inside ViT-S, ViT-B and BERT-base and kept it everywhere (see benchmarks/findings.md, 'GEMMs at
batch 1, build times, bf16 accuracy'), and a provider that loses every measurement would only be taken
unmeasured by ``kernels="vendor"``.
"""
from __future__ import annotations

from tvm import relax

from tvm_nimble.contract import vendor_abi

from ..precision import DTYPES, REDUCED_DTYPES
from .chains import dtype_of, float32_bits, ints, known_shape, operator_of
from .registry import Provider, register

LAYER_NORM = vendor_abi.NORM_LAYER_NORM
MAX_CHANNELS = 1024  # codegen/vendor/layer_norm.cu: kMaxC


def _cast_from_half(chains, expr):
    """The 16-bit tensor ``expr`` is a cast of to float32, when that cast is read only here, else None."""
    value = chains.value.get(expr) if isinstance(expr, relax.Var) else None
    if operator_of(value) != "relax.astype" or dtype_of(expr) != "float32" or not chains.single_use(expr):
        return None
    src = value.args[0]
    return src if dtype_of(src) in REDUCED_DTYPES else None


def layer_norm_chain(ctx, chains, var, call):
    data, gamma, beta = call.args
    shape, dtype = known_shape(call), dtype_of(call)
    attrs = call.attrs
    axes = ints(attrs.axes)
    g, b = chains.const(gamma), chains.const(beta)
    if (shape is None or dtype not in DTYPES or len(axes) != 1 or axes[0] % len(shape) != len(shape) - 1
            or not attrs.center or not attrs.scale):
        ctx.report.kept.append(("layer_norm", "only a static fp32/fp16/bf16 LayerNorm over the last axis, with "
                                              "scale and centre"))
        return None
    channels = shape[-1]
    if g is None or b is None or g.shape != (channels,) or b.shape != (channels,):
        ctx.report.kept.append(("layer_norm", "gamma and beta are not constant vectors of the last axis"))
        return None
    if channels > MAX_CHANNELS:
        ctx.report.kept.append(("layer_norm", f"a last axis over {MAX_CHANNELS} elements"))
        return None
    removed, last, x, out_dtype = [], var, data, dtype
    src = _cast_from_half(chains, data)
    nxt, val = chains.follow(var)
    if src is not None and operator_of(val) == "relax.astype" and dtype_of(nxt) == dtype_of(src):
        # the policy's float32 LayerNorm of a 16-bit tensor: 16-bit in and out, float32 inside the kernel
        removed, last, x, out_dtype = [data, var], nxt, src, dtype_of(src)
    eps = float32_bits(float(attrs.epsilon))
    args = [x, relax.const(g.astype(dtype)), relax.const(b.astype(dtype)), relax.ShapeExpr([eps])]
    return removed, last, (ctx.call(LAYER_NORM, args, shape, out_dtype, workspace_bytes=1), None)


PROVIDER = register(Provider(
    name="layer_norm", title="fused LayerNorm", kernel_prefix=vendor_abi.NORM.prefix,
    matchers={"relax.nn.layer_norm": layer_norm_chain}, dtypes=DTYPES, layouts=("row-major",), by_default=False))
