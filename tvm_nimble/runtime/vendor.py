"""Load the vendor-kernel extension (cuDNN convolutions, cuBLASLt GEMMs) on a deploy machine.

The extension, built by ``codegen.vendor_build``, links libcudnn.so.9, libcublasLt.so.13 and
libtvm_ffi.so by soname and carries no rpath. :func:`load_vendor_library` therefore first preloads
cuBLASLt / cuBLAS 13 and cuDNN 9 -- from the installed pip wheels (``nvidia-cublas``,
``nvidia-cudnn-cu13``), then through the system loader -- and then loads the extension, whose
constructor registers the TVM FFI global functions ``nimble.cudnn.conv2d``,
``nimble.cudnn.conv2d_add``, ``nimble.cublas.matmul``, ``nimble.cudnn.conv2d_algos``,
``nimble.vendor.versions`` and ``nimble.vendor.plans``.

Where the libraries are looked for can be chosen: the ``search_dirs`` / ``system`` arguments, or
the environment variables ``NIMBLE_VENDOR_LIB_DIRS`` (directories, ``os.pathsep``-separated,
replacing the wheels' lib dirs) and ``NIMBLE_VENDOR_SYSTEM_LIBS=0`` (do not ask the system loader).

Runtime side: imports only os, ctypes and tvm_ffi (no ``tvm.relax``, nothing from the compiler).
"""
from __future__ import annotations

import ctypes
import os

import tvm_ffi

from tvm_nimble import env
from tvm_nimble.contract.vendor_abi import CUDNN_CONV2D_ALGOS, FUNCTIONS, MANIFEST_SYMBOL, VENDOR_VERSIONS
from tvm_nimble.errors import NimbleError
from tvm_nimble.native_libs import nvidia_roots

ENV_LIB_DIRS = env.VENDOR_LIB_DIRS
ENV_SYSTEM = env.VENDOR_SYSTEM_LIBS

#: the symbol through which a library built by ``codegen.vendor_build`` lists the functions it registers, one a
#: line (a library of some of the units registers only theirs); a library without it registers all of FUNCTIONS

# (library, major, what, pip package), in load order: cuDNN's engines use cuBLASLt.
LIBRARIES = (("libcublasLt", 13, "cuBLASLt 13", "nvidia-cublas"),
             ("libcublas", 13, "cuBLAS 13", "nvidia-cublas"),
             ("libcudnn", 9, "cuDNN 9", "nvidia-cudnn-cu13"))

_preloaded: dict[str, ctypes.CDLL] = {}
_extensions: dict[str, ctypes.CDLL] = {}


class VendorLibraryError(NimbleError):
    """cuDNN / cuBLAS or the vendor extension cannot be loaded."""


def wheel_lib_dirs() -> list[str]:
    """Library directories of the nvidia-cudnn-cu13 and nvidia-cublas wheels that exist here."""
    out = []
    for root in nvidia_roots():
        for rel in ("cudnn/lib", "cu13/lib", "cublas/lib"):
            d = os.path.join(root, rel)
            if os.path.isdir(d) and d not in out:
                out.append(d)
    return out


def library_search_dirs(search_dirs=None) -> list[str]:
    """Directories searched before the system loader: ``search_dirs``, else $NIMBLE_VENDOR_LIB_DIRS, else the wheels'."""
    if search_dirs is not None:
        return [str(d) for d in search_dirs]
    dirs_env = env.get(ENV_LIB_DIRS)
    if dirs_env is not None:
        return [d for d in dirs_env.split(os.pathsep) if d]
    return wheel_lib_dirs()


def _older_majors(base: str, major: int, dirs: list[str]) -> list[tuple[int, str]]:
    found = []
    prefix = base + ".so."
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if name.startswith(prefix):
                head = name[len(prefix):].split(".")[0]
                if head.isdigit() and int(head) < major:
                    found.append((int(head), os.path.join(d, name)))
    return sorted(found, reverse=True)


def _runtime_major(base: str, lib: ctypes.CDLL) -> int | None:
    """The major version the loaded library reports (None where it cannot say)."""
    try:
        if base == "libcudnn":
            fn = lib.cudnnGetVersion
            fn.restype = ctypes.c_size_t
            return int(fn()) // 10000
        if base == "libcublasLt":
            fn = lib.cublasLtGetVersion
            fn.restype = ctypes.c_size_t
            return int(fn()) // 10000
        if base == "libcublas":
            value = ctypes.c_int(0)
            if lib.cublasGetProperty(0, ctypes.byref(value)) == 0:  # MAJOR_VERSION
                return value.value
    except AttributeError:
        return None
    return None


def _describe(dirs: list[str]) -> str:
    if not dirs:
        return "no search directory"
    shown = ", ".join(dirs[:3]) + (f" and {len(dirs) - 3} more" if len(dirs) > 3 else "")
    return shown


def preload_vendor_libraries(search_dirs=None, system: bool | None = None) -> dict[str, str]:
    """Load cuBLASLt/cuBLAS 13 and cuDNN 9 process-wide (RTLD_GLOBAL); return {library: path loaded}.

    Raises VendorLibraryError (one line naming the library and the pip package) when one is
    missing or has an older major version.
    """
    dirs = library_search_dirs(search_dirs)
    if system is None:
        system = env.get(ENV_SYSTEM, "1") != "0"
    loaded = {}
    for base, major, what, package in LIBRARIES:
        soname = f"{base}.so.{major}"
        fix = f'pip install {package} (or "tvm-nimble[vendor]")'
        path = next((os.path.join(d, soname) for d in dirs if os.path.isfile(os.path.join(d, soname))), None)
        if path is None:
            older = _older_majors(base, major, dirs)
            if older:
                raise VendorLibraryError(f"{base} in {older[0][1]} is major version {older[0][0]}, but the vendor "
                                         f"extension needs {soname} ({what}): {fix}")
        key = path or soname
        if key in _preloaded:
            loaded[base] = key
            continue
        try:
            if path is not None:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            elif system:
                lib = ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
            else:
                raise OSError("not found")
        except OSError as err:
            where = _describe(dirs) + (" nor by the system loader" if system else "")
            reason = "" if path is None else f" ({str(err).splitlines()[0] if str(err) else 'dlopen failed'})"
            raise VendorLibraryError(f"{soname} ({what}) {'could not be loaded' if path else 'not found'} "
                                     f"{'from ' + path if path else 'in ' + where}{reason}: {fix}") from None
        got = _runtime_major(base, lib)
        if got is not None and got < major:
            raise VendorLibraryError(f"{base} loaded from {path or 'the system'} reports major version {got}, but "
                                     f"the vendor extension needs {what}: {fix}")
        _preloaded[key] = lib
        loaded[base] = key
    return loaded


def load_vendor_library(path: str, search_dirs=None, system: bool | None = None) -> dict:
    """Preload cuDNN/cuBLAS, then load the extension at ``path`` so its global functions register.

    Returns {name: tvm_ffi.Function} of the functions the library registers (its list, :data:`MANIFEST_SYMBOL`:
    all of FUNCTIONS, or those of the units it was built from). Loading needs no GPU; several libraries (of
    different units) load side by side.
    """
    preload_vendor_libraries(search_dirs, system)
    real = os.path.realpath(str(path))
    if not os.path.isfile(real):
        raise VendorLibraryError(f"vendor extension {path} not found: build it with "
                                 f"codegen.vendor_build.build_vendor_library(arch)")
    if real not in _extensions:
        try:
            _extensions[real] = ctypes.CDLL(real, mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            first = str(err).splitlines()[0] if str(err) else "dlopen failed"
            raise VendorLibraryError(f"cannot load the vendor extension {path}: {first}") from None
    funcs = {}
    for name in library_functions(_extensions[real]):
        fn = tvm_ffi.get_global_func(name, allow_missing=True)
        if fn is None:
            raise VendorLibraryError(f"the vendor extension {path} loaded but did not register {name}: rebuild it "
                                     f"with codegen.vendor_build.build_vendor_library(arch)")
        funcs[name] = fn
    return funcs


def library_functions(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The functions a loaded extension registers: its :data:`MANIFEST_SYMBOL` list, else all of FUNCTIONS."""
    try:
        listed = ctypes.c_char_p.in_dll(lib, MANIFEST_SYMBOL).value or b""
    except ValueError:  # built before libraries listed their functions
        return FUNCTIONS
    return tuple(name for name in listed.decode().split("\n") if name)


def vendor_versions() -> str:
    """cuDNN / cuBLAS / CUDA runtime versions, as the loaded extension reports them."""
    fn = tvm_ffi.get_global_func(VENDOR_VERSIONS, allow_missing=True)
    if fn is None:
        raise VendorLibraryError("the vendor extension is not loaded: call load_vendor_library(path) first")
    return str(fn())


def conv2d_algos(x_shape, w_shape, attrs, dtype: str = "float32", device_id: int = 0) -> list[dict]:
    """cuDNN's heuristic list for one convolution (needs a GPU and the loaded extension).

    One dict per algorithm, best first: algo (cudnnConvolutionFwdAlgo_t), status (0 = usable here),
    workspace_bytes, math_type (cudnnMathType_t this extension would use), determinism. With
    attrs[8] = -1, ``nimble.cudnn.conv2d`` takes the first usable one whose workspace fits.
    """
    fn = tvm_ffi.get_global_func(CUDNN_CONV2D_ALGOS, allow_missing=True)
    if fn is None:
        raise VendorLibraryError("the vendor extension is not loaded: call load_vendor_library(path) first")
    rows = fn(tvm_ffi.Shape(list(x_shape)), tvm_ffi.Shape(list(w_shape)), tvm_ffi.Shape(list(attrs)), dtype, device_id)
    keys = ("algo", "status", "workspace_bytes", "math_type", "determinism")
    return [dict(zip(keys, (int(v) for v in row))) for row in rows]
