"""Batch buckets: one model built for several batch sizes, served at any batch size.

A CUDA graph fixes every shape, so a plan serves one batch size. A model built with
``batch_sizes=[1, 2, 4, 8]`` holds one plan (and kernel library) per size, a *bucket*, and one copy
of the weights (:class:`BucketedModule`; the artifact's ``params.npz`` stores each distinct
constant once, by content). :class:`~tvm_nimble.runtime.bucketed.BucketedExecutor` takes any batch:

- ``n`` rows up to the largest bucket run on the smallest bucket that holds them: the inputs are
  copied into that bucket's input buffers, the rows past ``n`` set to zeros (copied on the device from
  zero rows kept there, :func:`padding_bytes`), and only the first ``n`` rows of every output come back
  (the padded rows never reach the caller);
- more rows than the largest bucket are split into runs of the largest bucket plus one run of the
  smallest bucket holding the rest, and the outputs are concatenated in order (``split=False``
  refuses such a batch with one line instead).

Device memory: the weights are loaded once and every bucket's plan points at the same buffers. One
bucket runs at a time per executor, so the buckets' other buffers (inputs, outputs and the memory
pool) share one allocation, sized for the bucket that needs the most (:func:`arena_layout`).

The batch is the leading dimension of every input and every output (the build checks this).

Here: the pieces (buffer layout, weights by content, row views); the module is
:class:`~tvm_nimble.runtime.module.BucketedModule`, the executor
:class:`~tvm_nimble.runtime.bucketed.BucketedExecutor`.
"""
from __future__ import annotations

import hashlib

import numpy as np

from tvm_nimble.errors import NimbleError

from .artifact import ArtifactError
from .device import Workspace
from .tvm_compat import tensor_view

#: byte alignment of each buffer inside the buckets' shared allocation
ALIGN = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def arena_layout(plan) -> tuple[dict[int, int], int]:
    """(storage id -> byte offset, total bytes) of ``plan``'s storages other than constants (inputs,
    outputs and the memory pool) placed one after another in one allocation."""
    offsets, total = {}, 0
    for s in plan.storages:
        if s.kind != "const":
            offsets[s.id] = total
            total += _align(max(s.nbytes, 1))
    return offsets, total


def max_padding(batch_sizes) -> int:
    """The most zero rows a run pads: ``n`` rows run on the smallest bucket holding them, so a bucket
    pads at most its size less the next smaller bucket's, less one."""
    sizes = sorted(batch_sizes)
    return max(b - a - 1 for a, b in zip([0, *sizes], sizes))


def padding_bytes(plan, batch_sizes) -> int:
    """Device bytes of the zero rows the padding is copied from (:func:`max_padding` rows of every input
    of ``plan``, a bucket's plan), kept on the device so that padding is a device-to-device copy."""
    rows = max_padding(batch_sizes)
    return sum(_align(plan.tensors[t].nbytes // plan.tensors[t].shape[0] * rows) for t in plan.inputs) if rows else 0


def shared_constant_storages(plan, names: dict[str, str]) -> dict[int, str]:
    """storage id -> weight name, for each constant storage of ``plan`` that holds exactly one constant
    filling it (those can point at one buffer shared by every bucket); ``names`` maps ``c<id>`` to the
    weight's name."""
    by_storage: dict[int, list[int]] = {}
    for c in plan.constants:
        by_storage.setdefault(plan.tensors[c].storage, []).append(c)
    out = {}
    for sid, consts in by_storage.items():
        t = plan.tensors[consts[0]]
        if len(consts) == 1 and t.offset == 0 and t.nbytes == plan.storages[sid].nbytes and f"c{t.id}" in names:
            out[sid] = names[f"c{t.id}"]
    return out


def _content_key(arr: np.ndarray) -> bytes:
    arr = np.ascontiguousarray(arr)
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{arr.dtype}|{arr.shape}|".encode())
    h.update(arr.reshape(-1).view(np.uint8))
    return h.digest()


def dedupe_weights(buckets: dict) -> tuple[dict[int, dict[str, str]], dict[str, np.ndarray]]:
    """(per bucket: constant ``c<id>`` -> weight name, weight name -> array): every distinct constant
    (by dtype, shape and bytes) once, named ``w0``, ``w1``, ... in order of first use."""
    keys: dict[bytes, str] = {}
    weights: dict[str, np.ndarray] = {}
    names: dict[int, dict[str, str]] = {}
    for batch, module in sorted(buckets.items()):
        names[batch] = {}
        for c in module.plan.constants:
            arr = np.asarray(module.params[f"c{c}"])
            key = _content_key(arr)
            if key not in keys:
                keys[key] = f"w{len(keys)}"
                weights[keys[key]] = arr
            names[batch][f"c{c}"] = keys[key]
    return names, weights


def _shape(slot) -> str:
    return f"{slot.dtype}{slot.shape}"


def check_buckets(buckets: dict) -> None:
    """Every bucket takes and returns the same tensors except for the leading (batch) dimension, which is
    the bucket's batch size; one line naming the first difference."""
    sizes = sorted(buckets)
    if not sizes or not all(isinstance(b, int) and b >= 1 for b in sizes):
        raise NimbleError(f"batch buckets must be positive batch sizes, got {sizes}")
    first = buckets[sizes[0]].plan
    for b in sizes:
        plan = buckets[b].plan
        if plan.target != first.target:
            raise ArtifactError(f"bucket {b} was built for another target than bucket {sizes[0]}; rebuild the artifact")
        if plan.input_names != first.input_names or len(plan.outputs) != len(first.outputs):
            raise ArtifactError(f"bucket {b} takes or returns other tensors than bucket {sizes[0]}; rebuild the artifact")
        for what, ids, ref in (("input", plan.inputs, first.inputs), ("output", plan.outputs, first.outputs)):
            for i, (t, r) in enumerate(zip(ids, ref)):
                slot, rslot = plan.tensors[t], first.tensors[r]
                if not slot.shape or slot.shape[0] != b:
                    raise ArtifactError(f"{what} {i} ({slot.name!r}) of bucket {b} is {_shape(slot)}: its leading "
                                        f"dimension is not the batch size {b}")
                if slot.shape[1:] != rslot.shape[1:] or slot.dtype != rslot.dtype:
                    raise ArtifactError(f"{what} {i} ({slot.name!r}) is {_shape(slot)} in bucket {b} but "
                                        f"{_shape(rslot)} in bucket {sizes[0]}: only the batch may differ")


class SharedWorkspace(Workspace):
    """A bucket's workspace over buffers allocated by its
    :class:`~tvm_nimble.runtime.bucketed.BucketedExecutor`."""

    def __init__(self, plan, device, storages):  # (no allocation: Workspace.__init__ is not called)
        self.plan = plan
        self.device = device
        self.storages = storages
        self.tensors = self.views()


def row_view(t, start: int, rows: int, row_bytes: int):
    """Rows ``start:start+rows`` (leading dimension) of the contiguous tensor ``t``, sharing its memory."""
    if start == 0 and rows == t.shape[0]:
        return t
    return tensor_view(t, (rows, *t.shape[1:]), str(t.dtype), start * row_bytes)
