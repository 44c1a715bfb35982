"""Runtime-side helpers shared by the executor and the race checker.

Only the TVM *runtime* is used here (no ``tvm.relax``), so artifacts load on machines that
have no TVM compiler.
"""
from __future__ import annotations

import numpy as np

from tvm_nimble.errors import NimbleError
from tvm_nimble.native_libs import load_tvm_cuda_runtime

from .tvm_compat import tensor_view, zero_offset


class DeviceError(NimbleError):
    """The requested device is missing or does not match the artifact."""


def _tvm():
    import tvm

    return tvm


def ensure_cuda_runtime() -> None:
    """Load TVM's CUDA runtime library (needed when only the runtime part of TVM is installed)."""
    try:
        load_tvm_cuda_runtime()
    except OSError as err:
        raise DeviceError(f"cannot load TVM's CUDA runtime ({err}): is an NVIDIA driver installed?") from None


def gpu_arch() -> str | None:
    """``sm_XY`` of this machine's first CUDA GPU, or None without one (or without a driver)."""
    try:
        ensure_cuda_runtime()
        dev = _tvm().cuda(0)
        if dev.exist and dev.compute_version:
            return "sm_" + dev.compute_version.replace(".", "")
    except Exception:
        pass
    return None


def device_for(target: dict, device=None):
    """The TVM device to run a plan built for ``target`` on, checking that it exists."""
    tvm = _tvm()
    kind = target.get("kind")
    if device is None:
        device = tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)
    elif isinstance(device, str):
        device = tvm.device(device)
    want = {"cuda": 2, "llvm": 1}.get(kind)
    if want is not None and int(device.dlpack_device_type()) != want:
        raise DeviceError(f"the artifact was built for {kind} but the device is {device}; "
                          f"rebuild for this device or pass device={'cuda' if kind == 'cuda' else 'cpu'}")
    if kind == "cuda":
        ensure_cuda_runtime()
        if not device.exist:
            raise DeviceError("this artifact needs an NVIDIA GPU, but none is visible "
                              "(check nvidia-smi / CUDA_VISIBLE_DEVICES), or rebuild it for llvm")
        arch = target.get("arch")
        have = device.compute_version
        if arch and have and arch.replace("sm_", "") != have.replace(".", ""):
            raise DeviceError(f"the artifact was built for {arch} but this GPU is sm_{have.replace('.', '')}; "
                              f"rebuild it with --arch sm_{have.replace('.', '')}")
    return device


def tensor_at(storage, shape, dtype: str, offset: int):
    """A typed view of ``storage`` starting ``offset`` bytes in, as TVM's kernels accept it.

    TVM's compiled kernels reject a tensor whose ``byte_offset`` is not 0, so a view that starts
    inside its storage (a slice of a concatenation built in place) gets its data pointer advanced
    instead. TVM does that only for offsets aligned to its allocation alignment (64 bytes) and would
    otherwise copy, which here would silently lose the kernel's writes: the plan guarantees the
    alignment (:data:`tvm_nimble.contract.plan.SLICE_ALIGN`)."""
    view = tensor_view(storage, shape, dtype, offset)
    if offset == 0:
        return view
    return zero_offset(view)


class Workspace:
    """The plan's storage blocks on the device, a typed view per tensor, constants loaded."""

    def __init__(self, plan, params: dict[str, np.ndarray], device):
        tvm = _tvm()
        self.plan = plan
        self.device = device
        try:
            self.storages = [tvm.runtime.empty((max(s.nbytes, 1),), "uint8", device) for s in plan.storages]
        except Exception as err:  # TVM raises a generic error on out-of-memory
            self.storages = []
            raise DeviceError(f"could not allocate the plan's {sum(s.nbytes for s in plan.storages) / 2**20:.1f} MiB "
                              f"on {device}: {str(err).splitlines()[0]}") from None
        self.tensors = self.views()
        self.zero(("input", "state"))  # state (a KV cache) starts as zeros
        for c in plan.constants:
            self.tensors[c].copyfrom(np.asarray(params[f"c{c}"], order="C"))  # keeps 0-d scalars 0-d

    def zero(self, kinds=("input",)) -> None:
        """Fill the storages of ``kinds`` with zeros. The executor zeroes the inputs right before its first
        (warm-up) run, which reads them before any set_input: an index input (a label, a Gather's ids) holding
        leftover memory reads out of bounds, and where plans share one allocation (a generator's steps) another
        plan's warm-up run has written over them."""
        for s in self.plan.storages:
            if s.kind in kinds:
                self.storages[s.id].copyfrom(np.zeros(max(s.nbytes, 1), "uint8"))

    def views(self, swap: dict[int, int] | None = None) -> list:
        """A typed view per tensor; ``swap`` (storage -> storage) places tensors in another storage
        (see :mod:`tvm_nimble.runtime.carry`)."""
        swap = swap or {}
        return [tensor_at(self.storages[swap.get(t.storage, t.storage)], t.shape, t.dtype, t.offset)
                for t in self.plan.tensors]

    def launch_args(self, tensors: list | None = None) -> list[list]:
        """Each launch's call arguments: its tensors (``tensors``, default this workspace's views),
        with its literal shapes at their positions."""
        import tvm_ffi

        tensors = self.tensors if tensors is None else tensors
        calls = []
        for l in self.plan.launches:
            args = [tensors[a] for a in l.args]
            for pos, values in sorted(l.literals):
                args.insert(pos, tvm_ffi.Shape(values))
            calls.append(args)
        return calls

    def release(self) -> None:
        self.tensors = []
        self.storages = []
