"""Build the vendor-kernel extension (cuDNN convolutions, cuBLASLt GEMMs, our fused kernels) with nvcc.

The extension (codegen/vendor/*.cu, *.cpp) registers TVM FFI global functions -- ``nimble.cudnn.conv2d``,
``nimble.cudnn.conv2d_add``, ``nimble.cublas.matmul``, ``nimble.vendor.versions``, ... -- when it is
loaded with :func:`tvm_nimble.runtime.vendor.load_vendor_library`. It compiles against tvm-ffi's
headers and the cuDNN / cuBLAS headers of the pip wheels ``nvidia-cudnn-cu13`` and
``nvidia-cublas`` (``pip install "tvm-nimble[vendor]"``), links libcudnn.so.9, libcublasLt.so.13
and libtvm_ffi.so by soname, and has no rpath: the runtime loader preloads those libraries.

Each ``.cu`` or ``.cpp`` file is a unit compiled on its own (:class:`VendorUnit`, read from its source: the functions
its constructor registers, the headers it includes, the functions of other units it calls). A ``.cpp`` unit is host
code (the cuDNN and cuBLASLt calls, the cuDNN frontend's graphs): nvcc hands it to the host compiler alone, at
``-O1``, with no device pass -- the device compiler parsed the frontend's headers for minutes although it had no
kernel to compile, and the host code runs only outside the captured graph (building a cuDNN graph, a live run).
A unit that includes the cuDNN frontend compiles at ``-O0``: the header-only frontend's code it instantiates is
most of its compile (the slowest units of a first build), and what that code does at run time is build graphs and
hand them to cuDNN.
The kernels such a unit launches live in a ``.cu`` unit behind a function a shared header declares. A build compiles the
units it needs side by side (``$TVM_NIMBLE_JOBS`` nvcc processes at once), each object cached under the cache
root by the hash of its unit, the headers it includes, the flags, the arch and the nvcc / cuDNN / cuBLAS
versions, and links them with a list of the functions the library registers (the symbol
``nimble_vendor_functions``, which the loader reads). A caller that knows which functions it needs (names,
or prefixes such as a provider's ``kernel_prefix``) gets a library of only the units that define them.
The link refuses a symbol nothing defines, so a unit that needs another one the scan missed fails the build,
not the load.

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
from collections.abc import Iterable
from dataclasses import dataclass

from tvm_nimble import env
from tvm_nimble.errors import NimbleError
from tvm_nimble.contract.vendor_abi import MANIFEST_SYMBOL
from tvm_nimble.native_libs import nvidia_roots

from .compile_cache import cached

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


# ---- the units, read from their sources ----------------------------------------------------------------------

@dataclass(frozen=True)
class VendorUnit:
    """One translation unit of the extension (a ``.cu`` file, or a ``.cpp`` file of host code), as its source
    describes it."""

    path: str
    headers: tuple[str, ...]  # the extension's headers it includes, directly or through another (its object's inputs)
    registers: tuple[str, ...]  # the global functions its constructor registers
    defines: tuple[str, ...]  # functions declared in a shared header (external linkage) that it defines
    calls: tuple[str, ...]  # such functions defined in another unit that it calls
    frontend: bool = False  # it includes the cuDNN frontend (directly or through one of its headers)

    @property
    def name(self) -> str:
        return os.path.splitext(os.path.basename(self.path))[0]

    @property
    def host_only(self) -> bool:
        """A ``.cpp`` unit: host code, compiled without nvcc's device pass."""
        return self.path.endswith(".cpp")


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_FRONTEND = re.compile(r'^\s*#\s*include\s+<cudnn_frontend\.h>', re.M)
_CONSTANT = re.compile(r'constexpr\s+const\s+char\s*\*\s*(\w+)\s*=\s*"([^"]+)"')
_REGISTER = re.compile(r'\bRegister\(\s*(?:"([^"]+)"|(\w+))\s*,')
#: a function declaration: a return type, the name, the parameters (no body)
_DECLARATION = re.compile(r"(?:^|(?<=[;{}]))\s*(?:[\w:<>]+[\s*&]+)+(\w+)\s*\([^;{}]*\)\s*;")


def _code(text: str) -> str:
    """``text`` without comments and string or character literals (what brace matching and the scans read)."""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', " ", text, flags=re.S)


def _outside_unnamed_namespaces(code: str) -> str:
    """``code`` without the bodies of its unnamed namespaces (what has internal linkage)."""
    out, pos = [], 0
    for match in re.finditer(r"\bnamespace\s*\{", code):
        if match.start() < pos:
            continue  # nested in an unnamed namespace already dropped
        out.append(code[pos:match.start()])
        depth, i = 1, match.end()
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        pos = i
    return "".join(out) + code[pos:]


def _headers_of(path: str) -> list[str]:
    """The extension's headers ``path`` includes, directly or through another, in include order."""
    seen: dict[str, None] = {}
    todo = [path]
    while todo:
        with open(todo.pop(0)) as f:
            for name in _INCLUDE.findall(f.read()):
                header = os.path.join(os.path.dirname(path), name)
                if os.path.isfile(header) and header not in seen:
                    seen[header] = None
                    todo.append(header)
    return list(seen)


def scan_units(source_dir: str = SOURCE_DIR) -> list[VendorUnit]:
    """Every unit of the extension in ``source_dir``, in name order."""
    paths = sorted(glob.glob(os.path.join(source_dir, "*.cu")) + glob.glob(os.path.join(source_dir, "*.cpp")))
    headers = {p: _headers_of(p) for p in paths}
    shared: dict[str, set[str]] = {}  # header -> the functions it declares with external linkage
    bodies: dict[str, str] = {}  # header -> its code without declarations (what its inline functions call)
    texts: dict[str, str] = {}
    for header in {h for hs in headers.values() for h in hs}:
        with open(header) as f:
            texts[header] = f.read()
        code = _code(texts[header])
        shared[header] = set(_DECLARATION.findall(_outside_unnamed_namespaces(code)))
        bodies[header] = _DECLARATION.sub(" ", code)
    units = []
    for path in paths:
        with open(path) as f:
            text = f.read()
        code = _code(text)
        constants = dict(_CONSTANT.findall(text))
        registers = tuple(literal or constants[name] for literal, name in _REGISTER.findall(text))
        declared = set().union(*(shared[h] for h in headers[path])) if headers[path] else set()
        external = _outside_unnamed_namespaces(code)
        defines = sorted(n for n in declared if re.search(rf"\b{n}\s*\([^;{{}}]*\)\s*\{{", external))
        # a call in the unit, or in a function of a header it includes (conv_args.h's launcher calls LaunchBiasAct)
        uses = code + "".join(bodies[h] for h in headers[path])
        calls = sorted(n for n in declared - set(defines) if re.search(rf"\b{n}\s*\(", uses))
        frontend = bool(_FRONTEND.search(text)) or any(_FRONTEND.search(texts[h]) for h in headers[path])
        units.append(VendorUnit(path, tuple(headers[path]), registers, tuple(defines), tuple(calls), frontend))
    return units


def units_for(kernels: Iterable[str] | None = None, units: list[VendorUnit] | None = None) -> list[VendorUnit]:
    """The units a library offering ``kernels`` needs: those registering a function that one of them names or
    is a prefix of (a provider's ``kernel_prefix``), and the units defining what those call; every unit for
    None. A kernel no unit registers is a :class:`VendorBuildError`."""
    units = scan_units() if units is None else units
    if kernels is None:
        return list(units)
    wanted = sorted(set(kernels))
    chosen = {u.path for u in units if any(f.startswith(k) for f in u.registers for k in wanted)}
    unknown = [k for k in wanted if not any(f.startswith(k) for u in units for f in u.registers)]
    if unknown:
        known = sorted(f for u in units for f in u.registers)
        raise VendorBuildError(f"no unit of the vendor extension registers {', '.join(unknown)}: the functions are "
                               f"{', '.join(known)}")
    definer = {name: u.path for u in units for name in u.defines}
    by_path = {u.path: u for u in units}
    todo = list(chosen)
    while todo:
        for name in by_path[todo.pop()].calls:
            if name in definer and definer[name] not in chosen:
                chosen.add(definer[name])
                todo.append(definer[name])
    return [u for u in units if u.path in chosen]


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



# ---- compiling and linking -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Toolchain:
    """What every compile and the link of one build share: nvcc, the arch, the libraries' directories and the
    versions that go in each cache key."""

    nvcc: str
    arch: str
    paths: dict
    versions: str  # nvcc's, cuDNN's, cuBLAS's and the cuDNN frontend's

    @classmethod
    def find(cls, arch: str) -> "Toolchain":
        """This machine's, for ``arch`` (raises :class:`VendorBuildError` naming what is missing)."""
        arch = _normalize_arch(arch)
        nvcc = find_nvcc()
        if nvcc is None:
            raise VendorBuildError("nvcc not found: the vendor extension is compiled with nvcc; install the CUDA "
                                   "toolkit (or put nvcc on PATH / set CUDA_HOME)")
        paths = vendor_paths()
        return cls(nvcc, arch, paths, f"{nvcc_version(nvcc)}; {_header_versions(paths)}")

    def flags(self, unit: VendorUnit) -> list[str]:
        """nvcc's flags for ``unit``: a ``.cu`` unit's at -O3 for ``arch`` (SASS and PTX), a host-only unit's at -O1
        without device code (-O0 where it includes the cuDNN frontend); ``$TVM_NIMBLE_VENDOR_OPT_LEVEL`` below those
        lowers them, the device compilers' (cicc, ptxas) too."""
        import tvm_ffi.libinfo

        num, host_only = self.arch[3:], unit.host_only
        level = env.vendor_opt_level()
        device = [] if host_only else ["-gencode", f"arch=compute_{num},code=[{self.arch},compute_{num}]"]
        if level < 3 and not host_only:
            device += ["-Xcicc", f"-O{level}", "-Xptxas", f"-O{level}"]
        opt = min(level, 0 if unit.frontend else 1) if host_only else level
        return [self.nvcc, f"-O{opt}", "-std=c++17",
                "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wno-deprecated-declarations",
                *([] if host_only else ["-diag-suppress", "1444"]),  # cuDNN's legacy API is deprecated in cuDNN 9
                # the cuDNN frontend dlopens libcudnn (preloaded by the runtime) and NVRTC (only for experimental
                # engines) instead of linking them: no libnvrtc needed where the extension runs
                "-DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING",
                # nor its JSON (nlohmann's header): graph (de)serialization and errata files, which the extension
                # never uses, were half of each host unit's compile time (benchmarks/findings.md)
                "-DCUDNN_FRONTEND_SKIP_JSON_LIB", *device,
                # the wheels' headers first: they must win over the toolkit's own cuBLAS headers
                "-I", self.paths["cudnn_include"], "-I", self.paths["cublas_include"],
                "-I", self.paths["cudnn_frontend_include"],
                "-I", tvm_ffi.libinfo.find_include_path(), "-I", tvm_ffi.libinfo.find_dlpack_include_path()]

    def compile_command(self, unit: VendorUnit, obj: str) -> list[str]:
        return self.flags(unit) + ["-c", unit.path, "-o", obj]

    def link_command(self, objects: list[str], manifest: str, out: str) -> list[str]:
        import tvm_ffi.libinfo

        return [self.nvcc, "-shared", "-Xcompiler", "-fPIC", "-o", out, *objects, manifest,
                # a symbol no object defines (a unit another needs left out) fails here, not when the library loads
                "-Xlinker", "-z,defs",
                # by soname, without rpath: tvm_nimble.runtime.vendor preloads these before loading the extension
                "-L", self.paths["cudnn_lib"], "-l:libcudnn.so.9",
                "-L", self.paths["cublas_lib"], "-l:libcublasLt.so.13",
                "-L", os.path.dirname(tvm_ffi.libinfo.find_libtvm_ffi()), "-ltvm_ffi"]

    def object_key(self, unit: VendorUnit) -> str:
        """The hash an object is cached by: its unit and headers, the compile flags (paths aside from the
        unit's own), the arch and the versions."""
        digest = hashlib.sha256()
        for src in (unit.path, *unit.headers):
            digest.update(os.path.basename(src).encode() + b"\0")
            with open(src, "rb") as f:
                digest.update(f.read())
        digest.update("\0".join(self.flags(unit) + [self.arch, self.versions]).encode())
        return digest.hexdigest()[:24]

    def object_path(self, unit: VendorUnit) -> str:
        return os.path.join(env.cache_dir("vendor", "objects", self.arch), f"{unit.name}-{self.object_key(unit)}.o")


def _run_nvcc(cmd: list[str], arch: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = " | ".join(ln for ln in (r.stderr or r.stdout).splitlines()
                          if "error" in ln.lower() or "undefined reference" in ln)[:600]
        raise VendorBuildError(f"nvcc failed to build the vendor extension for {arch}: "
                               f"{tail or (r.stderr or r.stdout).strip()[-600:]}")


def compile_units(units: list[VendorUnit], tools: Toolchain, on_compiled=None) -> list[str]:
    """The units' objects, those not cached compiled side by side (``$TVM_NIMBLE_JOBS`` nvcc processes at once,
    default this machine's cores: the cuDNN frontend's units alone take minutes), in unit order. ``on_compiled``:
    called with each unit compiled here (not a cached one), as it finishes."""
    from concurrent.futures import ThreadPoolExecutor

    def one(unit: VendorUnit) -> str:
        def compile_to(tmp: str) -> None:
            _run_nvcc(tools.compile_command(unit, tmp), tools.arch)
            if on_compiled is not None:
                on_compiled(unit)

        return cached(tools.object_path(unit), compile_to, f"nvcc vendor unit {unit.name}")

    # the cuDNN frontend's units first: the slowest, they would otherwise wait for a worker behind the quick ones
    missing = sorted((u for u in units if not os.path.exists(tools.object_path(u))), key=lambda u: not u.frontend)
    if len(missing) > 1:
        with ThreadPoolExecutor(max_workers=max(1, min(len(missing), env.jobs()))) as pool:
            for future in [pool.submit(one, u) for u in missing]:
                future.result()
    return [one(u) for u in units]


def _manifest_source(functions: list[str]) -> str:
    """A C++ file defining the symbol the loader reads: the functions the library registers, one a line."""
    listed = "".join(f"{f}\\n" for f in functions)
    return (f'extern "C" __attribute__((visibility("default"), used)) const char* const {MANIFEST_SYMBOL} = '
            f'"{listed}";\n')


def link_units(units: list[VendorUnit], objects: list[str], tools: Toolchain) -> str:
    """The library of ``objects`` (the units' objects), cached by their keys and the link's flags."""
    functions = sorted(f for u in units for f in u.registers)
    digest = hashlib.sha256("\0".join([*objects, *functions, tools.versions]).encode())
    out = os.path.join(env.cache_dir("vendor"), f"{tools.arch}-{digest.hexdigest()[:24]}", LIB_NAME)

    def link(tmp: str) -> None:
        with tempfile.TemporaryDirectory(prefix="nimble-vendor-") as folder:
            manifest = os.path.join(folder, "functions.cpp")
            with open(manifest, "w") as f:
                f.write(_manifest_source(functions))
            _run_nvcc(tools.link_command(objects, manifest, tmp), tools.arch)

    return cached(out, link, f"nvcc vendor link of {len(units)} units")


def units_compiled(arch: str, kernels: Iterable[str] | None = None) -> bool:
    """Whether every unit a library of ``kernels`` needs (:func:`units_for`) is compiled already for ``arch``: then
    :func:`build_vendor_library` has at most a link to do."""
    tools = Toolchain.find(arch)
    return all(os.path.exists(tools.object_path(u)) for u in units_for(kernels))


def build_vendor_library(arch: str, out_path: str | None = None, kernels: Iterable[str] | None = None,
                         on_compiled=None) -> str:
    """Compile the extension for ``arch`` (e.g. "sm_90"); return the path of the shared library.

    ``kernels``: the functions the caller needs (names, or prefixes such as a provider's ``kernel_prefix``):
    only the units defining them are built (:func:`units_for`); None builds every unit. Reuses the cached
    objects and library of the same sources, arch, nvcc and library headers. With ``out_path`` the library is
    also copied there. ``on_compiled``: see :func:`compile_units`.
    """
    tools = Toolchain.find(arch)
    units = units_for(kernels)
    cached_lib = link_units(units, compile_units(units, tools, on_compiled), tools)
    if out_path is None:
        return cached_lib
    out_path = os.path.abspath(out_path)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    shutil.copyfile(cached_lib, out_path + ".tmp")
    os.replace(out_path + ".tmp", out_path)
    return out_path
