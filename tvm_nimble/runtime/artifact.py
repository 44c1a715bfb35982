"""The deployable artifact: a directory holding the kernels, the plan and the weights.

    model.nimble/
      manifest.json   format, version, target, arch, TVM version, sha256 of every file
      plan.json       the launch + memory plan (codegen.plan.Plan)
      kernels.so      TVM runtime module (CUDA: host code + fatbin for the target arch)
      params.npz      constants, by name ``c<tensor id>`` (numpy, loaded without pickle)

Loading needs only the TVM *runtime* (no compiler, no nvcc). Every file is checksummed and
every field validated, so a corrupted artifact fails with a clear error, not in a kernel.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
import warnings

import numpy as np

from tvm_nimble.contract.plan import Plan
from tvm_nimble.errors import ArtifactError  # noqa: F401  (public here too: runtime.artifact.ArtifactError)

ARTIFACT_FORMAT = "tvm-nimble-artifact"
ARTIFACT_VERSION = 1
#: an artifact with one plan per batch size (``build(..., batch_sizes=...)``): plan.b<N>.json and kernels.b<N>.so
#: per bucket, one params.npz of weights shared by every bucket (see :func:`save_bucketed_artifact`)
BUCKETED_VERSION = 2
#: an artifact with one plan per bucket of named dimensions (``build(..., buckets=...)``): as version 2, with the
#: dimensions and where the inputs and outputs carry them (``bucket_space``), each bucket's sizes and files
#: plan.b<S1>x<S2>.json, kernels.b<S1>x<S2>.so
SPACE_VERSION = 3
VERSIONS = (ARTIFACT_VERSION, BUCKETED_VERSION, SPACE_VERSION)
FILES = ("plan.json", "kernels.so", "params.npz")


class TVMVersionWarning(UserWarning):
    """The artifact was built with another TVM version than the one loading it."""


def file_sha256(path: str) -> str:
    """The file's sha256, hex (read a MiB at a time)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: the vendor-kernel extension (cuDNN / cuBLASLt), present when the plan launches vendor kernels
VENDOR_FILE = "vendor.so"


def _nearest_existing(path: str) -> str:
    """``path`` or its closest ancestor that exists (where a new directory would be created)."""
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def check_output_path(path: str, overwrite: bool = False, replace_hint: str = "pass overwrite=True") -> None:
    """Raise :class:`ArtifactError` (one line: the path and what to do) unless an artifact can be written at
    ``path``: not a file, not a directory of other things, not an artifact unless ``overwrite``, and in a
    place this process can write. ``replace_hint`` says how the caller asks for an overwrite."""
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise ArtifactError(f"cannot write the artifact to {path}: it is a file (an artifact is a directory); "
                                "choose another output path")
        if not os.path.isfile(os.path.join(path, "manifest.json")):
            raise ArtifactError(f"{path} exists and is not a tvm-nimble artifact; choose another output path")
        if not overwrite:
            raise ArtifactError(f"{path} already holds an artifact; {replace_hint} to replace it, or choose another "
                                "output path")
        where = os.path.dirname(os.path.abspath(path))  # the old one is replaced beside it
    else:
        where = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(where):
        raise ArtifactError(f"cannot write the artifact to {path}: {where} is a file, not a directory; choose an "
                            "output path inside a directory")
    if not os.access(where, os.W_OK | os.X_OK):
        raise ArtifactError(f"cannot write the artifact to {path}: no write permission in {where}; choose an "
                            "output path you can write to")


def _unwritable(path: str, err: OSError) -> ArtifactError:
    return ArtifactError(f"cannot write the artifact to {path}: {err.strerror or type(err).__name__}; choose an "
                         "output path you can write to")


def save_artifact(path: str, plan: Plan, kernels, params: dict[str, np.ndarray], extra: dict | None = None,
                  vendor_library: str | None = None, overwrite: bool = False) -> str:
    """Write the artifact directory ``path``. An existing artifact there is replaced only with ``overwrite``
    (and only once the new one is complete); anything else in the way is refused (:func:`check_output_path`)."""
    return _write_staged(path, overwrite, lambda staging: _write_files(staging, plan, kernels, params, extra,
                                                                       vendor_library))


def _write_staged(path: str, overwrite: bool, write) -> str:
    """``write(directory)`` into a staging directory beside ``path``, then put it in place (replacing an
    artifact there only with ``overwrite``)."""
    check_output_path(path, overwrite)
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
        staging = os.path.join(parent, f".{os.path.basename(os.path.abspath(path))}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        os.mkdir(staging)  # beside the target, so the final rename stays on one file system
    except OSError as err:
        raise _unwritable(path, err) from None
    try:
        write(staging)
        if os.path.lexists(path):
            shutil.rmtree(path)
        os.rename(staging, path)
    except OSError as err:
        raise _unwritable(path, err) from None
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return path


def _write_files(path: str, plan: Plan, kernels, params: dict[str, np.ndarray], extra: dict | None,
                 vendor_library: str | None) -> None:
    import tvm

    with open(os.path.join(path, "plan.json"), "w") as f:
        f.write(plan.to_json())
    kernels.export_library(os.path.join(path, "kernels.so"))
    np.savez(os.path.join(path, "params.npz"), **params)
    files = list(FILES)
    if plan.uses_vendor_kernels:
        if not vendor_library:
            raise ArtifactError("the plan launches cuDNN/cuBLAS kernels but no vendor extension was given to "
                                "package; export the module returned by tvm_nimble.build")
        shutil.copyfile(vendor_library, os.path.join(path, VENDOR_FILE))
        files.append(VENDOR_FILE)
    manifest = {
        "format": ARTIFACT_FORMAT,
        "version": ARTIFACT_VERSION,
        "target": plan.target,
        "tvm_version": tvm.__version__,
        "sha256": {name: file_sha256(os.path.join(path, name)) for name in files},
        **(extra or {}),
    }
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def read_manifest(path: str) -> dict:
    mpath = os.path.join(path, "manifest.json")
    if os.path.isfile(path):
        raise ArtifactError(_not_an_artifact_file(path))
    if not os.path.isdir(path):
        raise ArtifactError(f"artifact not found: {path} (expected a directory written by tvm-nimble compile)")
    if not os.path.isfile(mpath):
        raise ArtifactError(f"{path} is not a tvm-nimble artifact (no manifest.json)")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
    except ValueError as err:
        raise ArtifactError(f"{mpath} is corrupted ({err}); rebuild the artifact") from None
    if not isinstance(manifest, dict) or manifest.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{path} is not a tvm-nimble artifact (bad format tag)")
    if manifest.get("version") not in VERSIONS:
        raise ArtifactError(f"{path} has artifact format version {manifest.get('version')}, this tvm-nimble "
                            f"reads versions {', '.join(map(str, VERSIONS))}: rebuild it with this version")
    if (manifest.get("version") in (BUCKETED_VERSION, SPACE_VERSION)) != isinstance(manifest.get("buckets"), list):
        raise ArtifactError(f"{path}/manifest.json is inconsistent (format version {manifest.get('version')} "
                            f"{'with' if isinstance(manifest.get('buckets'), list) else 'without'} buckets); "
                            "rebuild the artifact")
    return manifest


def _not_an_artifact_file(path: str) -> str:
    lower = path.lower()
    if lower.endswith(".onnx"):
        return (f"{path} is an ONNX model, not a built artifact: build it first with "
                f"tvm_nimble.build({path!r}, target).export('model.nimble') or "
                f"`tvm-nimble compile {path} -o model.nimble`, then load that directory")
    if lower.endswith((".so", ".dylib", ".dll")):
        return (f"{path} is a shared library, not a tvm-nimble artifact (a directory): for an executable from "
                f"tvm.compile(..., relax_pipeline='nimble') pass tvm.runtime.load_module({path!r}) instead")
    return f"{path} is a file, not a tvm-nimble artifact (a directory written by tvm-nimble compile)"


def check_tvm_version(path: str, manifest: dict) -> None:
    """Warn when the artifact was built with another TVM version than this process runs."""
    import tvm

    built, here = manifest.get("tvm_version"), getattr(tvm, "__version__", None)
    if built and here and built != here:
        warnings.warn(f"{path} was built with TVM {built}, this process runs TVM {here}: its kernels or plan may "
                      "not load or run correctly; rebuild the artifact with this TVM", TVMVersionWarning, stacklevel=3)


def load_artifact_files(path: str) -> tuple[dict, Plan, str, dict[str, np.ndarray]]:
    """Verify checksums and return (manifest, plan, kernels.so path, params)."""
    manifest = read_manifest(path)
    if manifest["version"] != ARTIFACT_VERSION:
        raise ArtifactError(f"{path} holds buckets: load it with tvm_nimble.load or NimbleExecutor")
    check_tvm_version(path, manifest)
    _check_sums(path, manifest, FILES)
    plan = _read_plan(path, "plan.json", manifest)
    params = _read_params(path, {f"c{c}": plan.tensors[c].dtype for c in plan.constants})
    _check_constants(path, plan, {f"c{c}": f"c{c}" for c in plan.constants}, params)
    return manifest, plan, os.path.join(path, "kernels.so"), params


def _read_params(path: str, dtypes: dict[str, str]) -> dict[str, np.ndarray]:
    """The arrays of ``path``/params.npz. numpy stores the dtypes that ml_dtypes adds (bfloat16, float8_*) as
    raw bytes, which read back as void (``|V2``): each such array is viewed as the dtype the plan gives it
    (``dtypes``: array name -> dtype), its bytes unchanged."""
    with np.load(os.path.join(path, "params.npz"), allow_pickle=False) as data:
        return {k: _as_dtype(data[k], dtypes.get(k)) for k in data.files}


def _as_dtype(arr: np.ndarray, dtype: str | None) -> np.ndarray:
    if arr.dtype.kind != "V" or dtype is None:
        return arr
    import ml_dtypes

    want = getattr(ml_dtypes, dtype, None)
    if want is None or np.dtype(want).itemsize != arr.dtype.itemsize:
        return arr  # (_check_constants names the mismatch)
    return arr.view(want)


def _check_sums(path: str, manifest: dict, files) -> None:
    sums = manifest.get("sha256")
    if not isinstance(sums, dict):
        raise ArtifactError(f"{path}/manifest.json has no checksums; rebuild the artifact")
    for name in tuple(files) + ((VENDOR_FILE,) if VENDOR_FILE in sums else ()):
        fpath = os.path.join(path, name)
        if not os.path.isfile(fpath):
            raise ArtifactError(f"{path} is incomplete: {name} is missing; rebuild the artifact")
        if file_sha256(fpath) != sums.get(name):
            raise ArtifactError(f"{path}/{name} does not match its checksum (corrupted or edited); rebuild the artifact")


def _read_plan(path: str, name: str, manifest: dict) -> Plan:
    with open(os.path.join(path, name)) as f:
        plan = Plan.from_json(f.read())
    if plan.target != manifest.get("target"):
        raise ArtifactError(f"{path}: plan and manifest disagree on the target; rebuild the artifact")
    return plan


def _check_constants(path: str, plan: Plan, names: dict, params: dict) -> None:
    """Every constant ``c<id>`` of ``plan`` is stored (as ``names[c<id>]``) with the plan's shape and dtype."""
    missing = [f"c{c}" for c in plan.constants if names.get(f"c{c}") not in params]
    if missing:
        raise ArtifactError(f"{path}/params.npz lacks constants {missing[:5]}; rebuild the artifact")
    for c in plan.constants:
        t = plan.tensors[c]
        p = params[names[f"c{c}"]]
        if list(p.shape) != t.shape or str(p.dtype) != t.dtype:
            raise ArtifactError(f"{path}: constant c{c} is {p.dtype}{list(p.shape)}, the plan expects {t.dtype}{t.shape}")


# ---- buckets ------------------------------------------------------------------------------------------
def bucket_files(key) -> tuple[str, str]:
    """The plan and kernel library of bucket ``key`` (its sizes, one per bucketed dimension): plan.b8.json
    for batch 8, plan.b1x16.json for sizes 1 and 16."""
    label = "x".join(str(int(k)) for k in key)
    return f"plan.b{label}.json", f"kernels.b{label}.so"


def save_bucketed_artifact(path: str, buckets: list, weights: dict[str, np.ndarray], space: dict | None = None,
                           extra: dict | None = None, vendor_library: str | None = None,
                           overwrite: bool = False) -> str:
    """Write an artifact of several buckets: ``buckets`` is a list of (key, plan, kernels, constant names)
    where the names map each constant ``c<id>`` of that plan to its entry in ``weights``, which params.npz
    stores once for every bucket. ``space``: the bucketed dimensions (``BucketSpace.to_json``), or None for
    batch sizes (format version 2, what ``batch_sizes`` has always written)."""
    def write(staging):
        import tvm

        files, entries = [], []
        for key, plan, kernels, names in buckets:
            plan_file, kernels_file = bucket_files(key)
            with open(os.path.join(staging, plan_file), "w") as f:
                f.write(plan.to_json())
            kernels.export_library(os.path.join(staging, kernels_file))
            files += [plan_file, kernels_file]
            where = {"batch": int(key[0])} if space is None else {"sizes": [int(k) for k in key]}
            entries.append({**where, "plan": plan_file, "kernels": kernels_file,
                            "constants": {k: names[k] for k in sorted(names)}})
        np.savez(os.path.join(staging, "params.npz"), **weights)
        files.append("params.npz")
        if any(plan.uses_vendor_kernels for _, plan, _, _ in buckets):
            if not vendor_library:
                raise ArtifactError("the plans launch cuDNN/cuBLAS kernels but no vendor extension was given to "
                                    "package; export the module returned by tvm_nimble.build")
            shutil.copyfile(vendor_library, os.path.join(staging, VENDOR_FILE))
            files.append(VENDOR_FILE)
        manifest = {"format": ARTIFACT_FORMAT, "version": BUCKETED_VERSION if space is None else SPACE_VERSION,
                    "target": buckets[0][1].target, "tvm_version": tvm.__version__, "buckets": entries,
                    **({} if space is None else {"bucket_space": space}),
                    "sha256": {name: file_sha256(os.path.join(staging, name)) for name in files}, **(extra or {})}
        with open(os.path.join(staging, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)

    return _write_staged(path, overwrite, write)


def load_bucketed_files(path: str) -> tuple[dict, object, list, dict[str, np.ndarray]]:
    """Verify a bucketed artifact and return (manifest, its BucketSpace, [(key, plan, kernels path, constant
    names)], weights)."""
    from .buckets import BucketSpace

    manifest = read_manifest(path)
    check_tvm_version(path, manifest)
    entries = manifest["buckets"]
    batches = manifest["version"] == BUCKETED_VERSION
    try:
        space = None if batches else BucketSpace.from_json(manifest["bucket_space"])
        specs = [(tuple(int(s) for s in ([e["batch"]] if batches else e["sizes"])), str(e["plan"]),
                  str(e["kernels"]), dict(e["constants"])) for e in entries]
    except (KeyError, TypeError, ValueError) as err:
        raise ArtifactError(f"{path}/manifest.json has a malformed bucket entry ({err}); rebuild the artifact") from None
    keys = [k for k, *_ in specs]
    if not specs or keys != sorted(set(keys)) or min(min(k) for k in keys) < 1:
        raise ArtifactError(f"{path}/manifest.json lists buckets {[list(k) for k in keys]}; rebuild the artifact")
    if any((p, k) != bucket_files(key) for key, p, k, _ in specs):
        raise ArtifactError(f"{path}/manifest.json names unexpected bucket files; rebuild the artifact")
    _check_sums(path, manifest, [f for _, p, k, _ in specs for f in (p, k)] + ["params.npz"])
    plans = [_read_plan(path, plan_file, manifest) for _, plan_file, _, _ in specs]
    if space is None:
        space = BucketSpace.batch([k[0] for k in keys], len(plans[0].inputs), len(plans[0].outputs))
    dtypes = {names.get(f"c{c}"): plan.tensors[c].dtype
              for plan, (_, _, _, names) in zip(plans, specs) for c in plan.constants}
    weights = _read_params(path, dtypes)
    out = []
    for plan, (key, _, kernels_file, names) in zip(plans, specs):
        _check_constants(path, plan, names, weights)
        out.append((key, plan, os.path.join(path, kernels_file), names))
    return manifest, space, out, weights
