"""cuDNN: convolutions (with bias, residual add, ReLU/ReLU6 fused) and average pools.

    conv2d(x, W) [+ bias] [+ residual] [-> relu | clip(0, 6)]     (NCHW / OIHW or NHWC / OHWI, symmetric padding)
    avg_pool2d(x)                                                  (as a depthwise convolution)

The vendor calls' attrs end with the layout (:data:`LAYOUT_CODES`): cuDNN reads NHWC tensors and OHWI filters as
they are, so a channels-last build (``relay_passes.layout``) needs no transposes around its convolutions.

W may be a computed tensor (a training step's weights are inputs). A convolution's gradients are the
provider ``cudnn_grad`` (:mod:`.cudnn_grad`).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from tvm import relax

from tvm_nimble.contract import vendor_abi

from ..precision import DTYPES, compute_dtype
from .chains import ACT_NONE, dtype_of, epilogue, ints, known_shape
from .registry import Provider, register

CONV2D = vendor_abi.CUDNN_CONV2D
CONV2D_ADD = vendor_abi.CUDNN_CONV2D_ADD
#: (data, kernel, output) layouts of a forward convolution -> the code the vendor calls take as their last attr
LAYOUT_CODES = {("NCHW", "OIHW", "NCHW"): 0, ("NHWC", "OHWI", "NHWC"): 1}


def layouts_of(call) -> tuple[str, str, str]:
    a = call.attrs
    return str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout)


def conv_reason(call, layouts=tuple(LAYOUT_CODES), groups: bool = True) -> str | None:
    """Why this conv2d (or a gradient's conv2d / conv2d_transpose, in one of its ``layouts``) cannot go to cuDNN,
    or None; ``groups``: whether grouped ones can."""
    a = call.attrs
    if layouts_of(call) not in layouts:
        return f"layout {a.data_layout}/{a.kernel_layout}"
    if not groups and int(a.groups) != 1:
        return f"groups={int(a.groups)}"
    if compute_dtype(call) not in PROVIDER.dtypes or dtype_of(call.args[0]) != dtype_of(call.args[1]):
        return f"dtype {dtype_of(call)}"
    if a.out_dtype and str(a.out_dtype) not in ("", "void", dtype_of(call)):
        return f"out_dtype {a.out_dtype}"
    pad = ints(a.padding)
    if len(pad) != 4 or pad[0] != pad[2] or pad[1] != pad[3]:
        return f"asymmetric padding {pad}"
    if None in (known_shape(call), known_shape(call.args[0]), known_shape(call.args[1])):
        return "dynamic shape"
    return None


def conv_chain(ctx, chains, var, call, conv: str = CONV2D, conv_add: str = CONV2D_ADD, groups: bool = True):
    """The chain from ``call`` (a conv2d) as one ``conv`` call (``conv_add`` with a residual); ``groups``: whether
    grouped convolutions are taken."""
    if layouts_of(call) == ("CNHW", "IOHW", "CNHW"):
        return None  # a convolution's gradient (dL/dW): provider cudnn_grad's, which reports on it
    why = conv_reason(call, groups=groups)
    if why:
        ctx.report.kept.append(("conv2d", why))
        return None
    out_shape, dtype = known_shape(call), dtype_of(call)
    layout = LAYOUT_CODES[layouts_of(call)]
    channel_axis = 3 if layout else 1
    channels = out_shape[channel_axis]
    removed, last, bias, residual, act = epilogue(chains, var, out_shape, dtype, channel_axis, residual_needs_bias=True)
    if bias is None:
        bias = np.zeros(channels, dtype=dtype)
    a = call.attrs
    strides, pad, dil = ints(a.strides), ints(a.padding), ints(a.dilation)
    # a depthwise convolution (one input channel per group) computes exactly in fp32 in a TF32 build, as PyTorch's
    # does (its fp32 depthwise kernel is not cuDNN's and has no TF32): a reduction of kh*kw terms gains nothing
    # from tensor cores, and rounding its inputs to 10 bits would be an error no other system has there
    depthwise = int(a.groups) > 1 and int(a.groups) == known_shape(call.args[0])[channel_axis]
    tf32 = 0 if depthwise else ctx.tf32
    attrs = [strides[0], strides[1], pad[0], pad[1], dil[0], dil[1], int(a.groups), act, -1, tf32, layout]
    args = [call.args[0], call.args[1], relax.const(bias.astype(dtype))]
    name = conv
    if residual is not None:
        args.append(residual)
        name = conv_add
    return removed, last, (ctx.call(name, args + [relax.ShapeExpr(attrs)], out_shape, dtype), None)


def avg_pool(ctx, chains, var, call):
    """avg_pool2d as a depthwise cuDNN convolution with constant weights (TVM's default avg_pool2d
    schedule is slow: 29% of inception_v3's batch-1 kernel time on an H100). With
    ``count_include_pad=False`` and padding, the border divisor is a constant map the output is
    multiplied with."""
    a = call.attrs
    x = call.args[0]
    out_shape, xs, dtype = known_shape(call), known_shape(x), dtype_of(call)
    pad, size, strides, dil = ints(a.padding), ints(a.pool_size), ints(a.strides), ints(a.dilation)
    layout = str(a.layout)
    why = ("layout" if layout not in ("NCHW", "NHWC") or (a.out_layout and a.out_layout != layout) else
           "ceil_mode" if a.ceil_mode else "dtype" if compute_dtype(call) not in PROVIDER.dtypes else
           "asymmetric padding" if len(pad) != 4 or pad[0] != pad[2] or pad[1] != pad[3] else
           "dilation" if dil != [1, 1] else "dynamic shape" if out_shape is None or xs is None else None)
    if why:
        ctx.report.kept.append(("avg_pool2d", why))
        return None
    nhwc = layout == "NHWC"
    (kh, kw) = size
    channels, spatial = (xs[3], xs[1:3]) if nhwc else (xs[1], xs[2:])
    weight = np.full((channels, kh, kw, 1) if nhwc else (channels, 1, kh, kw), 1.0 / (kh * kw), dtype=dtype)
    scale = None
    if not a.count_include_pad and (pad[0] or pad[1]):
        ones = np.pad(np.ones(spatial), ((pad[0], pad[0]), (pad[1], pad[1])))
        counts = sliding_window_view(ones, (kh, kw))[::strides[0], ::strides[1]].sum(axis=(2, 3))
        weight[:] = 1.0
        scale = (1.0 / counts).reshape((1, *counts.shape, 1) if nhwc else (1, 1, *counts.shape)).astype(dtype)
    # TF32 off whatever the build's precision: a pool computes exactly in fp32, as PyTorch's does (TF32 would round
    # its inputs to 10 bits of mantissa, an error no other system has there)
    attrs = [strides[0], strides[1], pad[0], pad[1], 1, 1, channels, ACT_NONE, -1, 0, int(nhwc)]
    args = [x, relax.const(weight), relax.const(np.zeros(channels, dtype=dtype)), relax.ShapeExpr(attrs)]
    return [], var, (ctx.call(CONV2D, args, out_shape, dtype), scale)


PROVIDER = register(Provider(
    name="cudnn", title="cuDNN", kernel_prefix=vendor_abi.CUDNN.prefix,
    matchers={"relax.nn.conv2d": conv_chain, "relax.nn.avg_pool2d": avg_pool},
    dtypes=DTYPES, layouts=("NCHW/OIHW", "NHWC/OHWI")))
