"""TVM tensors and numpy arrays handed to each other without a copy where DLPack allows it.

A model's weights cross between the two several times a build: the precision pass narrows them (numpy), the
providers' rewrites read them, the launch plan lists them, the compiled-kernel cache writes and reads them. Each
crossing was a copy into freshly allocated pages, of every weight, on every build. numpy takes a
TVM tensor's memory through DLPack (read-only here: it stays the module's); TVM takes a numpy array's when its data
is 64-byte aligned (:func:`aligned_empty` makes such a buffer). bfloat16, which numpy's DLPack import refuses, is
copied as before.
"""
from __future__ import annotations

import numpy as np
import tvm

#: the alignment TVM asks of a DLPack tensor's data to take it without a copy
ALIGN = 64


def as_numpy(tensor) -> np.ndarray:
    """``tensor``'s elements as a numpy array: its own memory, read-only, where DLPack hands it over, else a copy."""
    try:
        array = np.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError, ValueError):
        return tensor.numpy()
    array.flags.writeable = False
    return array


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts :data:`ALIGN`-byte aligned."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + n].view(dtype).reshape(shape)


def as_tensor(array: np.ndarray) -> tvm.runtime.Tensor:
    """``array`` as a TVM tensor on the CPU: the array's own memory (which the caller hands over and no longer
    writes) where it is contiguous, aligned and DLPack-exportable, else a copy."""
    if array.flags.c_contiguous and array.ctypes.data % ALIGN == 0:
        try:
            return tvm.runtime.from_dlpack(array)
        except (BufferError, RuntimeError, TypeError, ValueError):
            pass
    return tvm.runtime.tensor(array)
