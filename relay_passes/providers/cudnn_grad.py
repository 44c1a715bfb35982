"""cuDNN for a convolution's two gradients, as TVM's Gradient pass writes them in a training step.

    conv2d_transpose(dy, W)             -> nimble.cudnn.conv2d_bwd_data    (dL/dx: NCHW / IOHW, groups 1)
    conv2d(x, dy) [-> strided_slice]    -> nimble.cudnn.conv2d_bwd_filter  (dL/dW: CNHW / IOHW / CNHW, groups 1)

A provider of its own, used only when named: its calls (cudnnConvolutionBackwardData / BackwardFilter in
codegen/vendor/nimble_vendor.cpp) were checked against float64 autograd and inside training steps against
PyTorch's losses (see benchmarks/findings.md, 'Transformers in fp16 with every peer, training steps on cuDNN,
merges, build times, serving under load'), but no inference build takes a ConvTranspose with them unasked;
``build_training(kernels="vendor" | "best")`` names it. Its kernel prefix is longer than
cuDNN's, so a plan launch of its calls counts as its own (``registry.provider_of``).
"""
from __future__ import annotations

from tvm import relax

from tvm_nimble.contract import vendor_abi

from ..precision import DTYPES
from .chains import ACT_NONE, dtype_of, ints, known_shape, operator_of
from .cudnn import conv_reason
from .registry import Provider, register

CONV2D_BWD_DATA = vendor_abi.CUDNN_CONV2D_BWD_DATA
CONV2D_BWD_FILTER = vendor_abi.CUDNN_CONV2D_BWD_FILTER
_FILTER_LAYOUTS = ("CNHW", "IOHW", "CNHW")


def _forward_out(x, w, stride, pad, dil) -> list[int]:
    """The output [N, K, P, Q] of the forward convolution of x [N, C, H, W] and w [K, C, KH, KW]."""
    return [x[0], w[0]] + [(x[i] + 2 * pad[i - 2] - dil[i - 2] * (w[i] - 1) - 1) // stride[i - 2] + 1 for i in (2, 3)]


def _tuple_ints(expr) -> list[int] | None:
    """The integers of a tuple of constant PrimValues (a strided_slice's begin), else None."""
    try:
        return [int(f.value) for f in expr.fields]
    except (AttributeError, TypeError):
        return None


def _gradient_call(ctx, op: str, why, name: str, args: list, out, dtype: str, forward, removed, last):
    """The matcher's answer: ``why`` in the report (and None), or the call of ``name`` for the forward
    convolution's (strides, pads, dilations)."""
    if why:
        ctx.report.kept.append((op, why))
        return None
    (stride, pad, dil) = forward
    attrs = [stride[0], stride[1], pad[0], pad[1], dil[0], dil[1], 1, ACT_NONE, -1, ctx.tf32]
    return removed, last, (ctx.call(name, args + [relax.ShapeExpr(attrs)], out, dtype), None)


def data_gradient(ctx, chains, var, call):
    """``conv2d_transpose(dy, W)`` as TVM's Gradient pass writes dL/dx of ``conv2d(x, W)``: the transpose's
    strides, padding and dilation are the forward convolution's, W its weights (read as IOHW)."""
    why = conv_reason(call, [("NCHW", "IOHW", "NCHW")], groups=False)
    a = call.attrs
    dy, w = call.args
    if why is None:
        stride, pad, dil = ints(a.strides), ints(a.padding)[:2], ints(a.dilation)
        dx, ws, dys = known_shape(call), known_shape(w), known_shape(dy)
        if _forward_out(dx, ws, stride, pad, dil) != list(dys):
            why = f"dy {list(dys)} is not the forward convolution's output of dx {list(dx)} and W {list(ws)}"
    return _gradient_call(ctx, "conv2d_transpose", why, CONV2D_BWD_DATA, [dy, w], known_shape(call), dtype_of(call),
                          (stride, pad, dil) if why is None else None, [], var)


def filter_gradient(ctx, chains, var, call):
    """``conv2d(x, dy)`` in layouts CNHW / IOHW / CNHW, as TVM's Gradient pass writes dL/dW of ``conv2d(x, W)``
    (strides and dilation swapped: the gradient's strides are the forward dilation and its dilation the forward
    strides), with the ``strided_slice`` that trims it to W's shape when the forward strides left input
    rows unread (the call computes W's taps only)."""
    a = call.attrs
    if (a.data_layout, a.kernel_layout, a.out_layout) != _FILTER_LAYOUTS:
        return None  # a forward convolution: cuDNN's provider reports on it
    why = conv_reason(call, [_FILTER_LAYOUTS], groups=False)
    x, dy = call.args
    removed, last, out = [], var, known_shape(call)
    if why is None:
        stride, pad, dil = ints(a.dilation), ints(a.padding)[:2], ints(a.strides)
        xs, dys = known_shape(x), known_shape(dy)
        nxt, val = chains.follow(var)
        if operator_of(val) == "relax.strided_slice":  # the taps past W's own size are computed for nothing
            sliced, begins = known_shape(val), _tuple_ints(val.args[2]) if len(val.args) > 2 else None
            if (sliced is not None and begins is not None and not any(begins)
                    and _forward_out(xs, sliced, stride, pad, dil) == list(dys)):
                removed, last, out = [var], nxt, sliced
        if _forward_out(xs, out, stride, pad, dil) != list(dys):
            why = f"dy {list(dys)} is not the forward convolution's output of x {list(xs)} and a kernel {list(out)}"
    return _gradient_call(ctx, "conv2d", why, CONV2D_BWD_FILTER, [x, dy], out, dtype_of(call),
                          (stride, pad, dil) if why is None else None, removed, last)


PROVIDER = register(Provider(
    name="cudnn_grad", title="cuDNN convolution gradients",
    kernel_prefix=vendor_abi.family(CONV2D_BWD_DATA, CONV2D_BWD_FILTER),
    matchers={"relax.nn.conv2d": filter_gradient, "relax.nn.conv2d_transpose": data_gradient},
    dtypes=DTYPES, layouts=("NCHW/IOHW", "CNHW/IOHW"), by_default=False))
