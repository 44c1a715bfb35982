"""CUDA kernels compiled in parts by parallel nvcc processes (codegen/cuda_split.py): the machine code is
one nvcc run's, and the library is the same bytes whatever the number of workers."""
import os
import shutil

import pytest
import tvm

import tvm_nimble
from tvm_nimble import zoo
from tvm_nimble.codegen import cuda_compile, cuda_split
from tvm_nimble.codegen.cuda_split import ptxas_options

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
SM90 = {"kind": "cuda", "arch": "sm_90"}


@pytest.fixture(scope="module")
def cuda_source():
    """The CUDA source of a small model's TVM kernels (about 0.5 MB: DLight's convolutions)."""
    built = tvm_nimble.build(zoo.random_dag(6, hw=8, channels=8), SM90, kernels="tvm", max_streams=None,
                             timing_cache=None)
    return built.kernels.imports[0].inspect_source("cuda")


def test_units_hold_every_kernel_once_in_order_and_do_not_depend_on_workers(cuda_source):
    units = cuda_split.split_units(cuda_source, unit_bytes=64 * 1024)
    assert units is not None and len(units) >= 3
    kernel = cuda_split._KERNEL
    defined = [l for l in cuda_source.split("\n") if l.startswith(kernel) and l.endswith("{")]
    assert [l for u in units for l in u.split("\n") if l.startswith(kernel)] == defined
    assert cuda_split.split_units(cuda_source + "\n__device__ int shared_counter;\n", unit_bytes=64 * 1024) is None


def _nvcc(code: str, fmt: str) -> bytes:
    """One nvcc run over ``code``, as TVM compiles CUDA (within the target: TVM reads its arch there)."""
    from tvm.support import nvcc

    with tvm.target.Target(SM90):
        return bytes(nvcc.compile_cuda(code, target_format=fmt, arch="sm_90", compiler="nvcc"))


def test_parts_compile_to_one_nvcc_runs_machine_code(cuda_source):
    units = cuda_split.split_units(cuda_source, unit_bytes=64 * 1024)
    merged = cuda_split.merge_ptx(cuda_split.compile_ptx_units(units, lambda u: _nvcc(u, "ptx").decode(), 2))
    whole = _nvcc(cuda_source, "cubin")
    assert cuda_split.fatbin_from_ptx(merged, shutil.which("nvcc"), "sm_90", ptxas_options(), "cubin") == bytes(whole)


def test_parallel_compilation_gives_a_byte_identical_library(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_split, "UNIT_BYTES", 64 * 1024)  # this small model's source: several units
    model = zoo.random_dag(6, hw=8, channels=8)
    libraries = []
    for jobs in ("1", "3"):
        monkeypatch.setenv("TVM_NIMBLE_JOBS", jobs)
        monkeypatch.setenv("TVM_NIMBLE_CACHE_DIR", str(tmp_path / f"cache{jobs}"))  # compile, not read back
        built = tvm_nimble.build(model, SM90, kernels="tvm", max_streams=None, timing_cache=None)
        built.export(str(tmp_path / f"jobs{jobs}.nimble"))
        fatbins = sorted(f for f in os.listdir(tmp_path / f"cache{jobs}" / "fatbin") if f.endswith(".fatbin"))  # (not the compile records beside them)
        libraries.append((fatbins, [open(tmp_path / f"cache{jobs}" / "fatbin" / f, "rb").read() for f in fatbins],
                          open(tmp_path / f"jobs{jobs}.nimble" / "kernels.so", "rb").read()))
    assert libraries[0] == libraries[1] and libraries[0][0]


def test_a_bad_job_count_is_one_line(monkeypatch):
    monkeypatch.setenv("TVM_NIMBLE_JOBS", "many")
    with pytest.raises(tvm_nimble.NimbleError, match="TVM_NIMBLE_JOBS"):
        cuda_split.jobs()
