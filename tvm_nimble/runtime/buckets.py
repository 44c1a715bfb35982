"""Buckets: one model built for several sizes of its symbolic dimensions, served at any size up to them.

A CUDA graph fixes every shape, so a plan serves one shape. A model built with
``buckets={"sequence_length": [16, 32, 64]}`` (dimensions named by the ONNX model's own dim_params;
several at once mean every combination) or ``batch_sizes=[1, 2, 4, 8]`` (the leading dimension of every
input and output) holds one plan (and kernel library) per combination of sizes, a *bucket*, and one copy
of the weights (:class:`BucketedModule`; the artifact's ``params.npz`` stores each distinct constant
once, by content). Where each bucketed dimension sits in each input and output is a
:class:`BucketSpace`. :class:`~tvm_nimble.runtime.bucketed.BucketedExecutor` takes any size:

- each bucketed dimension runs on its smallest size that holds the inputs' extent; the inputs are
  copied into that bucket's input buffers with zeros past their extent (ids 0, attention masks 0, so a
  model with a mask never attends to a padded position; a build checks that padding is masked,
  ``compiler.buckets``), and every output comes back cut to the real extent of each bucketed dimension
  it carries (the padded positions never reach the caller). Where the real part of a tensor is a
  prefix of its bucket's buffer (rows of the leading dimension; or a batch of one) this is a copy and a
  device-to-device zero fill (:func:`padding_bytes`), and an output is a view; otherwise the padding
  and the cut go through the host;
- an extent over the largest size is refused in one line, except the rows of ``batch_sizes``, which are
  independent: more rows than the largest bucket are split into runs of the largest bucket plus one run
  of the smallest bucket holding the rest, and the outputs are concatenated in order (``split=False``
  refuses such a batch with one line instead).

Device memory: the weights are loaded once and every bucket's plan points at the same buffers. One
bucket runs at a time per executor, so the buckets' other buffers (inputs, outputs and the memory
pool) share one allocation, sized for the bucket that needs the most (:func:`arena_layout`).

Here: the pieces (the space, buffer layout, weights by content, row views); the module is
:class:`~tvm_nimble.runtime.module.BucketedModule`, the executor
:class:`~tvm_nimble.runtime.bucketed.BucketedExecutor`.
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

from tvm_nimble.errors import ArtifactError, ShapeError

from .device import Workspace, tensor_at
from .inputs import InputError
from .tvm_compat import tensor_view

#: byte alignment of each buffer inside the buckets' shared allocation
ALIGN = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


#: the name of the leading dimension that ``batch_sizes`` buckets
BATCH = "batch"

Key = tuple  # a bucket: one size per dimension of its space, in the space's order
Axes = tuple  # where a tensor carries the space's dimensions: (axis, dimension index) pairs


@dataclass(frozen=True)
class BucketDim:
    """A bucketed dimension: its name (the ONNX dim_param) and the sizes built for it, ascending."""

    name: str
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class BucketSpace:
    """The bucketed dimensions of a model and where each input and output carries them.

    ``inputs`` / ``outputs``: per tensor (the model's order), its (axis, dimension index) pairs. ``rows``:
    the space of ``batch_sizes`` (one dimension, the leading axis of every input and output, whose rows
    are independent: a batch over the largest bucket is split into several runs).
    """

    dims: tuple[BucketDim, ...]
    inputs: tuple[Axes, ...]
    outputs: tuple[Axes, ...]
    rows: bool = False

    @classmethod
    def batch(cls, sizes, num_inputs: int, num_outputs: int) -> "BucketSpace":
        """The space of ``batch_sizes``: the leading dimension of every input and output."""
        return cls((BucketDim(BATCH, tuple(sorted(sizes))),), ((((0, 0),),) * num_inputs),
                   ((((0, 0),),) * num_outputs), rows=True)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dims]

    def keys(self) -> list[Key]:
        """Every bucket: each combination of the dimensions' sizes, ascending."""
        return list(itertools.product(*(d.sizes for d in self.dims)))

    def key(self, value) -> Key:
        """``value`` as a bucket key (an int names a bucket of a one-dimension space)."""
        return (int(value),) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)

    def label(self, key: Key) -> str:
        """The bucket's name in files and reports: its sizes joined by ``x`` (``8``, ``1x16``)."""
        return "x".join(map(str, key))

    def describe(self, key: Key | None = None) -> str:
        """``sequence_length 8, 16, 32`` per dimension (``key``: that bucket's sizes, ``sequence_length=16``)."""
        if key is not None:
            return ", ".join(f"{d.name}={k}" for d, k in zip(self.dims, key))
        return "; ".join(f"{d.name} {', '.join(map(str, d.sizes))}" for d in self.dims)

    @staticmethod
    def shape_at(shape, axes: Axes, extents) -> list[int]:
        """``shape`` with each bucketed axis set to its dimension's entry of ``extents``."""
        out = list(shape)
        for axis, d in axes:
            out[axis] = int(extents[d])
        return out

    def check_shape(self, index: int, name: str, shape: list[int], built: list[int]) -> None:
        """One line unless input ``index`` (``name``), of ``shape``, differs from a bucket's ``built`` shape only
        in its bucketed axes."""
        free = {axis for axis, _ in self.inputs[index]}
        if len(shape) != len(built) or any(s != b for i, (s, b) in enumerate(zip(shape, built)) if i not in free):
            spelled = ", ".join(self.dims[dict(self.inputs[index])[i]].name if i in free else str(b)
                                for i, b in enumerate(built))
            if self.rows:
                raise ShapeError(f"input {name!r} has shape {shape}; the model takes batches shaped "
                                 f"[N, {', '.join(map(str, built[1:]))}] (any N, run in buckets of "
                                 f"{list(self.dims[0].sizes)})")
            raise ShapeError(f"input {name!r} has shape {shape}; the model takes [{spelled}] "
                             f"(buckets: {self.describe()})")

    def extents(self, names: list[str], shapes: list[list[int]]) -> tuple[int, ...]:
        """Each dimension's extent in the inputs of ``shapes``; one line when two inputs disagree or one is 0."""
        seen: list[dict[str, int]] = [{} for _ in self.dims]
        for name, shape, axes in zip(names, shapes, self.inputs):
            for axis, d in axes:
                seen[d][name] = int(shape[axis])
        out = []
        for dim, by_input in zip(self.dims, seen):
            if len(set(by_input.values())) > 1:
                what = "batch size" if self.rows else dim.name
                raise InputError(f"the inputs disagree on the {what}: " + ", ".join(
                    f"{n!r} has {v} {'rows' if self.rows else ''}".rstrip() for n, v in by_input.items()))
            extent = next(iter(by_input.values()), dim.sizes[-1])
            if extent < 1:
                raise InputError("the batch is empty (0 rows): give at least one row" if self.rows else
                                 f"{dim.name} is 0 in the inputs: give at least one position")
            out.append(extent)
        return tuple(out)

    def key_for(self, extents) -> Key:
        """The bucket that runs inputs of ``extents``: per dimension, the smallest size that holds it; one line
        naming the limit for an extent over the largest size (the largest, for rows, which are split)."""
        key = []
        for dim, n in zip(self.dims, extents):
            fits = [s for s in dim.sizes if s >= n]
            if not fits and not self.rows:
                raise InputError(f"{dim.name} is {n}, over the largest bucket: the model was built for {dim.name} "
                                 f"{', '.join(map(str, dim.sizes))}; give at most {dim.sizes[-1]}, or build with a "
                                 "larger bucket")
            key.append(fits[0] if fits else dim.sizes[-1])
        return tuple(key)

    def smallest_extents(self, key: Key) -> tuple[int, ...]:
        """The smallest extents that run on bucket ``key``: one past the next smaller size of each dimension."""
        return tuple(1 + max([s for s in d.sizes if s < k], default=0) for d, k in zip(self.dims, key))

    # ---- the manifest's form -------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"dims": [{"name": d.name, "sizes": list(d.sizes)} for d in self.dims],
                "inputs": [[list(a) for a in axes] for axes in self.inputs],
                "outputs": [[list(a) for a in axes] for axes in self.outputs], "rows": self.rows}

    @classmethod
    def from_json(cls, data: dict) -> "BucketSpace":
        def axes(tensors):
            return tuple(tuple((int(a), int(d)) for a, d in pairs) for pairs in tensors)

        return cls(tuple(BucketDim(str(d["name"]), tuple(int(s) for s in d["sizes"])) for d in data["dims"]),
                   axes(data["inputs"]), axes(data["outputs"]), bool(data.get("rows", False)))


def prefix_of(real, full) -> bool:
    """Whether the region ``[:real[0], :real[1], ...]`` of a C-contiguous tensor of shape ``full`` is the first
    elements of its buffer (so it is a view at offset 0, and its padding one run of bytes after it)."""
    cut = [i for i, (r, f) in enumerate(zip(real, full)) if r != f]
    return not cut or (all(r == 1 for r in real[:cut[0]]) and cut == [cut[0]])


def padding_bytes(space: BucketSpace, plans: dict) -> int:
    """Device bytes of the zeros padding is copied from: the longest run of padding after a real prefix of an
    input (:func:`prefix_of`) in any bucket (``plans``: key -> the bucket's plan), kept on the device so that
    such padding is a device-to-device copy."""
    most = 0
    for key, plan in plans.items():
        smallest = space.smallest_extents(key)
        for t, axes in zip(plan.inputs, space.inputs):
            slot = plan.tensors[t]
            real = space.shape_at(slot.shape, axes, smallest)
            if prefix_of(real, slot.shape):
                itemsize = slot.nbytes // max(int(np.prod(slot.shape)), 1)
                most = max(most, slot.nbytes - itemsize * int(np.prod(real)))
    return _align(most) if most else 0


def arena_layout(plan) -> tuple[dict[int, int], int]:
    """(storage id -> byte offset, total bytes) of ``plan``'s storages other than constants and state (inputs,
    outputs and the memory pool) placed one after another in one allocation."""
    offsets, total = {}, 0
    for s in plan.storages:
        if s.kind not in ("const", "state"):
            offsets[s.id] = total
            total += _align(max(s.nbytes, 1))
    return offsets, total


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


def check_buckets(space: BucketSpace, buckets: dict) -> None:
    """Every bucket (``buckets``: key -> module) takes and returns the same tensors, each with its bucketed axes
    at the bucket's sizes and every other axis as in the first bucket; one line naming the first difference."""
    keys = list(buckets)
    if not keys or sorted(keys) != sorted(space.keys()):
        raise ArtifactError(f"the buckets {[space.label(k) for k in keys]} are not every combination of "
                            f"{space.describe()}; rebuild the artifact")
    first = buckets[keys[0]].plan
    for key in keys:
        plan, name = buckets[key].plan, space.label(key)
        if plan.target != first.target:
            raise ArtifactError(f"bucket {name} was built for another target than bucket {space.label(keys[0])}; "
                                "rebuild the artifact")
        if (plan.input_names != first.input_names or len(plan.outputs) != len(first.outputs)
                or len(plan.inputs) != len(space.inputs) or len(plan.outputs) != len(space.outputs)):
            raise ArtifactError(f"bucket {name} takes or returns other tensors than bucket {space.label(keys[0])}; "
                                "rebuild the artifact")
        for what, ids, ref, axes_of in (("input", plan.inputs, first.inputs, space.inputs),
                                        ("output", plan.outputs, first.outputs, space.outputs)):
            for i, (t, r, axes) in enumerate(zip(ids, ref, axes_of)):
                slot, rslot = plan.tensors[t], first.tensors[r]
                if len(slot.shape) <= max((a for a, _ in axes), default=-1):
                    raise ArtifactError(f"{what} {i} ({slot.name!r}) of bucket {name} is {_shape(slot)}: it lacks "
                                        "the bucketed axes; rebuild the artifact")
                if space.shape_at(slot.shape, axes, key) != slot.shape:
                    raise ArtifactError(f"{what} {i} ({slot.name!r}) of bucket {name} is {_shape(slot)}: its "
                                        f"bucketed axes are not {space.describe(key)}")
                if (space.shape_at(slot.shape, axes, keys[0]) != rslot.shape or slot.dtype != rslot.dtype):
                    raise ArtifactError(f"{what} {i} ({slot.name!r}) is {_shape(slot)} in bucket {name} but "
                                        f"{_shape(rslot)} in bucket {space.label(keys[0])}: only the bucketed "
                                        f"dimensions ({', '.join(space.names)}) may differ; name every dimension "
                                        "that follows them as a dim_param of the model's outputs")


class SharedBuffers:
    """Device buffers several plans of one model share (a bucketed model's buckets, a generator's steps): one
    allocation for their inputs, outputs and memory pools (one plan runs at a time), each distinct weight once,
    loaded on first use, and each state (a KV cache) once, by name, zeroed."""

    def __init__(self, device):
        self.device = device
        self.weights: dict[str, object] = {}
        self.states: dict[str, object] = {}
        self.arena = None
        self.arena_bytes = 0

    def workspaces(self, plans: dict, names: dict, weights: dict) -> dict:
        """key -> :class:`SharedWorkspace` of each plan of ``plans`` (key -> plan; ``names``: key -> its constants'
        weight names), over one arena allocated here for the largest plan's inputs, outputs and pool."""
        import tvm

        layouts = {k: arena_layout(plan) for k, plan in plans.items()}
        self.arena_bytes = max(total for _, total in layouts.values())
        self.arena = tvm.runtime.empty((max(self.arena_bytes, 1),), "uint8", self.device)
        return {k: self._workspace(plan, layouts[k][0], names[k], weights) for k, plan in plans.items()}

    def _workspace(self, plan, offsets: dict[int, int], names: dict[str, str], weights: dict) -> "SharedWorkspace":
        """``plan``'s buffers: its inputs, outputs and pool at ``offsets`` in the arena, each whole-constant storage
        the shared weight buffer, each state the shared state of its name, other constant storages its own;
        constants loaded."""
        import tvm

        arena = self.arena

        shared = shared_constant_storages(plan, names)
        state_of = {plan.tensors[t].storage: plan.tensors[t] for t in plan.states}
        storages = []
        for s in plan.storages:
            size = (max(s.nbytes, 1),)
            if s.id in offsets:
                storages.append(tensor_at(arena, size, "uint8", offsets[s.id]))
            elif s.id in shared:
                storages.append(self._weight(shared[s.id], s, plan, weights))
            elif s.id in state_of:
                storages.append(self._state(state_of[s.id], s))
            else:  # a constant storage that is not one whole constant: the plan's own, loaded below
                storages.append(tvm.runtime.empty(size, "uint8", self.device))
        ws = SharedWorkspace(plan, self.device, storages)
        for c in plan.constants:
            if plan.tensors[c].storage not in shared:
                ws.tensors[c].copyfrom(np.asarray(weights[names[f"c{c}"]], order="C"))
        return ws  # (its inputs are zeroed by the executor right before its warm-up run: Workspace.zero)

    def _weight(self, name: str, storage, plan, weights: dict):
        """The device buffer of weight ``name``, allocated and loaded on first use."""
        import tvm

        if name not in self.weights:
            buf = tvm.runtime.empty((max(storage.nbytes, 1),), "uint8", self.device)
            t = next(plan.tensors[c] for c in plan.constants if plan.tensors[c].storage == storage.id)
            tensor_at(buf, t.shape, t.dtype, 0).copyfrom(np.asarray(weights[name], order="C"))
            self.weights[name] = buf
        return self.weights[name]

    def _state(self, slot, storage):
        """The device buffer of state ``slot.name``, allocated zeroed on first use; one line when two plans disagree on
        its size."""
        import tvm

        buf = self.states.get(slot.name)
        if buf is None:
            buf = tvm.runtime.empty((max(storage.nbytes, 1),), "uint8", self.device)
            buf.copyfrom(np.zeros(max(storage.nbytes, 1), "uint8"))
            self.states[slot.name] = buf
        elif int(buf.shape[0]) != max(storage.nbytes, 1):
            raise ArtifactError(f"state {slot.name!r} is {storage.nbytes} bytes in one plan and {int(buf.shape[0])} in "
                                "another of the same model; rebuild the artifact")
        return buf

    def release(self) -> None:
        self.weights = {}
        self.states = {}
        self.arena = None


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
