"""Where the native libraries live that both the builder and the loader need: the NVIDIA pip wheels' folders
(cuDNN, cuBLAS) and TVM's CUDA runtime libraries.

``codegen`` compiles and links against them, ``tvm_nimble.runtime`` loads them; neither layer may import the
other, so the one way to find them sits here, at the bottom beside :mod:`tvm_nimble.env` (standard library
and tvm_ffi only; ``tvm`` is imported only to locate its ``lib`` folder).
"""
from __future__ import annotations

import ctypes
import os

import tvm_ffi

from tvm_nimble import env


def _site_dirs() -> list[str]:
    dirs = []
    for entry in env.python_path():
        dirs.append(os.path.abspath(entry))
    for mod_file in (tvm_ffi.__file__, _numpy_file()):
        if mod_file:
            dirs.append(os.path.dirname(os.path.dirname(os.path.abspath(mod_file))))
    seen: list[str] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


def _numpy_file() -> str | None:
    try:
        import numpy

        return numpy.__file__
    except ImportError:
        return None


def nvidia_roots() -> list[str]:
    """The ``nvidia/`` folders of the pip wheels, in the site directories of tvm_ffi and numpy."""
    return [os.path.join(d, "nvidia") for d in _site_dirs() if os.path.isdir(os.path.join(d, "nvidia"))]


def cuda_runtime_libraries() -> list[str]:
    """TVM's CUDA runtime libraries, in load order. The apache-tvm wheel keeps them apart from
    ``libtvm_runtime``: ``import tvm`` does not load them, so neither does a plain
    ``python -m tvm.exec.rpc_server`` (``tvm-nimble rpc-server`` passes them as ``--load-library``)."""
    import tvm

    lib_dir = os.path.join(os.path.dirname(tvm.__file__), "lib")
    paths = [os.path.join(lib_dir, n) for n in ("libtvm_runtime_extra.so", "libtvm_runtime_cuda.so")]
    return [p for p in paths if os.path.exists(p)]


def load_tvm_cuda_runtime() -> None:
    """Load TVM's CUDA runtime libraries unless their functions are registered already.

    Raises OSError when the CUDA one cannot be loaded (no driver); an extra library that fails is skipped."""
    if "ffi.Module.load_from_bytes.cuda" in tvm_ffi.registry.list_global_func_names():
        return
    for path in cuda_runtime_libraries():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            if "cuda" in os.path.basename(path):
                raise
