"""NimbleModule: what ``tvm_nimble.build`` returns and what an artifact loads back into."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from tvm_nimble.contract.plan import Plan
from tvm_nimble.contract.vendor_abi import VENDOR_PREFIXES
from tvm_nimble.errors import NimbleError

from .artifact import (VENDOR_FILE, ArtifactError, load_artifact_files, load_bucketed_files, read_manifest,
                       save_artifact, save_bucketed_artifact)
from .buckets import BucketSpace, arena_layout, check_buckets, dedupe_weights, padding_bytes


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
    manifest = read_manifest(path)
    if isinstance(manifest.get("generator"), dict):
        raise ArtifactError(f"{path} is a generator (tvm_nimble.build_generator): open it with "
                            "tvm_nimble.Generator(path), or load it with tvm_nimble.load(path)")
    if manifest.get("buckets") is not None:  # built with buckets or batch_sizes: a plan per bucket
        return load_bucketed(path)
    manifest, plan, kernels_path, params = load_artifact_files(path)
    vendor = load_runtime_libraries(path, manifest)
    return NimbleModule(plan, load_kernels(plan, kernels_path), params, None, dict(manifest.get("info", {})), vendor)


def load_runtime_libraries(path: str, manifest: dict) -> str | None:
    """What an artifact's kernels need loaded first: the CUDA runtime (a CUDA target) and the packaged vendor
    extension; the extension's path, or None when the artifact has none."""
    if manifest.get("target", {}).get("kind") == "cuda":
        from .device import ensure_cuda_runtime

        ensure_cuda_runtime()
    if VENDOR_FILE not in manifest.get("sha256", {}):
        return None
    from .vendor import load_vendor_library  # one line naming cuDNN/cuBLAS and the wheel when missing

    vendor = os.path.join(path, VENDOR_FILE)
    load_vendor_library(vendor)
    return vendor


def load_kernels(plan: Plan, kernels_path: str):
    """The plan's kernel library, loaded; a plan naming a kernel the library lacks fails here, not at the first run."""
    import tvm

    kernels = tvm.runtime.load_module(kernels_path)
    resolve_kernels(plan, kernels)
    return kernels


# ---- buckets (see runtime/buckets.py) ---------------------------------------------------------------
@dataclass
class BucketedModule(NimbleModule):
    """A model built for several sizes of its bucketed dimensions: ``buckets`` maps each bucket (a key: one size
    per dimension of ``space``, a :class:`~tvm_nimble.runtime.buckets.BucketSpace`) to its :class:`NimbleModule`
    (plan, kernels, constants). ``plan``, ``kernels`` and ``params`` are the largest bucket's (what code that
    knows one plan sees); ``weight_names`` / ``weights`` are the constants stored once (:func:`dedupe_weights`;
    computed on first use for a module built in this process)."""

    buckets: dict = field(default_factory=dict)
    space: BucketSpace | None = None
    weight_names: dict | None = field(default=None, repr=False)
    weights: dict | None = field(default=None, repr=False)

    @classmethod
    def of(cls, buckets: dict, space: BucketSpace | None = None, info: dict | None = None,
           **known) -> "BucketedModule":
        """The module of ``buckets`` (key -> module) over ``space``; without one, the keys are batch sizes
        (``batch_sizes``: the leading dimension of every input and output)."""
        if space is None:
            if not buckets or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in buckets):
                raise NimbleError(f"batch buckets must be positive batch sizes, got {sorted(buckets, key=str)}")
            plan = next(iter(buckets.values())).plan
            space = BucketSpace.batch(buckets, len(plan.inputs), len(plan.outputs))
        buckets = dict(sorted((space.key(k), m) for k, m in buckets.items()))
        check_buckets(space, buckets)
        top = buckets[max(buckets)]
        vendor = next((m.vendor_library for m in buckets.values() if m.vendor_library), None)
        if info is None:
            info = {"buckets": {space.label(k): m.info for k, m in buckets.items()}}
            info.update({"batch_sizes": [k[0] for k in buckets]} if space.rows else {"bucket_dims": space.describe()})
        return cls(top.plan, top.kernels, top.params, None, info, vendor, buckets=buckets, space=space, **known)

    @property
    def batch_sizes(self) -> list[int] | None:
        """The batch sizes of a model built with ``batch_sizes`` (rows, split over the largest); else None."""
        return [k[0] for k in self.buckets] if self.space.rows else None

    @property
    def max_batch(self) -> int | None:
        return max(self.batch_sizes) if self.space.rows else None

    def bucket(self, key) -> NimbleModule:
        """The module of bucket ``key`` (one size per dimension; an int for a one-dimension space)."""
        return self.buckets[self.space.key(key)]

    def shared_weights(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(per bucket: ``c<id>`` -> weight name, weight name -> array), each distinct constant once."""
        if self.weight_names is None or self.weights is None:
            self.weight_names, self.weights = dedupe_weights(self.buckets)
        return self.weight_names, self.weights

    def pool_bytes(self) -> int:
        """Bytes of the allocation the buckets share (inputs, outputs and memory pool of the largest need)."""
        return max(arena_layout(m.plan)[1] for m in self.buckets.values())

    def device_bytes(self) -> int:
        """Device bytes one executor allocates: the weights once, the shared allocation and the zeros padding
        is copied from."""
        _, weights = self.shared_weights()
        return (sum(max(np.asarray(w).nbytes, 1) for w in weights.values()) + self.pool_bytes()
                + padding_bytes(self.space, {k: m.plan for k, m in self.buckets.items()}))

    def export(self, path: str, overwrite: bool = False) -> str:
        """Write one artifact directory: a plan and kernel library per bucket, the weights once."""
        names, weights = self.shared_weights()
        return save_bucketed_artifact(path, [(k, m.plan, m.kernels, names[k]) for k, m in self.buckets.items()],
                                      weights, None if self.space.rows else self.space.to_json(),
                                      extra={"info": self.info}, vendor_library=self.vendor_library,
                                      overwrite=overwrite)

    export_library = export


def from_fixed(module: NimbleModule) -> BucketedModule:
    """A one-bucket module of a model built for one batch size (its inputs' and outputs' shared leading
    dimension), so that it serves any smaller batch padded and any larger one split (a fixed-batch
    baseline for the batcher)."""
    plan = module.plan
    leads = {plan.tensors[t].shape[0] if plan.tensors[t].shape else None for t in plan.inputs + plan.outputs}
    if len(leads) != 1 or None in leads:
        raise NimbleError("this model's inputs and outputs do not share a leading batch dimension, so it cannot "
                          "serve other batch sizes; build it with batch_sizes=[...] from an ONNX model whose batch is "
                          "the leading dimension of every input")
    return BucketedModule.of({leads.pop(): module}, info=dict(module.info))


def load_plans(specs: list, weights: dict, vendor: str | None, info_of=lambda key: {}) -> tuple[dict, dict]:
    """(key -> :class:`NimbleModule`, key -> its constants' weight names) of ``specs`` (``load_bucketed_files`` 's
    (key, plan, kernels path, constant names) entries): each plan with its kernels loaded and its constants taken
    from ``weights``; ``info_of(key)``: the module's info."""
    modules, names = {}, {}
    for key, plan, kernels_path, constants in specs:
        params = {c: weights[w] for c, w in constants.items()}
        modules[key] = NimbleModule(plan, load_kernels(plan, kernels_path), params, None, dict(info_of(key)), vendor)
        names[key] = constants
    return modules, names


def load_bucketed(path: str) -> BucketedModule:
    """Load a bucketed artifact with the TVM runtime only."""
    manifest, space, specs, weights = load_bucketed_files(path)
    vendor = load_runtime_libraries(path, manifest)
    info = dict(manifest.get("info", {}))
    per_bucket = info.get("buckets", {}) if isinstance(info.get("buckets"), dict) else {}
    buckets, names = load_plans(specs, weights, vendor, lambda key: per_bucket.get(space.label(key), {}))
    try:
        return BucketedModule.of(buckets, space, info=info, weight_names=names, weights=weights)
    except NimbleError as err:
        raise ArtifactError(f"{path}: {err}") from None
