"""Every environment variable tvm-nimble reads, and the one cache root; nothing else reads ``os.environ``.

Each is read when asked (not at import), so a process, or a test, that sets one sees it at once.

=================================  =====================================================================
``TVM_NIMBLE_CACHE_DIR``           the cache root (default ``$XDG_CACHE_HOME/tvm-nimble``, else
                                   ``~/.cache/tvm-nimble``): timings, compiled kernels, the vendor extension
``XDG_CACHE_HOME``                 where the cache root goes without ``TVM_NIMBLE_CACHE_DIR``
``TVM_NIMBLE_JOBS``                compiler processes at once (nvcc), default this machine's cores
``TVM_NIMBLE_LLVM_OPT_LEVEL``      LLVM's optimization level (0-3) for CPU (``llvm``) builds whose target names
                                   none (default LLVM's 3); 0 compiles CPU kernels about twice as fast into
                                   slower code (the test suite's setting: it checks results, not CPU speed)
``TVM_NIMBLE_VENDOR_OPT_LEVEL``    the vendor extension's optimization level (0-3, default 3) for nvcc (host and device
                                   code); 0 compiles its units about three times as fast into far slower kernels (the
                                   test suite's setting on a machine without a GPU, where its kernels never run)
``NIMBLE_VENDOR_LIB_DIRS``         directories (``os.pathsep``-separated) that replace the wheels' cuDNN /
                                   cuBLAS library directories when the vendor extension is loaded
``NIMBLE_VENDOR_SYSTEM_LIBS``      ``0``: do not ask the system loader for cuDNN / cuBLAS
``NIMBLE_STOCK_REDUCTION_SCHEDULES``  ``1``: TVM's own reduction schedules instead of ours (an experiment;
                                   measured apart in the timing cache)
``NIMBLE_STOCK_ELEMENTWISE_SCHEDULES``  ``1``: DLight's ``Fallback`` for large element-wise kernels instead of our
                                   vectorized schedule (an experiment; measured apart in the timing cache)
``NIMBLE_ROW_THREADS``             T (32, 64, ..., 1024): a block of T threads a row (a warp a row, two rows a block,
                                   for 32) for normalizations of 256+ rows instead of DLight's block per row (an
                                   experiment; measured apart in the timing cache)
``NIMBLE_SCHEDULE_POOL``           ``0``: DLight's default schedules computed in the build's own process, one kernel
                                   after another, not in worker processes (``relay_passes.schedule_pool``); the A/B
                                   switch of the build-time measurements
``NIMBLE_PDL``                     ``0``: no programmatic dependent launch on sm_90+ (neither our vendor kernels' launch
                                   attribute nor the CUDA graph's programmatic edges into TVM's kernels); the A/B
                                   switch of the decode benchmarks
``CUDNN_FRONTEND_INCLUDE``         a directory holding ``cudnn_frontend.h``, looked in first
``CUDA_HOME`` / ``CUDA_PATH``      where nvcc is looked for after ``$PATH``
=================================  =====================================================================
"""
from __future__ import annotations

import os

from tvm_nimble.errors import NimbleError

CACHE_DIR = "TVM_NIMBLE_CACHE_DIR"
JOBS = "TVM_NIMBLE_JOBS"
LLVM_OPT_LEVEL = "TVM_NIMBLE_LLVM_OPT_LEVEL"
VENDOR_OPT_LEVEL = "TVM_NIMBLE_VENDOR_OPT_LEVEL"
VENDOR_LIB_DIRS = "NIMBLE_VENDOR_LIB_DIRS"
VENDOR_SYSTEM_LIBS = "NIMBLE_VENDOR_SYSTEM_LIBS"
STOCK_REDUCTIONS = "NIMBLE_STOCK_REDUCTION_SCHEDULES"
STOCK_ELEMENTWISE = "NIMBLE_STOCK_ELEMENTWISE_SCHEDULES"
ROW_THREADS = "NIMBLE_ROW_THREADS"
PDL = "NIMBLE_PDL"
SCHEDULE_POOL = "NIMBLE_SCHEDULE_POOL"
CUDNN_FRONTEND_INCLUDE = "CUDNN_FRONTEND_INCLUDE"


def get(name: str, default: str | None = None) -> str | None:
    """The variable ``name`` (one of this module's), or ``default``."""
    return os.environ.get(name, default)


def cache_root() -> str:
    """The one directory every tvm-nimble cache lives under (see the table above)."""
    explicit = os.environ.get(CACHE_DIR)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "tvm-nimble")


def cache_dir(*parts: str) -> str:
    """A folder under :func:`cache_root` (not created)."""
    return os.path.join(cache_root(), *parts)


def _opt_level(name: str, give: str, unset: str) -> int | None:
    """The variable ``name`` as an optimization level 0-3, None when unset; one line naming it when it is none."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if value not in ("0", "1", "2", "3"):
        raise NimbleError(f"{name}={value!r}: give {give} 0, 1, 2 or 3 (or unset it for {unset})")
    return int(value)


def llvm_opt_level() -> int | None:
    """``TVM_NIMBLE_LLVM_OPT_LEVEL`` as an int, None when unset; one line when it is not 0-3."""
    return _opt_level(LLVM_OPT_LEVEL, "an LLVM optimization level", "LLVM's default, 3")


def vendor_opt_level() -> int:
    """``TVM_NIMBLE_VENDOR_OPT_LEVEL`` as an int (3 when unset); one line when it is not 0-3."""
    level = _opt_level(VENDOR_OPT_LEVEL, "an optimization level", "3, the vendor extension's nvcc default")
    return 3 if level is None else level


def jobs() -> int:
    """How many compiler processes a build runs at once: ``TVM_NIMBLE_JOBS``, else this machine's cores; one line
    when it is not a whole number >= 1."""
    value = (os.environ.get(JOBS) or "").strip()
    if not value:
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise NimbleError(f"{JOBS} must be a whole number of processes >= 1, got {value!r}")
    return n


def stock_schedules() -> tuple[str, ...]:
    """The GPU schedules' experiment switches: which of our schedules an experiment swaps for DLight's own
    (``"reductions"`` and/or ``"elementwise"``, each where its switch is set), then ``"rows=T"`` where
    ``NIMBLE_ROW_THREADS`` is T (empty when none is set); one line when T is not a power of two from 32 to 1024."""
    names = tuple(name for name, switch in (("reductions", STOCK_REDUCTIONS), ("elementwise", STOCK_ELEMENTWISE))
                  if os.environ.get(switch))
    value = (os.environ.get(ROW_THREADS) or "").strip()
    if not value:
        return names
    if value not in tuple(str(1 << k) for k in range(5, 11)):
        raise NimbleError(f"{ROW_THREADS}={value!r}: give threads a row as 32, 64, 128, 256, 512 or 1024 "
                          "(or unset it for DLight's block per row)")
    return names + (f"rows={value}",)


def dependent_launch() -> bool:
    """Whether programmatic dependent launch is wanted (``NIMBLE_PDL`` is not ``0``; the vendor extension reads the
    same variable)."""
    return os.environ.get(PDL, "1") != "0"


def schedule_pool() -> bool:
    """Whether DLight's schedules may be computed in worker processes (``NIMBLE_SCHEDULE_POOL`` is not ``0``)."""
    return os.environ.get(SCHEDULE_POOL, "1") != "0"


def cuda_homes() -> list[str]:
    """``$CUDA_HOME``, ``$CUDA_PATH`` and ``/usr/local/cuda``, those set."""
    return [h for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda") if h]


def python_path() -> list[str]:
    """The entries of ``$PYTHONPATH`` (where the GPU machine's staged wheels are)."""
    return [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]


def quiet_torch_interop(force: bool = False) -> None:
    """Set the two variables that keep tvm-ffi from loading PyTorch's DLPack bridge and PyTorch from starting CUDA
    to count devices (in a process that forks RPC workers or compiles with TVM next to PyTorch); ``force``
    overrides values already set."""
    for name in ("TVM_FFI_DISABLE_TORCH_C_DLPACK", "PYTORCH_NVML_BASED_CUDA_CHECK"):
        if force:
            os.environ[name] = "1"
        else:
            os.environ.setdefault(name, "1")
