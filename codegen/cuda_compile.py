"""Compile CUDA kernels to a fatbin at build time, so artifacts need no compiler where they run.

TVM 0.27 built without a CUDA driver keeps CUDA *source* in the module and JIT-compiles it
with NVRTC when the module is loaded. An artifact should load with the TVM runtime alone,
so at build time we (1) register TVM's real CUDA module factory by loading
``libtvm_runtime_cuda.so`` (on a machine without a driver, against a small stub
``libcuda.so.1`` that is only linked, never called), and (2) route TVM's compile callback to
``nvcc -fatbin`` for the target's arch. The module TVM then serializes holds the fatbin. A large
source is compiled in parts by parallel nvcc processes (``cuda_split``; ``$TVM_NIMBLE_JOBS`` at once,
default: this machine's cores) into the same machine code.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import os
import shutil
import subprocess
import tempfile

import tvm
import tvm_ffi

from tvm_nimble import env
from tvm_nimble.errors import NimbleError
from tvm_nimble.native_libs import load_tvm_cuda_runtime

from .compile_cache import cached
from .cuda_split import compile_ptx_units, fatbin_from_ptx, merge_ptx, ptxas_options, split_units

#: in the fatbin cache's key: a fatbin made from merged PTX holds other PTX text (the same machine code)
#: than one nvcc run's, and a build reads back what this version makes
_FATBIN_FORMAT = "units-1"

# Driver symbols libtvm_runtime_cuda.so links against (checked with `nm -D` when available).
_DRIVER_SYMBOLS = ["cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString",
                   "cuLaunchKernelEx", "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload",
                   "cuTensorMapEncodeTiled"]


class CudaBuildError(NimbleError):
    """CUDA kernels cannot be compiled to a binary here."""


def tvm_lib_dir() -> str:
    return os.path.join(os.path.dirname(tvm.__file__), "lib")


def _driver_symbols(runtime_lib: str) -> list[str]:
    nm = shutil.which("nm")
    if not nm:
        return _DRIVER_SYMBOLS
    out = subprocess.run([nm, "-D", "--undefined-only", runtime_lib], capture_output=True, text=True).stdout
    syms = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()}
    return sorted(s for s in syms if s.startswith("cu") and s[2:3].isupper()) or _DRIVER_SYMBOLS


def _stub_driver(runtime_lib: str) -> str:
    """Build (once) a stub libcuda.so.1 whose functions all fail: enough to link, never to run."""
    syms = _driver_symbols(runtime_lib)
    path = os.path.join(env.cache_root(), f"stub-libcuda-{abs(hash(tuple(syms))) % 10**8}", "libcuda.so.1")
    if os.path.exists(path):
        return path
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise CudaBuildError("building CUDA kernels without a GPU driver needs a C compiler (cc/gcc); install gcc")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "stub.c")
        with open(src, "w") as f:
            f.write("".join(f"int {s}(void) {{ return 999; }}\n" for s in syms))
        subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", path + ".tmp", src], check=True)
    os.replace(path + ".tmp", path)
    return path


def load_cuda_runtime() -> None:
    """Register TVM's CUDA runtime in this process, also where no GPU driver is installed.

    The libraries are :func:`tvm_nimble.native_libs.cuda_runtime_libraries` (what the runtime loads too); at
    build time ``libcuda.so.1`` may be missing, so a stub is loaded first to satisfy the linker."""
    if "ffi.Module.load_from_bytes.cuda" in tvm_ffi.registry.list_global_func_names():
        return
    runtime_lib = os.path.join(tvm_lib_dir(), "libtvm_runtime_cuda.so")
    if not os.path.exists(runtime_lib):
        raise CudaBuildError(f"{runtime_lib} is missing: this TVM wheel has no CUDA runtime")
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        ctypes.CDLL(_stub_driver(runtime_lib), mode=ctypes.RTLD_GLOBAL)
    try:
        load_tvm_cuda_runtime()
    except OSError as err:
        raise CudaBuildError(f"cannot load TVM's CUDA runtime {runtime_lib}: {err}") from None


def _arch(target: tvm.target.Target, nvcc: str) -> str:
    """The target's arch, checked against what ``nvcc`` can compile for (before any kernel is compiled)."""
    arch = target.attrs.get("arch")
    if not arch:
        raise CudaBuildError("the CUDA target has no arch: use {'kind': 'cuda', 'arch': 'sm_90'}")
    arch = str(arch)
    try:
        listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = []
    supported = sorted({a.replace("compute_", "sm_") for a in listed}, key=lambda a: int("".join(filter(str.isdigit, a)) or 0))
    if supported and arch not in supported:
        raise CudaBuildError(f"--arch {arch} is not a GPU arch this nvcc can compile for; use one of "
                             f"{', '.join(supported)} (sm_90 for H100/H200)")
    return arch


def _compile(code: str, target: tvm.target.Target, arch: str, nvcc: str, workers: int) -> bytearray:
    """The fatbin of ``code``: its units' PTX made by parallel nvcc processes and merged where the source
    splits (``cuda_split``), else one nvcc run, as TVM compiles it."""
    from tvm.support import nvcc as tvm_nvcc

    units = split_units(code)
    if units is not None:
        def ptx_of(unit: str) -> str:
            with target:  # the target is thread-local: each worker enters it
                return bytes(tvm_nvcc.compile_cuda(unit, target_format="ptx", arch=arch, compiler="nvcc")).decode()

        merged = merge_ptx(compile_ptx_units(units, ptx_of, workers))
        if merged is not None:
            return bytearray(fatbin_from_ptx(merged, nvcc, arch, ptxas_options()))
    with target:
        return tvm_nvcc.compile_cuda(code, target_format="fatbin", arch=arch, compiler="nvcc")


@contextlib.contextmanager
def fatbin_compilation(target: tvm.target.Target):
    """Within this context, TVM compiles CUDA kernels with nvcc to a fatbin for ``target``'s arch."""
    nvcc = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    if not nvcc:
        import warnings

        warnings.warn("nvcc not found: CUDA kernels stay as source and are compiled with NVRTC when loaded, so "
                      "the artifact needs NVRTC (cuda-python) where it runs; install the CUDA toolkit for a fatbin",
                      stacklevel=3)
        yield
        return
    arch = _arch(target, nvcc)
    load_cuda_runtime()
    workers = env.jobs()  # a bad $TVM_NIMBLE_JOBS is one line here, not an error inside TVM's callback
    previous = tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True)

    def compile_fatbin(code, *_):
        # Stock VM, VM + CUDA graph and Nimble builds of one model share their kernels: compile once (also
        # across processes building at the same time)
        key = hashlib.sha256(f"{nvcc}\0{arch}\0{_FATBIN_FORMAT}\0{code}".encode()).hexdigest()

        def make(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(bytes(_compile(code, target, arch, nvcc, workers)))

        with open(cached(os.path.join(env.cache_root(), "fatbin", f"{key}.fatbin"), make,
                         f"nvcc kernel module ({len(code) // 1024} KiB of CUDA)"), "rb") as f:
            return bytearray(f.read())

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_fatbin, override=True)
    try:
        yield
    finally:
        if previous is not None:
            tvm_ffi.register_global_func("tvm_callback_cuda_compile", previous, override=True)
