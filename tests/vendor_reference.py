"""The vendor functions' contract in numpy, registered under their global names, so modules with
vendor calls run on llvm (CPU tests); the real functions are checked against PyTorch on a GPU by
scripts/experiments/vendor_check.py."""
import contextlib

import numpy as np
import tvm_ffi
from numpy.lib.stride_tricks import sliding_window_view

from tvm_nimble.relay_passes.vendor_offload import BATCHED_MATMUL, CONV2D, CONV2D_ADD, MATMUL


def _act(y, act):
    return np.maximum(y, 0) if act == 1 else np.clip(y, 0, 6) if act == 2 else y


def np_conv2d(x, w, b, attrs):
    sh, sw, ph, pw, dh, dw, groups, act = attrs[:8]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    o, cg, kh, kw = w.shape
    win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    og = o // groups
    out = np.concatenate([np.einsum("nchwij,ocij->nohw", win[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og])
                          for g in range(groups)], axis=1)
    return out + b.reshape(1, -1, 1, 1), act


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

    def matmul(a, w, bias, attrs, y, ws):
        transpose_b, act = int(attrs[0]), int(attrs[1])
        wm = w.numpy().T if transpose_b else w.numpy()
        y.copyfrom(_act(a.numpy() @ wm + bias.numpy(), act).astype(y.dtype))

    def batched_matmul(a, b, attrs, y, ws):
        bm = np.swapaxes(b.numpy(), -1, -2) if int(attrs[0]) else b.numpy()
        y.copyfrom((a.numpy() @ bm).astype(y.dtype))

    names = {CONV2D: conv, CONV2D_ADD: conv_add, MATMUL: matmul, BATCHED_MATMUL: batched_matmul}
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
