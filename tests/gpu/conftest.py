"""GPU tests: marked ``gpu``, skipped (with the reason) where no NVIDIA GPU is visible.

Run them on a GPU machine with ``pytest -m gpu tests/gpu``; CI (CPU) collects and skips them.
"""
import os
import shutil

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (and, to build, the TVM compiler and nvcc)")


def visible_gpu_arch():
    """(``sm_XY`` of GPU 0, None) or (None, why there is none to use)."""
    try:
        import tvm

        from tvm_nimble.runtime.device import ensure_cuda_runtime

        ensure_cuda_runtime()
        dev = tvm.cuda(0)
        if not dev.exist:
            return None, "no NVIDIA GPU is visible (nvidia-smi / CUDA_VISIBLE_DEVICES)"
        return f"sm_{dev.compute_version.replace('.', '')}", None
    except Exception as err:  # no driver, no TVM CUDA runtime
        return None, f"no usable NVIDIA GPU: {str(err).splitlines()[0]}"


@pytest.fixture(scope="session")
def gpu_arch():
    arch, why = visible_gpu_arch()
    if arch is None:
        pytest.skip(why)
    try:
        from tvm import relax  # noqa: F401

        relax.transform.LegalizeOps  # noqa: B018
    except Exception:
        pytest.skip("building needs the TVM compiler (tvm.relax), which is not installed here")
    if not shutil.which("nvcc") and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("building CUDA artifacts needs nvcc (CUDA toolkit), which is not installed here")
    return arch
