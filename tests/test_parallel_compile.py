"""CUDA kernels compiled in parts by parallel nvcc processes (codegen/cuda_split.py): the machine code is
one nvcc run's, kernel for kernel (each kernel's code and resource sections of the cubin, read from its ELF), and the
library is the same bytes whatever the number of workers."""
import os
import shutil
import struct

import pytest
import tvm

import tvm_nimble
from tvm_nimble import env, zoo
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


def _merged_equals_one_nvcc_run(source: str, unit_bytes: int) -> list[str]:
    """The units' PTX (asserted: they merge, into one nvcc run's machine code)."""
    units = cuda_split.split_units(source, unit_bytes=unit_bytes)
    assert units is not None and len(units) >= 2
    parts = cuda_split.compile_ptx_units(units, lambda u: _nvcc(u, "ptx").decode(), 2)
    merged = cuda_split.merge_ptx(parts)
    assert merged is not None, "the units' PTX did not merge: the build compiles the source in one nvcc run"
    whole = _machine_code(_nvcc(source, "cubin"))
    assert _machine_code(cuda_split.fatbin_from_ptx(merged, shutil.which("nvcc"), "sm_90", ptxas_options(),
                                                    "cubin")) == whole
    defined = [l for l in source.split("\n") if l.startswith(cuda_split._KERNEL) and l.endswith("{")]
    assert sum(name.startswith(".text.") for name in whole) == len(defined)  # every kernel's code compared
    return parts


#: the sections of a cubin that hold no kernel's code or resources: the symbol table (its order is ptxas's thread
#: order under --split-compile) and ptxas's note of its own options
_NOT_CODE = (".symtab", ".strtab", ".note.nv.tkinfo")


def _machine_code(cubin: bytes) -> dict[str, bytes]:
    """Every section of the ELF ``cubin`` by name (each kernel's ``.text.NAME``, ``.nv.info.NAME``, shared and
    constant memory, ...), but :data:`_NOT_CODE`; a section without file contents (NOBITS) by its size."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    entsize, count, names_at = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]
    strings = headers[names_at][4]

    def name(offset: int) -> str:
        return cubin[strings + offset:cubin.index(b"\0", strings + offset)].decode()

    sections = {name(h[0]): (cubin[h[4]:h[4] + h[5]] if h[1] != 8 else bytes(str(h[5]), "ascii")) for h in headers}
    return {k: v for k, v in sections.items() if k not in _NOT_CODE}


def test_parts_compile_to_one_nvcc_runs_machine_code(cuda_source):
    _merged_equals_one_nvcc_run(cuda_source, 64 * 1024)


def test_half_precision_kernels_merge_too():
    """fp16 kernels bring what fp32's do not: inline asm scopes inside an entry (cuda_fp16's conversions, warp
    shuffles) that close with a ``}`` at the start of a line, and the dynamic shared memory's ``.extern .shared``
    array declared by several units (DLight's tensor-core matmuls). Both once made the merge give up, so every
    fp16 build's TVM kernels compiled in one nvcc run."""
    built = tvm_nimble.build(zoo.bert(dim=256, seq=128), SM90, kernels="tvm", max_streams=None, timing_cache=None,
                             precision="fp16")
    parts = _merged_equals_one_nvcc_run(built.kernels.imports[0].inspect_source("cuda"), 64 * 1024)
    assert sum(p.count(".extern .shared ") for p in parts) >= 2  # declared by more than one unit: merged once
    assert any(line == "}" for p in parts for entry in cuda_split._parse_ptx(p)[2] for line in entry[1].split("\n")[:-1])


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
        env.jobs()
