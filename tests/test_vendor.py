"""The vendor-kernel extension (cuDNN conv, cuBLASLt GEMM): build, load and loader errors, on CPU.

Numerics, streams and CUDA graphs need a GPU: scripts/experiments/vendor_check.py checks those there.
"""
import ast
import ctypes
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tvm_ffi

from tvm_nimble.contract import vendor_abi
from tvm_nimble.errors import NimbleError
from tvm_nimble.runtime import vendor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _available():
    from tvm_nimble.codegen.vendor_build import vendor_available

    return vendor_available()


@pytest.fixture(scope="module")
def built_lib():
    ok, why = _available()
    if not ok:
        pytest.skip(f"cannot build the vendor extension here: {why}")
    from tvm_nimble.codegen.vendor_build import build_vendor_library

    return build_vendor_library("sm_90")


@pytest.fixture(scope="module")
def funcs(built_lib):
    return vendor.load_vendor_library(built_lib)


def _readelf_dynamic(path):
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf not found")
    return subprocess.run([readelf, "-d", path], capture_output=True, text=True, check=True).stdout


def test_extension_builds_for_sm90_without_rpath(built_lib, tmp_path):
    from tvm_nimble.codegen.vendor_build import build_vendor_library

    assert os.path.isfile(built_lib) and built_lib.endswith(".so")
    assert os.sep + os.path.join("tvm-nimble", "vendor") + os.sep in built_lib  # the cache
    dyn = _readelf_dynamic(built_lib)
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn))
    assert {"libcudnn.so.9", "libcublasLt.so.13", "libtvm_ffi.so"} <= needed
    assert "libcudart.so" not in " ".join(needed)  # the CUDA runtime is linked statically
    assert "RPATH" not in dyn and "RUNPATH" not in dyn
    # a second build is the cached one; out_path gets a copy
    out = build_vendor_library("90", str(tmp_path / "lib" / "libnimble_vendor.so"))
    assert open(out, "rb").read() == open(built_lib, "rb").read()


def test_the_vendor_opt_level_reaches_every_unit_and_keeps_the_objects_apart(monkeypatch):
    """TVM_NIMBLE_VENDOR_OPT_LEVEL (the suite runs at 0 without a GPU): each unit's nvcc command at that level, for
    the host and, in a .cu unit, for cicc and ptxas; an object key for each distinct command; unset is 3, whose
    commands (and cached objects) are the ones a build had before the switch; a level that is none is one line."""
    ok, why = _available()
    if not ok:
        pytest.skip(f"no vendor toolchain here: {why}")
    from tvm_nimble import env
    from tvm_nimble.codegen.vendor_build import Toolchain, scan_units

    tools, units = Toolchain.find("sm_90"), scan_units()
    assert {u.host_only for u in units} == {True, False}
    assert {u.name for u in units if u.frontend} == {"cudnn_attention", "cudnn_conv_graph"}
    seen = {}
    for level in ("0", "1", "2", "3", ""):
        monkeypatch.setenv(env.VENDOR_OPT_LEVEL, level)
        for u in units:
            cmd = tools.compile_command(u, "x.o")
            opts = [a for a in cmd if a.startswith("-O")]
            n = int(level or 3)
            if u.host_only:  # the cuDNN frontend's units at -O0 (their compile is the frontend's code), the others -O1
                assert opts == [f"-O{min(n, 0 if u.frontend else 1)}"] and "-Xcicc" not in cmd, cmd
            else:
                want = [f"-O{n}"] + ([f"-O{n}", f"-O{n}"] if n < 3 else [])
                assert opts == want, cmd
                if n < 3:
                    assert cmd[cmd.index("-Xcicc") + 1] == cmd[cmd.index("-Xptxas") + 1] == f"-O{n}"
            seen.setdefault(level, {})[u.path] = (tuple(cmd), tools.object_key(u))
    assert seen[""] == seen["3"]
    pairs = {pair for by_unit in seen.values() for pair in by_unit.values()}
    assert len({cmd for cmd, _ in pairs}) == len({key for _, key in pairs}) == len(pairs)  # a key per command
    monkeypatch.setenv(env.VENDOR_OPT_LEVEL, "fast")
    with pytest.raises(NimbleError, match="give an optimization level 0, 1, 2 or 3") as info:
        tools.compile_command(units[0], "x.o")
    assert "\n" not in str(info.value)


def test_build_errors_are_one_line(monkeypatch):
    from tvm_nimble.codegen import vendor_build

    with pytest.raises(vendor_build.VendorBuildError, match="sm_90"):
        vendor_build.build_vendor_library("hopper")
    monkeypatch.setattr(vendor_build, "find_nvcc", lambda: None)
    with pytest.raises(vendor_build.VendorBuildError) as err:
        vendor_build.build_vendor_library("sm_90")
    assert "nvcc" in str(err.value) and "\n" not in str(err.value)
    ok, why = vendor_build.vendor_available()
    assert not ok and "nvcc" in why
    monkeypatch.setattr(vendor_build, "_all_nvidia_roots", lambda: [])
    with pytest.raises(vendor_build.VendorBuildError) as err:
        vendor_build.vendor_paths()
    msg = str(err.value)
    assert "\n" not in msg and "nvidia-cudnn-cu13" in msg and "nvidia-cublas" in msg and "tvm-nimble[vendor]" in msg


def test_loading_registers_the_functions(funcs, built_lib):
    assert set(vendor_abi.FUNCTIONS) <= set(funcs)
    for name in vendor_abi.FUNCTIONS:
        assert tvm_ffi.get_global_func(name) is not None
    # host-only queries: answer without a GPU ("driver none" here)
    versions = vendor.vendor_versions()
    assert re.fullmatch(r"cudnn 9\.\d+\.\d+, cublas 13\.\d+\.\d+, cudart \d+\.\d+, driver (none|\d+\.\d+)", versions), versions
    assert list(funcs[vendor_abi.VENDOR_PLANS]()) == []
    # loading again is a no-op
    assert set(vendor.load_vendor_library(built_lib)) == set(funcs)


def _cpu(shape, dtype=np.float32):
    return tvm_ffi.from_dlpack(np.zeros(shape, dtype))


def _error(fn, *args):
    with pytest.raises(Exception) as err:
        fn(*args)
    msg = str(err.value)
    assert "\n" not in msg.strip(), msg
    return err


def test_arguments_are_checked_before_any_cuda_call(funcs):
    conv, conv_add, mm = (funcs[n] for n in (vendor_abi.CUDNN_CONV2D, vendor_abi.CUDNN_CONV2D_ADD,
                                            vendor_abi.CUBLAS_MATMUL))
    x, w, b, y, ws = _cpu((1, 3, 8, 8)), _cpu((4, 3, 3, 3)), _cpu((4,)), _cpu((1, 4, 8, 8)), _cpu((1,), np.uint8)
    good = tvm_ffi.Shape([1, 1, 1, 1, 1, 1, 1, 1, -1, 0])
    err = _error(conv, x, w, b, tvm_ffi.Shape([1, 1, 1, 1, 1, 1, 1, 0, -1]), y, ws)
    assert err.type is ValueError and f"{vendor_abi.CUDNN_CONV2D}: attrs must have 10 or 11 entries" in str(err.value)
    err = _error(conv, x, w, b, tvm_ffi.Shape([1, 1, 1, 1, 1, 1, 1, 3, -1, 0]), y, ws)
    assert "activation must be 0 (identity), 1 (relu) or 2 (relu6)" in str(err.value)
    err = _error(conv, x, w, b, tvm_ffi.Shape([1, 1, 1, 1, 1, 1, 1, 0, 8, 0]), y, ws)
    assert "algo must be -1 (choose)" in str(err.value)
    err = _error(conv, x, w, b, good, y, ws)
    assert err.type is ValueError and str(err.value) == f"{vendor_abi.CUDNN_CONV2D}: x must be a CUDA tensor, got device type 1"
    err = _error(conv_add, x, w, b, y, good, y, ws)
    assert f"{vendor_abi.CUDNN_CONV2D_ADD}: x must be a CUDA tensor" in str(err.value)
    err = _error(mm, _cpu((2, 3)), _cpu((4, 3)), _cpu((4,)), tvm_ffi.Shape([1, 2, 0]), _cpu((2, 4)), ws)
    assert f"{vendor_abi.CUBLAS_MATMUL}: a must be a CUDA tensor" in str(err.value)
    err = _error(mm, _cpu((2, 3)), _cpu((4, 3)), _cpu((4,)), tvm_ffi.Shape([2, 0, 0]), _cpu((2, 4)), ws)
    assert "transpose_b and allow_tf32 must be 0 or 1" in str(err.value)
    # the algorithm query needs a GPU: a clean error, not a crash
    err = _error(funcs[vendor_abi.CUDNN_CONV2D_ALGOS], tvm_ffi.Shape([1, 3, 8, 8]), tvm_ffi.Shape([4, 3, 3, 3]), good,
                 "float32", 0)
    assert vendor_abi.CUDNN_CONV2D_ALGOS in str(err.value)


def _cublas_dir():
    for d in vendor.wheel_lib_dirs():
        if os.path.isfile(os.path.join(d, "libcublasLt.so.13")) and os.path.isfile(os.path.join(d, "libcublas.so.13")):
            return d
    pytest.skip("the nvidia-cublas wheel is not installed")


def test_missing_cudnn_names_library_and_wheel(tmp_path):
    # the search path has cuBLAS but no cuDNN, and the system loader is not asked
    with pytest.raises(vendor.VendorLibraryError) as err:
        vendor.load_vendor_library(str(tmp_path / "never_reached.so"), search_dirs=[_cublas_dir(), str(tmp_path)],
                                   system=False)
    msg = str(err.value)
    assert isinstance(err.value, NimbleError)
    assert "\n" not in msg and "libcudnn" in msg and "nvidia-cudnn-cu13" in msg, msg


def test_missing_cudnn_through_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(vendor.ENV_LIB_DIRS, os.pathsep.join([_cublas_dir(), str(tmp_path)]))
    monkeypatch.setenv(vendor.ENV_SYSTEM, "0")
    with pytest.raises(vendor.VendorLibraryError, match=r"libcudnn\.so\.9 .*nvidia-cudnn-cu13"):
        vendor.preload_vendor_libraries()


def test_older_cudnn_and_missing_cublas(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "libcudnn.so.8").write_bytes(b"")  # only its name is looked at: an older major is refused
    with pytest.raises(vendor.VendorLibraryError) as err:
        vendor.preload_vendor_libraries([_cublas_dir(), str(old)], system=False)
    msg = str(err.value)
    assert "\n" not in msg and "major version 8" in msg and "libcudnn.so.9" in msg and "nvidia-cudnn-cu13" in msg
    with pytest.raises(vendor.VendorLibraryError) as err:
        vendor.preload_vendor_libraries([str(tmp_path)], system=False)
    msg = str(err.value)
    assert "\n" not in msg and "libcublasLt" in msg and "nvidia-cublas" in msg


def test_missing_extension(tmp_path):
    if not vendor.wheel_lib_dirs():
        pytest.skip("the cuDNN/cuBLAS wheels are not installed")
    with pytest.raises(vendor.VendorLibraryError, match="build_vendor_library"):
        vendor.load_vendor_library(str(tmp_path / "absent.so"))


def test_runtime_loader_imports_only_the_runtime():
    tree = ast.parse(open(os.path.join(ROOT, "tvm_nimble", "runtime", "vendor.py")).read())
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "tvm_nimble":
            mods |= {f"tvm_nimble.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mods.add(node.module if node.module.startswith("tvm_nimble.") else node.module.split(".")[0])
    assert mods <= {"__future__", "os", "ctypes", "tvm_ffi", "numpy", "tvm_nimble.errors", "tvm_nimble.env",
                    "tvm_nimble.native_libs", "tvm_nimble.contract.vendor_abi"}, mods


def test_gpu_check_script_fails_fast_without_a_gpu(tmp_path):
    script = os.path.join(ROOT, "scripts", "experiments", "vendor_check.py")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "--lib" in r.stdout and "--out" in r.stdout
    r = subprocess.run([sys.executable, script, "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("vendor_check: ") and ("PyTorch" in line or "GPU" in line), line


# ---- the units (#55): each compiles on its own, a library holds only the units asked for --------------------------

def test_units_register_every_function_and_name_the_units_they_call():
    from tvm_nimble.codegen.vendor_build import VendorBuildError, scan_units, units_for

    units = {u.name: u for u in scan_units()}
    registered = [f for u in units.values() for f in u.registers]
    assert sorted(registered) == sorted(vendor.FUNCTIONS)  # each function registered by exactly one unit
    # attention.cu launches the kernels of attention_tile_*.cu, attention_cluster.cu, attention_decode.cu (whose
    # cache-appending calls fall back on attention.cu's split-key call), attention_rows.cu and attention_split_*.cu
    assert units["attention"].calls == ("LaunchClusterAttention", "LaunchDecodeAttention", "LaunchRowPerWarpAttention",
                                        "LaunchSplitKeyBF16", "LaunchSplitKeyF16", "LaunchSplitKeyF32",
                                        "LaunchTileBF16", "LaunchTileF16", "LaunchTileF32")
    assert units["attention_decode"].calls == ("LaunchSplitKeyAttention",)
    every_attention = {"attention", "attention_cluster", "attention_decode", "attention_rows",
                       *(f"attention_{kernel}_{dtype}" for kernel in ("split", "tile")
                         for dtype in ("f32", "f16", "bf16"))}
    assert {u.name for u in units_for([vendor_abi.ATTENTION_SDPA])} == every_attention
    assert {u.name for u in units_for([vendor_abi.ATTENTION_APPEND_SDPA_BIAS])} == every_attention
    # the stencil kernels in a unit per dtype, which depthwise.cu's calls launch
    assert {u.name for u in units_for([vendor_abi.DEPTHWISE_POOL2D])} == {"depthwise", "depthwise_f32", "depthwise_f16",
                                                                        "depthwise_bf16"}
    # a provider's prefix; the host-only units (.cpp) link the unit of the kernels they launch
    assert [u.name for u in units_for([vendor_abi.CUDNN.prefix])] == ["nimble_vendor", "small_kernels"]
    assert [u.name for u in units_for([vendor_abi.CUDNN_GRAPH_CONV2D])] == ["cudnn_conv_graph", "small_kernels"]
    # cuDNN's SDPA converts a mask it does not read as it is with a kernel of small_kernels.cu
    assert [u.name for u in units_for([vendor_abi.ATTENTION_CUDNN_SDPA])] == ["cudnn_attention", "small_kernels"]
    assert {u.name for u in units.values() if u.host_only} == {"nimble_vendor", "cudnn_conv_graph", "cudnn_attention"}
    assert [u.name for u in units_for([vendor_abi.NORM_LAYER_NORM])] == ["layer_norm"]
    # the GEMV's kernels in a unit per weight dtype, which gemv.cu's calls launch
    assert [u.name for u in units_for([vendor_abi.GEMV.prefix])] == ["gemv", "gemv_bf16", "gemv_f16"]
    # the fp32 GEMM's two kernel kinds in a unit each (its calls time candidates with small_kernels.cu's spin)
    assert [u.name for u in units_for([vendor_abi.GEMM.prefix])] == ["gemm_simt", "gemm_simt_pipelined",
                                                                       "gemm_simt_staged", "small_kernels"]
    assert len(units_for(None)) == len(units)
    with pytest.raises(VendorBuildError) as err:
        units_for([vendor_abi.CUDNN.prefix + "conv3d"])  # no such function
    assert "\n" not in str(err.value) and vendor_abi.CUDNN.prefix + "conv3d" in str(err.value)


def test_one_unit_builds_links_and_loads_alone(tmp_path, monkeypatch):
    """A cold cache: the library of the LayerNorm kernel compiles that unit only, and registers its function."""
    ok, why = _available()
    if not ok:
        pytest.skip(f"cannot build the vendor extension here: {why}")
    from tvm_nimble.codegen.compile_cache import records
    from tvm_nimble.codegen.vendor_build import build_vendor_library

    monkeypatch.setenv("TVM_NIMBLE_CACHE_DIR", str(tmp_path / "cache"))
    path = build_vendor_library("sm_90", kernels=[vendor_abi.NORM_LAYER_NORM])
    compiled = sorted(r.what for r in records(str(tmp_path / "cache")))
    assert compiled == ["nvcc vendor link of 1 units", "nvcc vendor unit layer_norm"]
    assert vendor.library_functions(ctypes.CDLL(path)) == (vendor_abi.NORM_LAYER_NORM,)
    assert set(vendor.load_vendor_library(path)) == {vendor_abi.NORM_LAYER_NORM}
    assert build_vendor_library("sm_90", kernels=[vendor_abi.NORM.prefix]) == path  # the same units: the cached library


def test_a_pending_library_compiles_in_the_background_and_wait_gives_it_loaded(tmp_path, monkeypatch):
    """A cold cache: PendingLibrary starts the units' compile and returns at once (the kernel choice compiles and
    times TVM's kernels meanwhile); wait() gives the built library, loaded, and says how long it waited. With its
    units compiled, a second one has nothing to run in the background and waits for nothing."""
    ok, why = _available()
    if not ok:
        pytest.skip(f"cannot build the vendor extension here: {why}")
    import tvm

    from tvm_nimble.codegen.compile_cache import records
    from tvm_nimble.compiler.stages import PendingLibrary

    cache = tmp_path / "cache"
    monkeypatch.setenv("TVM_NIMBLE_CACHE_DIR", str(cache))
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    start = time.perf_counter()
    pending = PendingLibrary(target, {vendor_abi.NORM_LAYER_NORM})
    assert pending.compiling and not records(str(cache))  # running: nvcc takes seconds, the constructor returned
    path = pending.wait()
    # how long wait() waited on the compile (the kernel choice reports it): some of the whole, never more
    assert 0.0 < pending.waited_s <= time.perf_counter() - start
    assert sorted(r.what for r in records(str(cache))) == ["nvcc vendor link of 1 units", "nvcc vendor unit layer_norm"]
    assert vendor_abi.NORM_LAYER_NORM in vendor.library_functions(ctypes.CDLL(path))
    again = PendingLibrary(target, {vendor_abi.NORM_LAYER_NORM})
    assert not again.compiling and again.wait() == path and again.waited_s == 0.0


def test_a_unit_that_needs_one_left_out_fails_the_link(tmp_path):
    """The link refuses an undefined symbol: a library missing a unit another calls is a build error, not a
    library that fails to load."""
    ok, why = _available()
    if not ok:
        pytest.skip(f"cannot build the vendor extension here: {why}")
    from tvm_nimble.codegen.vendor_build import Toolchain, VendorBuildError, VendorUnit, _run_nvcc

    src = tmp_path / "caller.cu"
    src.write_text("void DefinedElsewhere();\n__attribute__((constructor)) void Start() { DefinedElsewhere(); }\n")
    unit = VendorUnit(str(src), (), (), (), ("DefinedElsewhere",))
    tools = Toolchain.find("sm_90")
    manifest = tmp_path / "functions.cpp"
    manifest.write_text("")
    _run_nvcc(tools.compile_command(unit, str(tmp_path / "caller.o")), tools.arch)
    with pytest.raises(VendorBuildError, match="DefinedElsewhere"):
        _run_nvcc(tools.link_command([str(tmp_path / "caller.o")], str(manifest), str(tmp_path / "lib.so")), tools.arch)


def test_a_build_compiles_and_links_only_the_units_its_plan_calls():
    """A CUDA build with kernels='vendor' (compiled here; it runs on the GPU): its vendor extension registers the
    functions of the units the plan's vendor calls need and no other, so a convolution net's first build on a fresh
    machine waits on no attention, GEMV or cuDNN-graph unit."""
    ok, why = _available()
    if not ok:
        pytest.skip(f"cannot build the vendor extension here: {why}")
    import tvm_nimble
    from tvm_nimble import zoo
    from tvm_nimble.codegen.vendor_build import units_for

    module = tvm_nimble.build(zoo.get_model("inception", blocks=1), {"kind": "cuda", "arch": "sm_90"},
                              kernels="vendor", max_streams=1)
    calls = {l.kernel for l in module.plan.launches if l.kernel.startswith(vendor_abi.VENDOR_PREFIXES)}
    assert vendor_abi.CUDNN_CONV2D in calls  # the net's convolutions (its pools and classifier too)
    registered = set(vendor.library_functions(ctypes.CDLL(module.vendor_library)))
    assert calls <= registered == {f for u in units_for(calls) for f in u.registers}
    assert not registered & set(vendor_abi.ATTENTION.kernels + vendor_abi.GEMV.kernels + vendor_abi.CUDNN_GRAPH.kernels)
