"""What a timing taken on this machine's GPU depends on, besides the code that was timed: the GPU, its
driver, and the CUDA / cuDNN / cuBLAS libraries the runtime loads. The compiler's timing cache
(``compiler/timing_cache.py``) keys its entries by it, and an RPC server reports its own
(``nimble.rpc.gpu_fingerprint``), so a build measured through a tracker is keyed by the remote GPU.
Runtime only, and never an error: without a GPU (or a driver) the fingerprint is empty.
"""
from __future__ import annotations

import functools
import importlib.metadata
import re

#: the wheels whose libraries the runtime loader preloads (runtime/vendor.py): their versions decide
#: which cuDNN / cuBLASLt kernels a call gets
LIBRARY_WHEELS = ("nvidia-cudnn-cu13", "nvidia-cublas", "nvidia-cuda-runtime")


@functools.lru_cache(maxsize=None)
def gpu_fingerprint(device_id: int = 0) -> tuple[tuple[str, object], ...]:
    """(field, value) pairs naming GPU ``device_id`` of this machine and its software: name, arch, SM
    count, memory, clock, the kernel driver and the CUDA driver API, and the library wheels' versions.
    Empty without a GPU. A tuple, so that the cached value cannot be changed by a caller."""
    try:
        from .device import ensure_cuda_runtime

        import tvm

        ensure_cuda_runtime()
        dev = tvm.cuda(device_id)
        if not (dev.exist and dev.compute_version):
            return ()
        fields = {"name": str(dev.device_name), "arch": "sm_" + dev.compute_version.replace(".", ""),
                  "sms": int(dev.multi_processor_count), "memory_bytes": int(dev.total_global_memory),
                  "clock_khz": int(dev.max_clock_rate), "cuda_driver_api": str(dev.driver_version),
                  "driver": kernel_driver_version()}
    except Exception:  # no driver, no CUDA runtime: no GPU to name
        return ()
    fields.update(library_versions())
    return tuple(sorted(fields.items()))


def kernel_driver_version() -> str | None:
    """The NVIDIA kernel driver's version (e.g. 580.65.06) from /proc, or None where it cannot be read."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            match = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", f.read())
    except OSError:
        return None
    return match.group(1) if match else None


def library_versions() -> dict[str, str | None]:
    """Version of each of :data:`LIBRARY_WHEELS` installed here (None: not installed)."""
    out = {}
    for wheel in LIBRARY_WHEELS:
        try:
            out[wheel] = importlib.metadata.version(wheel)
        except importlib.metadata.PackageNotFoundError:
            out[wheel] = None
    return out
