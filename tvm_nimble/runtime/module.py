"""NimbleModule: what ``tvm_nimble.build`` returns and what an artifact loads back into."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .artifact import load_artifact_files, save_artifact
from .plan import Plan


@dataclass
class NimbleModule:
    plan: Plan
    kernels: object  # tvm.runtime.Module
    params: dict[str, np.ndarray]
    annotated_mod: object | None = None  # the stage-1 IRModule, when built in this process
    info: dict = field(default_factory=dict)

    @property
    def target(self) -> dict:
        return self.plan.target

    def export(self, path: str) -> str:
        """Write the deployable artifact directory (see ``codegen.artifact``)."""
        return save_artifact(path, self.plan, self.kernels, self.params, extra={"info": self.info})

    export_library = export  # the TVM spelling


def load(path: str) -> NimbleModule:
    """Load an artifact with the TVM runtime only (no compiler needed)."""
    import tvm

    manifest, plan, kernels_path, params = load_artifact_files(path)
    if plan.target.get("kind") == "cuda":
        from .device import ensure_cuda_runtime

        ensure_cuda_runtime()
    kernels = tvm.runtime.load_module(kernels_path)
    return NimbleModule(plan, kernels, params, None, dict(manifest.get("info", {})))
