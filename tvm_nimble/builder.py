"""``tvm_nimble.build``: model in, NimbleModule out (stage 1 -> stage 2)."""
from __future__ import annotations

import os
import warnings

import tvm

from tvm_nimble.codegen.kernels import build_kernels
from tvm_nimble.codegen.lower_plan import build_plan
from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes.pipeline import lower_and_annotate

from .runtime.module import NimbleModule

_warned_untuned = False


CUDA_LIMITS = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 49152, "thread_warp_size": 32,
               "registers_per_block": 65536}


def normalize_target(target) -> tvm.target.Target:
    """Accept 'cuda', 'llvm', 'cuda -arch=sm_90', a dict or a Target; CUDA needs an arch."""
    if isinstance(target, tvm.target.Target):
        t = target
    else:
        if isinstance(target, str):
            kind, *rest = target.split()
            spec = {"kind": kind}
            for opt in rest:
                key, _, val = opt.lstrip("-").partition("=")
                spec[key] = val
            target = spec
        if isinstance(target, dict) and target.get("kind") == "cuda" and not target.get("arch"):
            raise NimbleError("a CUDA target needs the GPU arch, e.g. {'kind': 'cuda', 'arch': 'sm_90'} "
                              "(--arch sm_90 on the command line)")
        if not isinstance(target, dict) or "kind" not in target:
            raise NimbleError(f"target must be 'cuda', 'llvm', a dict like {{'kind': 'cuda', 'arch': 'sm_90'}} "
                              f"or a tvm.target.Target, got {target!r}")
        if target.get("kind") == "cuda":  # limits MetaSchedule needs; the same for every sm_50+ GPU
            target = {**CUDA_LIMITS, **target}
        try:
            t = tvm.target.Target(target)
        except Exception as err:
            raise NimbleError(f"invalid target {target!r}: {str(err).splitlines()[0]}") from None
    if t.kind.name not in ("cuda", "llvm"):
        raise NimbleError(f"target kind {t.kind.name!r} is not supported; use 'cuda' or 'llvm'")
    if t.kind.name == "cuda" and not t.attrs.get("arch"):
        raise NimbleError("a CUDA target needs the GPU arch, e.g. {'kind': 'cuda', 'arch': 'sm_90'} "
                          "(--arch sm_90 on the command line)")
    return t


def target_dict(t: tvm.target.Target) -> dict:
    d = {"kind": t.kind.name}
    if t.kind.name == "cuda":
        d["arch"] = str(t.attrs["arch"])
    return d


def _as_relax(model, shape_dict):
    if isinstance(model, tvm.IRModule):
        return model
    from .frontend import from_onnx

    return from_onnx(model, shape_dict=shape_dict)


def build(model, target="llvm", params: dict | None = None, *, max_streams: int | None = None,
          shape_dict: dict | None = None, tuning_db: str | None = None, reuse: str = "concurrent") -> NimbleModule:
    """Build ``model`` (a Relax IRModule, an ONNX ModelProto or a path to a .onnx file) with Nimble.

    ``max_streams`` caps the stream count (1 gives the single-stream schedule); ``tuning_db``
    is a MetaSchedule database directory whose tuned kernels replace the default schedules.
    """
    t = normalize_target(target)
    mod = _as_relax(model, shape_dict)
    if params:
        mod = tvm.relax.transform.BindParams("main", params)(mod)
    if max_streams is not None and max_streams < 1:
        raise NimbleError(f"max_streams must be >= 1, got {max_streams}")
    database = open_tuning_database(tuning_db) if tuning_db else None
    if database is None and t.kind.name == "cuda":
        global _warned_untuned
        if not _warned_untuned:
            warnings.warn("building CUDA kernels without a tuning database: kernels use TVM's default "
                          "schedules (several times slower than tuned ones); see `tvm-nimble tune`", stacklevel=2)
            _warned_untuned = True
    annotated = lower_and_annotate(mod, t, max_streams=max_streams, tuning_database=database)
    plan, consts = build_plan(annotated, target_dict(t), reuse=reuse)
    kernels = build_kernels(annotated, t)
    info = {"max_streams": max_streams, "tuning_db": os.path.abspath(tuning_db) if tuning_db else None}
    return NimbleModule(plan, kernels, consts, annotated, info)


def open_tuning_database(path: str):
    from tvm.s_tir import meta_schedule as ms

    workload = os.path.join(path, "database_workload.json")
    records = os.path.join(path, "database_tuning_record.json")
    if not (os.path.isfile(workload) and os.path.isfile(records)):
        raise NimbleError(f"no MetaSchedule database in {path} (expected database_workload.json and "
                          "database_tuning_record.json); run `tvm-nimble tune` first")
    return ms.database.JSONDatabase(path_workload=workload, path_tuning_record=records)
