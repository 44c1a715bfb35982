"""The vendor functions' contract in numpy, registered under their global names, so modules with
vendor calls run on llvm (CPU tests); the real functions are checked against PyTorch on a GPU by
scripts/experiments/vendor_check.py."""
import contextlib
import struct

import numpy as np
import tvm_ffi
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from tvm_nimble.relay_passes.cache_in_attention import APPEND as APPEND_SDPA_BIAS, ROPE as APPEND_ROPE_SDPA_BIAS
from tvm_nimble.relay_passes.providers.attention import (CLUSTER_SDPA, CLUSTER_SDPA_BIAS, CUDNN_BIAS_CAUSAL_SDPA,
                                                        CUDNN_KEY_CAUSAL_SDPA,
                                                          CUDNN_BIAS_SDPA, CUDNN_SDPA, SDPA, SDPA_BIAS, SPLIT_SDPA,
                                                          SPLIT_SDPA_BIAS, TILE_SDPA, TILE_SDPA_BIAS)
from tvm_nimble.relay_passes.providers.cudnn_grad import CONV2D_BWD_DATA, CONV2D_BWD_FILTER
from tvm_nimble.relay_passes.providers.norm import LAYER_NORM
from tvm_nimble.relay_passes.providers import cudnn_graph, depthwise, simt_gemm, tf32x3
from tvm_nimble.relay_passes.providers import gemv as gemv_provider
from tvm_nimble.relay_passes.vendor_offload import BATCHED_MATMUL, CONV2D, CONV2D_ADD, MATMUL, MATMUL_ADD


def _act(y, act):
    if act == 4:  # GELU's tanh approximation
        return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    if act == 3:  # the exact GELU, x * Phi(x)
        from scipy.special import erf

        return 0.5 * y * (1 + erf(y / np.sqrt(2)))
    return np.maximum(y, 0) if act == 1 else np.clip(y, 0, 6) if act == 2 else y


def _tf32_read(x) -> np.ndarray:
    """A float32 array as a tensor core reads it in a TF32 GEMM: its low 13 mantissa bits dropped (truncated, the
    farther of the two ways to read it), as float64, so that the contract adds the products exactly: the tensor
    cores' own accumulation is not modelled."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return (bits & np.uint32(~tf32x3.TF32_DROPPED & 0xFFFFFFFF)).view(np.float32).astype(np.float64)


def np_conv2d(x, w, b, attrs):
    """y before the activation, and the activation; attrs[10] == 1 (NHWC x and y, OHWI w) is read through NCHW."""
    if len(attrs) > 10 and attrs[10] == 1:
        y, act = np_conv2d(x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), b, attrs[:10])
        return y.transpose(0, 2, 3, 1), act
    sh, sw, ph, pw, dh, dw, groups, act = attrs[:8]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    o, cg, kh, kw = w.shape
    win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    og = o // groups
    out = np.concatenate([np.einsum("nchwij,ocij->nohw", win[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og])
                          for g in range(groups)], axis=1)
    return out + b.reshape(1, -1, 1, 1), act


def np_conv2d_bwd_filter(x, dy, w_shape, attrs):
    """dL/dW of y = conv2d(x, W) for an upstream gradient dy (groups 1), from the forward's windows."""
    sh, sw, ph, pw, dh, dw = attrs[:6]
    _, _, kh, kw = w_shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    p, q = dy.shape[2:]
    return np.einsum("nohw,nchwij->ocij", dy, win[:, :, :p, :q])


def np_conv2d_bwd_data(dy, w, x_shape, attrs):
    """dL/dx of y = conv2d(x, W) for an upstream gradient dy (groups 1): each kernel tap scatters back."""
    sh, sw, ph, pw, dh, dw = attrs[:6]
    n, c, h, wd = x_shape
    _, _, kh, kw = w.shape
    p, q = dy.shape[2:]
    dxp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i * dh:i * dh + sh * (p - 1) + 1:sh, j * dw:j * dw + sw * (q - 1) + 1:sw] += \
                np.einsum("nohw,oc->nchw", dy, w[:, :, i, j])
    return dxp[:, :, ph:ph + h, pw:pw + wd]


def np_stencil(x, w, b, z, attrs, out_hw):
    """The depthwise kernel's contract (codegen/vendor/depthwise.cu): w [KH, KW, C]; attrs = [kh, kw, sh, sw,
    pad_top, pad_left, dh, dw, act, relu_input, layout, mode]; the bottom / right pads are what y's size implies."""
    kh, kw, sh, sw, pt, pl, dh, dw, act, relu_in, layout, mode = attrs
    if layout:
        x = x.transpose(0, 3, 1, 2)
        z = None if z is None else z.transpose(0, 3, 1, 2)
    x = np.maximum(x, 0) if relu_in else x
    n, c, h, wd = x.shape
    oh, ow = out_hw
    ekh, ekw = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    pb, pr = max(0, (oh - 1) * sh + ekh - h - pt), max(0, (ow - 1) * sw + ekw - wd - pl)
    pads = ((0, 0), (0, 0), (pt, pb), (pl, pr))
    xp = np.pad(x.astype(np.float64), pads, constant_values=-np.inf if mode == depthwise.MODE_MAX else 0.0)
    def windows(t):
        return sliding_window_view(t, (ekh, ekw), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :oh, :ow]
    win = windows(xp)
    if mode == depthwise.MODE_CONV:
        out = np.einsum("nchwij,ijc->nchw", win, w.astype(np.float64))
    elif mode == depthwise.MODE_MAX:
        out = win.max(axis=(-1, -2))
    elif mode == depthwise.MODE_AVG_ALL:
        out = win.sum(axis=(-1, -2)) / (kh * kw)
    else:
        inside = windows(np.pad(np.ones((1, 1, h, wd)), pads)).sum(axis=(-1, -2))
        out = win.sum(axis=(-1, -2)) / inside
    if b is not None:
        out = out + b.reshape(1, -1, 1, 1)
    if z is not None:
        out = out + z
    out = _act(out, act)
    return out.transpose(0, 2, 3, 1) if layout else out


def _view(flat, offset, strides, shape):
    """The [B, H, S, D] view the attention attrs describe (head dimension contiguous)."""
    item = flat.itemsize
    return as_strided(flat[offset:], shape=shape, strides=[s * item for s in strides] + [item], writeable=False)


def np_sdpa(q, k, v, bias, attrs, causal: bool = False):
    """codegen/vendor/attention.cu's contract: softmax(scale * q·kᵀ + bias) · v in float64, y [B, H, Sq, Dv]
    laid out by the y strides (returned flat); query head h reads KV head h // group (attrs' entry 26, 1 when absent), and a
    row whose scores are all -inf outputs 0. ``causal`` (cudnn_bias_causal_sdpa, cudnn_key_causal_sdpa): key j > query i masked too."""
    B, H, Sq, Sk, D, Dv = attrs[:6]
    group = attrs[26] if len(attrs) > 26 else 1
    qv = _view(q.ravel(), attrs[6], attrs[7:10], (B, H, Sq, D)).astype(np.float64)
    kv = np.repeat(_view(k.ravel(), attrs[10], attrs[11:14], (B, H // group, Sk, D)).astype(np.float64), group, axis=1)
    vv = np.repeat(_view(v.ravel(), attrs[14], attrs[15:18], (B, H // group, Sk, Dv)).astype(np.float64), group, axis=1)
    scale = struct.unpack("<f", struct.pack("<I", attrs[25]))[0]
    s = scale * qv @ np.swapaxes(kv, -1, -2)
    if bias is not None:
        item = bias.itemsize
        s = s + as_strided(bias.ravel(), shape=(B, H, Sq, Sk), strides=[x * item for x in attrs[21:25]])
    if causal:
        s = np.where(np.triu(np.ones((Sq, Sk), bool), k=1), -np.inf, s)
    top = s.max(-1, keepdims=True)
    p = np.where(np.isneginf(top), 0.0, np.exp(s - np.where(np.isneginf(top), 0.0, top)))
    out = (p / np.maximum(p.sum(-1, keepdims=True), np.finfo(np.float64).tiny)) @ vv
    y = np.zeros(B * H * Sq * Dv)
    idx = (np.arange(B)[:, None, None, None] * attrs[18] + np.arange(H)[None, :, None, None] * attrs[19]
           + np.arange(Sq)[None, None, :, None] * attrs[20] + np.arange(Dv)[None, None, None, :])
    y[idx.ravel()] = out.ravel()
    return y


def _array(x) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.numpy()


@contextlib.contextmanager
def reference_functions():
    """The numpy contract registered under the vendor names for the duration of the block; whatever
    was registered before (the real extension, loaded by another test) is restored after it."""
    def conv(x, w, b, attrs, y, ws):
        out, act = np_conv2d(x.numpy(), w.numpy(), b.numpy(), list(attrs))
        y.copyfrom(_act(out, act).astype(y.dtype))

    def conv_add(x, w, b, z, attrs, y, ws):
        out, act = np_conv2d(x.numpy(), w.numpy(), b.numpy(), list(attrs))
        y.copyfrom(_act(out + z.numpy(), act).astype(y.dtype))

    def conv_bwd_data(dy, w, attrs, dx, ws):
        dx.copyfrom(np_conv2d_bwd_data(dy.numpy(), w.numpy(), dx.shape, list(attrs)).astype(dx.dtype))

    def conv_bwd_filter(x, dy, attrs, dw, ws):
        dw.copyfrom(np_conv2d_bwd_filter(x.numpy(), dy.numpy(), dw.shape, list(attrs)).astype(dw.dtype))

    def f32(x):
        return x.astype(np.float32)

    def linear(a, w, bias, attrs, y, read=f32):  # a @ op(w) + bias in fp32, in y's shape (its rows may be reshaped);
        # attrs[2:] (allow_tf32, the algorithm) change no value; read: how the operands are read (_tf32_read: float64)
        wv = read(w.numpy())
        b = bias.numpy()  # (empty: no bias, cuBLASLt's GEMM alone)
        out = read(a.numpy()) @ (wv.T if int(attrs[0]) else wv) + (b.astype(wv.dtype) if b.size else 0)
        return out.reshape(y.shape)

    def matmul(a, w, bias, attrs, y, ws, read=f32):
        y.copyfrom(_act(linear(a, w, bias, attrs, y, read), int(attrs[1])).astype(y.dtype))

    def matmul_add(a, w, bias, z, attrs, y, ws, read=f32):
        y.copyfrom(_act(linear(a, w, bias, attrs, y, read) + z.numpy(), int(attrs[1])).astype(y.dtype))

    def tf32_read(attrs):  # cuBLASLt's float32 Linear on tensor cores (see _tf32_read)
        if int(attrs[2]) != 1:
            raise ValueError(f"{tf32x3.MATMUL}: allow_tf32 must be 1 (its products are TF32's)")
        return _tf32_read

    def tf32x3_matmul(a, w, bias, attrs, y, ws):
        matmul(a, w, bias, attrs, y, ws, tf32_read(attrs))

    def tf32x3_matmul_add(a, w, bias, z, attrs, y, ws):
        matmul_add(a, w, bias, z, attrs, y, ws, tf32_read(attrs))

    def simt_act(attrs):  # the kernel's epilogue compiles no tanh GELU (gemm_simt.cu refuses it)
        if int(attrs[0]) not in simt_gemm.ACTIVATIONS:
            raise ValueError(f"nimble.gemm: activation {int(attrs[0])} is not one the kernel computes")
        return int(attrs[0])

    def simt_matmul(a, w, bias, attrs, y, ws):  # w [K, N]; attrs = [activation(, candidate)]
        y.copyfrom(_act((a.numpy() @ w.numpy() + bias.numpy()).reshape(y.shape), simt_act(attrs)).astype(y.dtype))

    def simt_matmul_add(a, w, bias, z, attrs, y, ws):
        out = (a.numpy() @ w.numpy() + bias.numpy()).reshape(y.shape) + z.numpy()
        y.copyfrom(_act(out, simt_act(attrs)).astype(y.dtype))

    def gemv(a, w, bias, attrs, y, ws, z=None):  # w [N, K]; attrs = [activation]; a a tensor or an array
        a = a if isinstance(a, np.ndarray) else a.numpy()
        out = (a.astype(np.float32) @ w.numpy().astype(np.float32).T
               + bias.numpy().astype(np.float32)).reshape(y.shape)
        y.copyfrom(_act(out + (0 if z is None else z.numpy()), int(attrs[0])).astype(y.dtype))

    def normed(x, gamma, beta, attrs, dtype):  # attrs[1:3] = [1 layer / 2 RMS, eps bits]; rounded as the norm's cast
        eps = float(np.array([int(attrs[2])], np.uint32).view(np.float32)[0])
        xv = x.numpy().astype(np.float64)
        mean = xv.mean(-1, keepdims=True) if int(attrs[1]) == 1 else 0.0
        var = ((xv - mean) ** 2).mean(-1, keepdims=True)
        return ((xv - mean) / np.sqrt(var + eps) * gamma.numpy() + (beta.numpy() if int(attrs[1]) == 1 else 0.0)
                ).astype(dtype)

    def norm_gemv(x, gamma, beta, w, bias, attrs, y, ws, z=None):  # attrs = [activation, 1 layer / 2 RMS, eps bits]
        gemv(normed(x, gamma, beta, attrs, w.numpy().dtype), w, bias, attrs[:1], y, ws, z)

    def glu_gemv(a, w, bias, attrs, y, ws):  # w [2I, K], rows (gate j, up j); y = silu(gate) * up, each op rounded
        assert int(attrs[0]) == gemv_provider.GLU_SILU
        a = a if isinstance(a, np.ndarray) else a.numpy()
        h = (a.astype(np.float32) @ w.numpy().astype(np.float32).T + bias.numpy().astype(np.float32)).astype(y.dtype)
        g, u = h[..., 0::2].astype(np.float32), h[..., 1::2].astype(np.float32)
        sig = (1 / (1 + np.exp(-g))).astype(y.dtype).astype(np.float32)
        y.copyfrom(((g * sig).astype(y.dtype).astype(np.float32) * u).astype(y.dtype).reshape(y.shape))

    def glu_norm_gemv(x, gamma, beta, w, bias, attrs, y, ws):  # attrs = [glu, 1 layer / 2 RMS, eps bits]
        glu_gemv(normed(x, gamma, beta, attrs, w.numpy().dtype), w, bias, attrs[:1], y, ws)

    def batched_matmul(a, b, attrs, y, ws):
        bm = np.swapaxes(b.numpy(), -1, -2) if int(attrs[0]) else b.numpy()
        y.copyfrom((a.numpy() @ bm).astype(y.dtype))

    def sdpa(q, k, v, attrs, y, ws):
        y.copyfrom(np_sdpa(q.numpy(), k.numpy(), v.numpy(), None, list(attrs)).reshape(y.shape).astype(y.dtype))

    def sdpa_bias(q, k, v, bias, attrs, y, ws):
        y.copyfrom(np_sdpa(q.numpy(), k.numpy(), v.numpy(), bias.numpy(), list(attrs)).reshape(y.shape).astype(y.dtype))

    def causal_sdpa_bias(q, k, v, bias, attrs, y, ws):
        y.copyfrom(np_sdpa(q.numpy(), k.numpy(), v.numpy(), bias.numpy(), list(attrs), causal=True)
                   .reshape(y.shape).astype(y.dtype))

    def append_sdpa_bias(q, k, v, bias, k_new, v_new, positions, attrs, y, ws):
        """k[b, g, positions[b], :] = k_new[b, g, :] (v alike) through the attrs' cache views, in place, then
        sdpa_bias over the caches; a position outside the cache writes nothing."""
        a = list(attrs)
        B, H, _, Sk, D, Dv = a[:6]
        kv_heads = H // (a[26] if len(a) > 26 else 1)
        pos = positions.numpy().ravel()
        caches = []
        for cache, new, off, (sb, sh, ss), d in ((k, k_new, a[10], a[11:14], D), (v, v_new, a[14], a[15:18], Dv)):
            flat, fresh = cache.numpy().ravel(), _array(new).reshape(B, kv_heads, d)
            for b in range(B):
                if 0 <= pos[b] < Sk:
                    for g in range(kv_heads):
                        start = off + b * sb + g * sh + pos[b] * ss
                        flat[start:start + d] = fresh[b, g]
            cache.copyfrom(flat.reshape(cache.shape))
            caches.append(flat)
        y.copyfrom(np_sdpa(_array(q), caches[0], caches[1], bias.numpy(), a).reshape(y.shape).astype(y.dtype))

    def append_rope_sdpa_bias(q, k, v, bias, k_new, v_new, positions, cos, sin, attrs, y, ws):
        """q and k_new rotated first: x * cos + rotate_half(x) * sin in float32, rounded to their dtype; cos and sin
        float32 [B, D]; q read as [B, H, D] rows."""
        a = list(attrs)
        B, H, D = a[0], a[1], a[4]
        c, s_ = cos.numpy().reshape(B, 1, D).astype(np.float32), sin.numpy().reshape(B, 1, D).astype(np.float32)

        def rotated(x, heads):
            x = x.numpy()
            xf = x.reshape(B, heads, D).astype(np.float32)
            half = np.concatenate([-xf[..., D // 2:], xf[..., :D // 2]], axis=-1)
            return (xf * c + half * s_).astype(x.dtype)

        append_sdpa_bias(rotated(q, H), k, v, bias, rotated(k_new, H // (a[26] if len(a) > 26 else 1)), v_new,
                         positions, attrs, y, ws)

    def layer_norm(x, gamma, beta, attrs, y, ws):  # over the last axis; attrs = [eps as float32 bits]
        eps = float(np.array([int(attrs[0])], np.uint32).view(np.float32)[0])
        xv = x.numpy().astype(np.float64)
        mean = xv.mean(-1, keepdims=True)
        var = ((xv - mean) ** 2).mean(-1, keepdims=True)
        out = (xv - mean) / np.sqrt(var + eps) * gamma.numpy().astype(np.float64) + beta.numpy().astype(np.float64)
        y.copyfrom(out.astype(x.numpy().dtype))  # y has x's dtype (the parameters may be float32)

    def out_hw(y, attrs):
        return (y.shape[1], y.shape[2]) if int(attrs[10]) else (y.shape[2], y.shape[3])

    def stencil(x, w, b, z, attrs, y):
        attrs = [int(a) for a in attrs]
        y.copyfrom(np_stencil(x.numpy(), w, b, z, attrs, out_hw(y, attrs)).astype(y.dtype))

    names = {depthwise.CONV2D: lambda x, w, b, attrs, y, ws: stencil(x, w.numpy(), b.numpy(), None, attrs, y),
             depthwise.CONV2D_ADD: lambda x, w, b, z, attrs, y, ws: stencil(x, w.numpy(), b.numpy(), z.numpy(),
                                                                             attrs, y),
             depthwise.POOL2D: lambda x, attrs, y, ws: stencil(x, None, None, None, attrs, y),
             depthwise.POOL2D_ADD: lambda x, z, attrs, y, ws: stencil(x, None, None, z.numpy(), attrs, y),
             CONV2D: conv, CONV2D_ADD: conv_add, CONV2D_BWD_DATA: conv_bwd_data, CONV2D_BWD_FILTER: conv_bwd_filter,
             MATMUL: matmul, MATMUL_ADD: matmul_add, BATCHED_MATMUL: batched_matmul, SDPA: sdpa,
             SDPA_BIAS: sdpa_bias, CUDNN_SDPA: sdpa, CUDNN_BIAS_SDPA: sdpa_bias,
             CUDNN_BIAS_CAUSAL_SDPA: causal_sdpa_bias, CUDNN_KEY_CAUSAL_SDPA: causal_sdpa_bias, SPLIT_SDPA: sdpa,
             SPLIT_SDPA_BIAS: sdpa_bias,
             TILE_SDPA: sdpa, TILE_SDPA_BIAS: sdpa_bias, CLUSTER_SDPA: sdpa, CLUSTER_SDPA_BIAS: sdpa_bias,
             APPEND_SDPA_BIAS: append_sdpa_bias, APPEND_ROPE_SDPA_BIAS: append_rope_sdpa_bias,
             LAYER_NORM: layer_norm,
             simt_gemm.MATMUL: simt_matmul, simt_gemm.MATMUL_ADD: simt_matmul_add, gemv_provider.MATMUL: gemv,
             tf32x3.MATMUL: tf32x3_matmul, tf32x3.MATMUL_ADD: tf32x3_matmul_add,
             gemv_provider.MATMUL_ADD: lambda a, w, bias, z, attrs, y, ws: gemv(a, w, bias, attrs, y, ws, z),
             gemv_provider.NORM_MATMUL: norm_gemv,
             gemv_provider.NORM_MATMUL_ADD: lambda x, g, b, w, bias, z, attrs, y, ws: norm_gemv(x, g, b, w, bias, attrs,
                                                                                                y, ws, z),
             gemv_provider.GLU_MATMUL: glu_gemv, gemv_provider.GLU_NORM_MATMUL: glu_norm_gemv,
             cudnn_graph.CONV2D: conv,
             cudnn_graph.CONV2D_ADD: conv_add}
    before = {name: tvm_ffi.get_global_func(name, allow_missing=True) for name in names}
    for name, fn in names.items():
        tvm_ffi.register_global_func(name, fn, override=True)
    try:
        yield
    finally:
        for name, fn in before.items():
            if fn is None:
                tvm_ffi.remove_global_func(name)
            else:
                tvm_ffi.register_global_func(name, fn, override=True)
