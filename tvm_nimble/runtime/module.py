"""NimbleModule: what ``tvm_nimble.build`` returns and what an artifact loads back into."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .artifact import VENDOR_FILE, ArtifactError, load_artifact_files, save_artifact
from .plan import VENDOR_PREFIXES, Plan


class KernelNotFoundError(ArtifactError):
    """The plan launches a kernel that the kernel library does not hold."""


@dataclass
class NimbleModule:
    plan: Plan
    kernels: object  # tvm.runtime.Module
    params: dict[str, np.ndarray]
    annotated_mod: object | None = None  # the stage-1 IRModule, when built in this process
    info: dict = field(default_factory=dict)
    vendor_library: str | None = None  # the cuDNN/cuBLASLt extension, when the plan launches vendor kernels

    @property
    def target(self) -> dict:
        return self.plan.target

    def export(self, path: str, overwrite: bool = False) -> str:
        """Write the deployable artifact directory ``path`` (see ``runtime.artifact``). An artifact already
        there is replaced only with ``overwrite=True``; a path that cannot hold one raises ``ArtifactError``."""
        return save_artifact(path, self.plan, self.kernels, self.params, extra={"info": self.info},
                             vendor_library=self.vendor_library, overwrite=overwrite)

    export_library = export  # the TVM spelling


def lookup_kernel(kernels, name: str):
    """The function that runs kernel ``name`` of a plan, or None when there is none.

    Every kernel name of a plan resolves here, and only here: a name is a function of the kernel
    library (``kernels``, a ``tvm.runtime.Module``, or any mapping in tests), or, for a vendor kernel
    (``nimble.cudnn.*`` / ``nimble.cublas.*``), a global function of the loaded vendor extension.
    """
    if name.startswith(VENDOR_PREFIXES):
        import tvm_ffi

        return tvm_ffi.get_global_func(name, allow_missing=True)
    try:
        if hasattr(kernels, "implements_function"):
            return kernels.get_function(name) if kernels.implements_function(name) else None
        return kernels[name]
    except (KeyError, AttributeError):
        return None


def resolve_kernels(plan: Plan, kernels) -> list:
    """The function of every launch of ``plan``, in launch order; one line naming a missing kernel."""
    found: dict[str, object] = {}
    funcs = []
    for launch in plan.launches:
        if launch.kernel not in found:
            func = lookup_kernel(kernels, launch.kernel)
            if func is None:
                raise KernelNotFoundError(
                    f"launch {launch.idx} of the plan calls kernel {launch.kernel!r}, which the kernel library does "
                    "not have: the artifact is inconsistent (plan and kernels from different builds); rebuild it")
            found[launch.kernel] = func
        funcs.append(found[launch.kernel])
    return funcs


def load(path: str) -> NimbleModule:
    """Load an artifact with the TVM runtime only (no compiler needed)."""
    import tvm

    manifest, plan, kernels_path, params = load_artifact_files(path)
    if plan.target.get("kind") == "cuda":
        from .device import ensure_cuda_runtime

        ensure_cuda_runtime()
    kernels = tvm.runtime.load_module(kernels_path)
    vendor = os.path.join(path, VENDOR_FILE)
    if VENDOR_FILE in manifest.get("sha256", {}):
        from .vendor import load_vendor_library  # one line naming cuDNN/cuBLAS and the wheel when missing

        load_vendor_library(vendor)
    resolve_kernels(plan, kernels)  # a plan naming a kernel the library lacks fails here, not at the first run
    return NimbleModule(plan, kernels, params, None, dict(manifest.get("info", {})),
                        vendor if VENDOR_FILE in manifest.get("sha256", {}) else None)
