"""The build session's one cache key (compiler/session.py): what it must tell apart.

- A compiled-kernel entry is for its target's arch: an sm_80 build after an sm_90 build of the same model, in the
  same cache directory, compiles its own kernels instead of loading the sm_90 ones.
- A measurement is for the GPU that made it: two builds in one process sharing one in-memory cache, measuring on
  GPUs with different fingerprints, each measure on their own.

CUDA plans are built here without a GPU (nvcc compiles the kernels; nothing runs them); the measurements come from
tests/test_timing_cache.py's PlanCostTimer (the build's timer interface, times derived from the plans).
"""
import shutil

import pytest

from tvm_nimble import zoo
from tvm_nimble.compiler.build import build_with
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.compiler.session import BuildSession, CacheMemory

from test_timing_cache import GPU_A, PlanCostTimer


def _need_nvcc():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is needed to compile CUDA kernels")


@pytest.fixture(scope="module")
def small():
    return zoo.get_model("inception", blocks=1, hw=8)


def test_an_sm80_build_does_not_load_the_kernels_of_an_sm90_build(small, tmp_path):
    _need_nvcc()
    directory = str(tmp_path / "cache")

    def cuda(arch):
        options = BuildOptions.create({"kind": "cuda", "arch": arch}, kernels="tvm", max_streams=None,
                                      timing_cache=directory)
        return build_with(small, options)

    sm90 = cuda("sm_90")
    assert sm90.report.kernel_cache == "stored"
    sm80 = cuda("sm_80")
    assert sm80.report.kernel_cache == "stored"  # compiled for its own arch, not loaded
    assert cuda("sm_90").report.kernel_cache == "hit"  # (the cache does serve the arch it was built for)


def test_two_gpus_sharing_one_in_memory_cache_each_measure(small):
    """One process, one CacheMemory passed on, two GPUs: what the first measured is not the second's."""
    _need_nvcc()
    options = BuildOptions.create({"kind": "cuda", "arch": "sm_90"}, kernels="tvm", timing_cache="off")
    memory = CacheMemory()
    first = PlanCostTimer()
    build_with(small, options, timer=first, cache=memory)
    assert first.total > 0  # the stream choice measured
    other_gpu = PlanCostTimer({**GPU_A, "name": "Another GPU"})
    build_with(small, options, timer=other_gpu, cache=memory)
    assert other_gpu.calls == first.calls


def test_a_key_names_what_its_kind_depends_on():
    """The one key function: a measurement's key changes with the options its kind depends on, the GPU and the
    target, and not with options it does not depend on."""
    options = BuildOptions.create({"kind": "cuda", "arch": "sm_90"}, timing_cache="off")
    a = BuildSession(options, PlanCostTimer())
    digest = lambda session, kind, **what: session.key(kind, **what).digest  # noqa: E731
    base = digest(a, "chain", signature="s")
    assert base == digest(BuildSession(options, PlanCostTimer()), "chain", signature="s")
    assert base != digest(a.with_options(options.replace(precision="fp16")), "chain", signature="s")
    assert base != digest(BuildSession(options, PlanCostTimer({**GPU_A, "driver": "2.0"})), "chain", signature="s")
    assert base != digest(BuildSession(options.replace(target={"kind": "cuda", "arch": "sm_80"}), PlanCostTimer()),
                          "chain", signature="s")
    assert base == digest(a.with_options(options.replace(reuse="none", max_streams=1)), "chain", signature="s")
    kernels = digest(a, "kernels", module="m")
    assert kernels == digest(BuildSession(options, PlanCostTimer({**GPU_A, "name": "Another GPU"})), "kernels",
                             module="m")  # compiled kernels serve every GPU of the arch
    assert kernels != digest(a.with_options(options.replace(concat_in_place=False)), "kernels", module="m")
