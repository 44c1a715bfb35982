"""Depthwise convolutions and 2-D pools on our stencil kernel (codegen/vendor/depthwise.cu).

    [relu ->] conv2d(x, W, groups=C) [+ bias] [+ residual] [-> relu | clip(0, 6)]   (channel multiplier 1)
    [relu ->] avg_pool2d(x) | max_pool2d(x)                [+ residual] [-> relu | clip(0, 6)]

NHWC or NCHW, any padding (asymmetric "SAME" padding included: the kernel takes the output size from y), fp32,
fp16 or bf16, computed in fp32. W must be a constant: it is stored [KH, KW, C], so the channels-last kernel reads
one vector of channels per tap. The ReLU in front is the one a separable convolution starts with; it is folded in
when nothing else reads its result.

Why ours: cuDNN runs a depthwise convolution as a grouped convolution, and takes an average pool only as a
depthwise convolution followed by a divisor multiply; at batch 1 in half precision each of nasnetalarge's 270
depthwise convolutions and 40 pools is a launch of several microseconds. Registered after both cuDNN providers,
so ``kernels="vendor"`` keeps cuDNN where it takes the operator (and gives this kernel the max pools and the
asymmetric pads cuDNN declines); ``kernels="best"`` measures it per operator against cuDNN and TVM.
"""
from __future__ import annotations

import numpy as np
from tvm import relax

from tvm_nimble.contract import vendor_abi

from ..precision import DTYPES, compute_dtype
from .chains import ACT_RELU, activation, dtype_of, epilogue, ints, known_shape, operator_of
from .registry import Provider, register

CONV2D = vendor_abi.DEPTHWISE_CONV2D
CONV2D_ADD = vendor_abi.DEPTHWISE_CONV2D_ADD
POOL2D = vendor_abi.DEPTHWISE_POOL2D
POOL2D_ADD = vendor_abi.DEPTHWISE_POOL2D_ADD
#: the kernel's modes (attrs[11])
MODE_CONV, MODE_AVG_VALID, MODE_AVG_ALL, MODE_MAX = 0, 1, 2, 3
_LAYOUTS = {"NCHW": 0, "NHWC": 1}


def _relu_input(chains, x):
    """(the tensor a ReLU reads, 1) when ``x`` is that ReLU's result and nothing else reads it, else (x, 0)."""
    value = chains.value.get(x) if isinstance(x, relax.Var) else None
    if value is not None and activation(value) == ACT_RELU and chains.single_use(x) and x not in chains.claimed:
        return value.args[0], 1
    return x, 0


def _taps(kernel: tuple[int, int], strides, padding, dilation) -> list[int]:
    (kh, kw), (sh, sw), (dh, dw) = kernel, ints(strides), ints(dilation)
    return [kh, kw, sh, sw, int(padding[0]), int(padding[1]), dh, dw]


def depthwise_chain(ctx, chains, var, call):
    a = call.attrs
    layout = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout))
    if layout not in (("NCHW", "OIHW", "NCHW"), ("NHWC", "OHWI", "NHWC")):
        return None  # no note: the cuDNN providers say why a convolution in another layout stays on TVM
    x, w = call.args
    xs, ws, out_shape, dtype = known_shape(x), known_shape(w), known_shape(call), dtype_of(call)
    nhwc = layout[0] == "NHWC"
    if None in (xs, ws, out_shape):
        return None
    channels = xs[3] if nhwc else xs[1]
    if int(a.groups) != channels or (ws[0], ws[3] if nhwc else ws[1]) != (channels, 1):
        return None  # not depthwise (or a channel multiplier above 1): cuDNN's or TVM's
    weight = chains.const(w)
    if compute_dtype(call) not in PROVIDER.dtypes or weight is None or len(ints(a.padding)) != 4 \
            or (a.out_dtype and str(a.out_dtype) not in ("", "void", dtype)):
        ctx.report.kept.append(("conv2d", "our depthwise kernel takes fp32/fp16/bf16 with constant weights"))
        return None
    taps = weight[..., 0].transpose(1, 2, 0) if nhwc else weight[:, 0].transpose(1, 2, 0)  # [KH, KW, C]
    src, relu_in = _relu_input(chains, x)
    removed, last, bias, residual, act = epilogue(chains, var, out_shape, dtype, 3 if nhwc else 1)
    if relu_in:
        removed = [x] + removed
    attrs = _taps(taps.shape[:2], a.strides, ints(a.padding), a.dilation) + [act, relu_in, int(nhwc), MODE_CONV]
    bias = np.zeros(channels, dtype=dtype) if bias is None else bias
    args = [src, relax.const(np.ascontiguousarray(taps).astype(dtype)), relax.const(bias.astype(dtype))]
    name = CONV2D
    if residual is not None:
        args.append(residual)
        name = CONV2D_ADD
    return removed, last, (ctx.call(name, args + [relax.ShapeExpr(attrs)], out_shape, dtype, 1), None)


def pool_chain(ctx, chains, var, call):
    a = call.attrs
    op = operator_of(call)
    x = call.args[0]
    layout, out_shape, dtype = str(a.layout), known_shape(call), dtype_of(call)
    avg = op == "relax.nn.avg_pool2d"
    why = ("layout" if layout not in _LAYOUTS or (a.out_layout and str(a.out_layout) != layout) else
           "dtype" if compute_dtype(call) not in PROVIDER.dtypes else
           "dynamic shape" if out_shape is None or known_shape(x) is None else
           "ceil_mode" if avg and a.ceil_mode else None)
    if why:
        ctx.report.kept.append((op.split(".")[-1], f"our pool kernel: {why}"))
        return None
    src, relu_in = _relu_input(chains, x)
    removed, last, _, residual, act = epilogue(chains, var, out_shape, dtype, 0, with_bias=False)
    if relu_in:
        removed = [x] + removed
    mode = (MODE_AVG_ALL if a.count_include_pad else MODE_AVG_VALID) if avg else MODE_MAX
    kernel = tuple(ints(a.pool_size))
    attrs = _taps(kernel, a.strides, ints(a.padding), a.dilation) + [act, relu_in, _LAYOUTS[layout], mode]
    args, name = [src], POOL2D
    if residual is not None:
        args, name = [src, residual], POOL2D_ADD
    return removed, last, (ctx.call(name, args + [relax.ShapeExpr(attrs)], out_shape, dtype, 1), None)


PROVIDER = register(Provider(
    name="depthwise", title="depthwise convolutions and pools (ours)", kernel_prefix=vendor_abi.DEPTHWISE.prefix,
    matchers={"relax.nn.conv2d": depthwise_chain, "relax.nn.avg_pool2d": pool_chain,
              "relax.nn.max_pool2d": pool_chain},
    dtypes=DTYPES, layouts=("NCHW/OIHW", "NHWC/OHWI")))
