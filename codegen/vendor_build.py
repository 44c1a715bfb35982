"""Build the vendor-kernel extension (cuDNN convolutions, cuBLASLt GEMMs) with nvcc.

The extension (codegen/vendor/*.cu) registers TVM FFI global functions -- ``nimble.cudnn.conv2d``,
``nimble.cudnn.conv2d_add``, ``nimble.cublas.matmul``, ``nimble.vendor.versions``, ... -- when it is
loaded with :func:`tvm_nimble.runtime.vendor.load_vendor_library`. It compiles against tvm-ffi's
headers and the cuDNN / cuBLAS headers of the pip wheels ``nvidia-cudnn-cu13`` and
``nvidia-cublas`` (``pip install "tvm-nimble[vendor]"``), links libcudnn.so.9, libcublasLt.so.13
and libtvm_ffi.so by soname, and has no rpath: the runtime loader preloads those libraries.

Built libraries are cached under ``~/.cache/tvm-nimble/vendor/`` keyed by the sources' sha256,
the arch, the nvcc version and the cuDNN / cuBLAS header versions.

Only the standard library and tvm_ffi are imported here (no ``tvm.relax``), so a GPU machine that
has the TVM runtime alone can build the extension too.
"""
from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

from tvm_nimble import env
from tvm_nimble.errors import NimbleError
from tvm_nimble.native_libs import nvidia_roots

SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor")
LIB_NAME = "libnimble_vendor.so"
FIX = 'pip install "tvm-nimble[vendor]" (the wheels nvidia-cudnn-cu13, nvidia-cublas and nvidia-cudnn-frontend)'


class VendorBuildError(NimbleError):
    """The vendor-kernel extension cannot be built here."""


def find_nvcc() -> str | None:
    """nvcc from $PATH, $CUDA_HOME/bin or /usr/local/cuda/bin."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in env.cuda_homes():
        if os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return None


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else out.strip()


def _all_nvidia_roots() -> list[str]:
    """The wheels' ``nvidia/`` folders: beside tvm_ffi/numpy (as the runtime loader sees them), then on sys.path."""
    roots = list(nvidia_roots())
    for entry in sys.path:
        d = os.path.join(os.path.abspath(entry or "."), "nvidia")
        if os.path.isdir(d) and d not in roots:
            roots.append(d)
    return roots


def vendor_paths() -> dict[str, str]:
    """Include and library directories of the cuDNN 9 and cuBLAS 13 wheels (raises VendorBuildError)."""
    found: dict[str, str] = {}
    for root in _all_nvidia_roots():
        for key, rel, probe in (("cudnn_include", "cudnn/include", "cudnn.h"),
                                ("cudnn_lib", "cudnn/lib", "libcudnn.so.9"),
                                ("cublas_include", "cu13/include", "cublasLt.h"),
                                ("cublas_lib", "cu13/lib", "libcublasLt.so.13"),
                                # older cuBLAS wheel layout (nvidia/cublas/{include,lib})
                                ("cublas_include", "cublas/include", "cublasLt.h"),
                                ("cublas_lib", "cublas/lib", "libcublasLt.so.13")):
            d = os.path.join(root, rel)
            if key not in found and os.path.isfile(os.path.join(d, probe)):
                found[key] = d
    frontend = [env.get(env.CUDNN_FRONTEND_INCLUDE, "")] + [
        os.path.join(os.path.abspath(e or "."), "include") for e in sys.path]  # the wheel's headers: site-packages/include
    for d in frontend:
        if d and os.path.isfile(os.path.join(d, "cudnn_frontend.h")):
            found["cudnn_frontend_include"] = d
            break
    names = {"cudnn_include": "cuDNN 9 (cudnn.h, libcudnn.so.9)", "cudnn_lib": "cuDNN 9 (cudnn.h, libcudnn.so.9)",
             "cublas_include": "cuBLAS 13 (cublasLt.h, libcublasLt.so.13)",
             "cublas_lib": "cuBLAS 13 (cublasLt.h, libcublasLt.so.13)",
             "cudnn_frontend_include": "the cuDNN frontend (cudnn_frontend.h, nvidia-cudnn-frontend)"}
    missing = [k for k in names if k not in found]
    if missing:
        what = " and ".join(sorted({names[k] for k in missing}))
        raise VendorBuildError(f"the vendor extension needs the headers and libraries of {what}, not found in the "
                               f"installed nvidia wheels: {FIX}")
    return found


def vendor_available() -> tuple[bool, str]:
    """(True, "") when nvcc and the cuDNN/cuBLAS wheels are here, else (False, why)."""
    if find_nvcc() is None:
        return False, "nvcc not found (install the CUDA toolkit, or put nvcc on PATH / set CUDA_HOME)"
    try:
        vendor_paths()
    except VendorBuildError as err:
        return False, str(err)
    return True, ""


def _sources() -> list[str]:
    """Every file the build depends on (what its cache key hashes): the .cu units and their headers."""
    return sorted(glob.glob(os.path.join(SOURCE_DIR, "*.cu")) + glob.glob(os.path.join(SOURCE_DIR, "*.h")))


def _units() -> list[str]:
    """The translation units nvcc compiles (the headers come in through #include)."""
    return [s for s in _sources() if s.endswith(".cu")]


def _header_versions(paths: dict[str, str]) -> str:
    out = []
    for path, names in ((os.path.join(paths["cudnn_include"], "cudnn_version.h"),
                         ("CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL")),
                        (os.path.join(paths["cublas_include"], "cublas_api.h"),
                         ("CUBLAS_VER_MAJOR", "CUBLAS_VER_MINOR", "CUBLAS_VER_PATCH"))):
        text = open(path).read() if os.path.exists(path) else ""
        out.append(".".join((re.search(rf"#define {n}\s+(\d+)", text) or [None, "?"])[1] for n in names))
    text = open(os.path.join(paths["cudnn_frontend_include"], "cudnn_frontend_version.h")).read()
    frontend = ".".join((re.search(rf"#define CUDNN_FRONTEND_{n}_VERSION\s+(\d+)", text) or [None, "?"])[1]
                        for n in ("MAJOR", "MINOR", "PATCH"))
    return f"cudnn {out[0]}, cublas {out[1]}, cudnn-frontend {frontend}"


def _normalize_arch(arch: str) -> str:
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)([af]?)", str(arch).strip())
    if not m:
        raise VendorBuildError(f"arch {arch!r} is not a CUDA arch: use e.g. 'sm_90'")
    return f"sm_{m[1]}{m[2]}"


def build_commands(arch: str, out: str, objdir: str, nvcc: str | None = None,
                   paths: dict[str, str] | None = None) -> tuple[list[list[str]], list[str]]:
    """The nvcc command lines that build the extension for ``arch`` into ``out``: one compile per
    translation unit (objects in ``objdir``, independent of each other: they run in parallel) and the link."""
    import tvm_ffi.libinfo

    arch = _normalize_arch(arch)
    nvcc = nvcc or find_nvcc() or "nvcc"
    paths = paths or vendor_paths()
    num = arch[3:]
    ffi_lib = tvm_ffi.libinfo.find_libtvm_ffi()
    flags = [nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wno-deprecated-declarations",
             "-diag-suppress", "1444",  # cuDNN's legacy convolution API is marked deprecated in cuDNN 9
             # the cuDNN frontend dlopens libcudnn (preloaded by the runtime) and NVRTC (only for experimental
             # engines) instead of linking them: no libnvrtc needed where the extension runs
             "-DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING",
             "-gencode", f"arch=compute_{num},code=[{arch},compute_{num}]",
             # the wheels' headers first: they must win over the toolkit's own cuBLAS headers
             "-I", paths["cudnn_include"], "-I", paths["cublas_include"], "-I", paths["cudnn_frontend_include"],
             "-I", tvm_ffi.libinfo.find_include_path(), "-I", tvm_ffi.libinfo.find_dlpack_include_path()]
    objects = [os.path.join(objdir, os.path.basename(u)[:-3] + ".o") for u in _units()]
    compiles = [flags + ["-c", unit, "-o", obj] for unit, obj in zip(_units(), objects)]
    link = [nvcc, "-shared", "-o", out, *objects,
            # by soname, without rpath: tvm_nimble.runtime.vendor preloads these before loading the extension
            "-L", paths["cudnn_lib"], "-l:libcudnn.so.9",
            "-L", paths["cublas_lib"], "-l:libcublasLt.so.13",
            "-L", os.path.dirname(ffi_lib), "-ltvm_ffi"]
    return compiles, link


def _run_nvcc(cmd: list[str], arch: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = " | ".join(ln for ln in (r.stderr or r.stdout).splitlines() if "error" in ln.lower())[:600]
        raise VendorBuildError(f"nvcc failed to build the vendor extension for {arch}: "
                               f"{tail or (r.stderr or r.stdout).strip()[-600:]}")


def _compile_and_link(arch: str, out: str, nvcc: str, paths: dict[str, str]) -> None:
    """The units compiled side by side (one nvcc each, ``$TVM_NIMBLE_JOBS`` at once, default this machine's
    cores, as for TVM's kernels: the cuDNN frontend's unit alone takes minutes), then linked."""
    from concurrent.futures import ThreadPoolExecutor

    from .cuda_split import jobs

    with tempfile.TemporaryDirectory() as objdir:
        compiles, link = build_commands(arch, out, objdir, nvcc, paths)
        with ThreadPoolExecutor(max_workers=max(1, min(len(compiles), jobs()))) as pool:
            for future in [pool.submit(_run_nvcc, cmd, arch) for cmd in compiles]:
                future.result()
        _run_nvcc(link, arch)


def build_vendor_library(arch: str, out_path: str | None = None) -> str:
    """Compile the extension for ``arch`` (e.g. "sm_90"); return the path of the shared library.

    Reuses a cached build with the same sources, arch, nvcc and library headers. With ``out_path``
    the library is also copied there.
    """
    arch = _normalize_arch(arch)
    nvcc = find_nvcc()
    if nvcc is None:
        raise VendorBuildError("nvcc not found: the vendor extension is compiled with nvcc; install the CUDA toolkit "
                               "(or put nvcc on PATH / set CUDA_HOME)")
    paths = vendor_paths()
    digest = hashlib.sha256()
    for src in _sources():
        digest.update(os.path.basename(src).encode() + b"\0")
        with open(src, "rb") as f:
            digest.update(f.read())
    with open(__file__, "rb") as f:  # the command line (its flags) is built here
        digest.update(f.read())
    digest.update(f"\0{arch}\0{nvcc_version(nvcc)}\0{_header_versions(paths)}".encode())
    cached = os.path.join(env.cache_dir("vendor"), f"{arch}-{digest.hexdigest()[:24]}", LIB_NAME)
    if not os.path.exists(cached):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(cached))
        os.close(fd)
        try:
            _compile_and_link(arch, tmp, nvcc, paths)
            os.replace(tmp, cached)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    if out_path is None:
        return cached
    out_path = os.path.abspath(out_path)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    shutil.copyfile(cached, out_path + ".tmp")
    os.replace(out_path + ".tmp", out_path)
    return out_path
