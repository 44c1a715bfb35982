"""Bucketed builds: one build per bucket, one artifact, the weights once.

``build(..., buckets={"sequence_length": [16, 32, 64]})`` buckets the ONNX model's named dimensions (its
inputs' dim_params; several at once mean every combination); ``build(..., batch_sizes=[1, 2, 4, 8])``
buckets the leading dimension of every input. Each bucket is a whole build of the ONNX model with those
dimensions set to the bucket's sizes, so the kernel choice and the stream choice are made, and measured,
per bucket. The buckets are put together as a :class:`~tvm_nimble.runtime.module.BucketedModule`, whose
artifact stores every distinct constant once and whose executor serves any size up to the largest bucket,
padding with zeros (see :mod:`tvm_nimble.runtime.buckets`).

Padding is right only where the model masks it: a padded position must not change the real ones (a
causal decoder, or an encoder whose attention mask is 0 at padded positions, which the executor's zero
padding of a mask input gives). A build over named dimensions checks this where its target runs here
(:func:`check_padding`): the real positions of a run padded to the next bucket must equal the exact
bucket's; a model whose padding is not masked is refused in one line.

A model whose batch cannot be changed is refused in one line: an input without the batch as its
leading dimension, or a graph that bakes the batch in (a Reshape to a fixed shape whose leading entry is
the exported batch, named in the message when there is one), found because building another batch
size fails or gives outputs whose leading dimension is not the batch. A bucket name the model does not
have, or a dynamic dimension neither bucketed nor given a shape, is one line too.
"""
from __future__ import annotations

import contextlib

from dataclasses import dataclass

import numpy as np

from tvm_nimble.errors import ModelError, NimbleError, ShapeError
from tvm_nimble.runtime.buckets import BATCH, BucketDim, BucketSpace
from tvm_nimble.runtime.module import BucketedModule

from .reference_build import BucketImport
from .stages import one_vendor_library


def _batch_inputs(model, shape_dict) -> tuple[dict[str, list], int | None]:
    """(input name -> its dims after the batch, the model's static batch or None) of an ONNX model; one
    line when an input does not have the batch as its leading dimension."""
    from tvm_nimble.compiler.frontend.fold_shapes import declared_dims

    inputs, shape_dict = _inputs_and_shapes(model, shape_dict)
    rest: dict[str, list] = {}
    leads: dict[str, object] = {}
    for vi in inputs:
        dims = declared_dims(vi)
        if vi.name in shape_dict:
            given = [int(d) for d in shape_dict[vi.name]]
            if dims is not None and len(dims) != len(given):
                raise ShapeError(f"shape_dict[{vi.name!r}] has rank {len(given)} but input {vi.name!r} has rank "
                                 f"{len(dims)}")
            dims = [dims[0] if dims else None] + given[1:] if given else []
        if dims is None:
            raise ShapeError(f"input {vi.name!r} has unknown rank: give its shape with shape_dict (--shape), the "
                             "batch first")
        if not dims:
            raise ModelError(f"batch_sizes needs the batch as the leading dimension of every input, but input "
                             f"{vi.name!r} is a scalar")
        dynamic = [i for i, d in enumerate(dims[1:], 1) if not isinstance(d, int)]
        if dynamic:
            raise ShapeError(f"input {vi.name!r} has dynamic dim {dynamic[0]}: give its shape with shape_dict "
                             f"(--shape {vi.name}=N,...); with batch_sizes its leading dimension is each batch size")
        rest[vi.name] = list(dims[1:])
        leads[vi.name] = dims[0]
    static = {n: d for n, d in leads.items() if isinstance(d, int)}
    if len(set(static.values())) > 1:
        (a, da), *others = static.items()
        b, db = next((n, d) for n, d in others if d != da)
        raise ModelError(f"batch_sizes needs the batch as the leading dimension of every input, but input {a!r} "
                         f"starts with {da} and {b!r} with {db}: the batch cannot be changed in both")
    return rest, (next(iter(static.values())) if static else None)


def _inputs_and_shapes(model, shape_dict) -> tuple[list, dict]:
    """(the model's inputs that are not initializers, ``shape_dict`` as a dict); one line when ``shape_dict`` names
    an input the model does not have."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    shape_dict = dict(shape_dict or {})
    unknown = [k for k in shape_dict if k not in {vi.name for vi in inputs}]
    if unknown:
        raise ShapeError(f"shape_dict names input {unknown[0]!r}, which the model does not have: its inputs are "
                         f"{', '.join(repr(vi.name) for vi in inputs)}")
    return inputs, shape_dict


def _named_inputs(model, dims: tuple, shape_dict) -> tuple[dict[str, list], dict[str, tuple], tuple]:
    """(input name -> its dims with None at the bucketed axes, input name -> its (axis, dimension) pairs,
    per output its (axis, dimension) pairs) of an ONNX ``model`` bucketed over ``dims`` ((name, sizes), ...)
    named by its dim_params; one line for a name the model lacks or a dynamic dimension left open."""
    from tvm_nimble.compiler.frontend.fold_shapes import declared_dims

    inputs, shape_dict = _inputs_and_shapes(model, shape_dict)
    declared = {vi.name: declared_dims(vi) for vi in inputs}
    named = list(dict.fromkeys(d for ds in declared.values() if ds for d in ds if isinstance(d, str)))
    index = {name: i for i, (name, _) in enumerate(dims)}
    missing = [name for name in index if name not in named]
    if missing:
        have = (f"its inputs' dimensions are named {', '.join(map(repr, named))}" if named else
                "its inputs have no named (dynamic) dimensions: export it with dynamic axes")
        raise ShapeError(f"buckets names dimension {missing[0]!r}, which the model's inputs do not have: {have}")
    base, axes = {}, {}
    for vi in inputs:
        ds = declared[vi.name]
        given = shape_dict.get(vi.name)
        if given is not None:
            given = [int(d) for d in given]
            if ds is not None and len(ds) != len(given):
                raise ShapeError(f"shape_dict[{vi.name!r}] has rank {len(given)} but input {vi.name!r} has rank "
                                 f"{len(ds)}")
            ds = [d if isinstance(d, str) and d in index else g for d, g in zip(ds or given, given)]
        if ds is None:
            raise ShapeError(f"input {vi.name!r} has unknown rank: give its shape with shape_dict (--shape)")
        axes[vi.name] = tuple((i, index[d]) for i, d in enumerate(ds) if isinstance(d, str) and d in index)
        open_dims = [(i, d) for i, d in enumerate(ds) if not isinstance(d, int) and not (isinstance(d, str) and d in index)]
        if open_dims:
            i, d = open_dims[0]
            fix = (f"bucket it too (buckets={{..., {d!r}: [N]}}: one size fixes it) or give" if d else "give")
            raise ShapeError(f"input {vi.name!r} has dynamic dim {i}{f' ({d!r})' if d else ''}: {fix} the input's "
                             f"shape with shape_dict (--shape {vi.name}=N,...)")
        base[vi.name] = [None if isinstance(d, str) else d for d in ds]
    outputs = []
    for vi in model.graph.output:
        ds = declared_dims(vi) or []
        outputs.append(tuple((i, index[d]) for i, d in enumerate(ds) if isinstance(d, str) and d in index))
    return base, axes, tuple(outputs)


def baked_reshapes(model, model_batch: int | None) -> list[str]:
    """Reshape nodes of ``model`` whose target shape is a constant starting with the exported batch size
    (neither 0 nor -1): each fixes the batch, e.g. ``Reshape(x, [1, 32, 16])``."""
    import numpy as np
    from onnx import numpy_helper

    if model_batch is None:
        return []
    consts = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    consts[n.output[0]] = a.t
    found = []
    for n in model.graph.node:
        if n.op_type == "Reshape" and len(n.input) > 1 and n.input[1] in consts:
            shape = np.asarray(numpy_helper.to_array(consts[n.input[1]])).reshape(-1)
            if shape.size and int(shape[0]) == model_batch:
                found.append(f"Reshape node {n.name or n.output[0]!r} (shape {[int(s) for s in shape]})")
    return found


def _cannot_change(what: str, reshapes: list[str], model_batch) -> ModelError:
    """The one line for a model whose batch is baked in: ``what`` happened, and the Reshape that fixes it."""
    if reshapes:
        more = f" and {len(reshapes) - 1} more" if len(reshapes) > 1 else ""
        return ModelError(f"the model's batch dimension cannot be changed: {reshapes[0]}{more} fix the batch at "
                          f"{model_batch}, so {what}; export the model with a dynamic batch (0 or -1 in the batch's "
                          "place of the Reshape's shape)")
    return ModelError(f"the model's batch dimension cannot be changed: {what}; the graph fixes the batch somewhere (a "
                      "Reshape, Expand or Tile to a fixed shape?): export it with a dynamic batch")


def _short(err: Exception, limit: int = 160) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


class BucketRequest:
    """A bucketed build of an ONNX ``model`` with ``options.buckets`` or ``options.batch_sizes``, as ``build``
    strings it::

        request = BucketRequest(model, options, shape_dict)
        lifted = BucketImport.lifted(request.onnx_model)  # the weights parsed once for every bucket
        for key, bucket in request.imports():             # how that bucket's sizes are imported
            with request.building(key):                   # a failure at another batch: one line naming why
                built[key] = request.checked(key, build_with(bucket.module(lifted), request.options))
        module = request.module(built, note)              # one BucketedModule, the weights once, padding checked
    """

    def __init__(self, model, options, shape_dict: dict | None = None):
        import tvm

        from .frontend.onnx_import import load_onnx_model

        self.rows = bool(options.batch_sizes)
        what = "batch_sizes" if self.rows else "buckets"
        if isinstance(model, tvm.IRModule) or type(model).__name__ == "Selection":
            raise NimbleError(f"{what} needs an ONNX model (a .onnx file or an onnx.ModelProto) whose dimensions can "
                              f"be set, not a {type(model).__name__}: each bucket's sizes are set at import")
        self.onnx_model = load_onnx_model(model)
        self.check_options = options
        self.options = options.replace(batch_sizes=None, buckets=None)  # each bucket: one ordinary build
        if self.rows:
            self.dims = ((BATCH, tuple(options.batch_sizes)),)
            self.rest, self.model_batch = _batch_inputs(self.onnx_model, shape_dict)
            self.reshapes = baked_reshapes(self.onnx_model, self.model_batch)
            self.base = {name: [None, *rest] for name, rest in self.rest.items()}
            self.axes = {name: ((0, 0),) for name in self.rest}
            self.output_axes = None  # every output's leading axis
        else:
            self.dims = tuple(options.buckets)
            self.model_batch, self.reshapes = None, []
            self.base, self.axes, self.output_axes = _named_inputs(self.onnx_model, self.dims, shape_dict)

    def keys(self) -> list[tuple]:
        """Every bucket (one size per dimension); for batch sizes the exported batch first, so that a failure
        there is the model's own, not the batch's."""
        import itertools

        keys = list(itertools.product(*(sizes for _, sizes in self.dims)))
        return sorted(keys, key=lambda k: (k[0] != self.model_batch, k)) if self.rows else keys

    def imports(self):
        """(key, how that bucket is imported: a :class:`~.reference_build.BucketImport`) per bucket."""
        for key in self.keys():
            yield key, BucketImport(self.shapes_at(key), self.rows)

    def shapes_at(self, key) -> dict[str, list]:
        """The inputs' shapes at bucket ``key`` (input name -> dims)."""
        return {name: BucketSpace.shape_at(dims, self.axes[name], key) for name, dims in self.base.items()}

    def describe(self, key) -> str:
        return f"batch {key[0]}" if self.rows else ", ".join(f"{n}={k}" for (n, _), k in zip(self.dims, key))

    @contextlib.contextmanager
    def building(self, key):
        """An import at another batch than the exported one that fails is one line: the batch is baked in.
        (Failures after the import, in TVM's lowering or code generation, are not the batch's and pass as they are;
        so do those of named dimensions, which have no exported size.)"""
        try:
            yield
        except (ModelError, ShapeError) as err:  # what the ONNX import raises
            if not self.rows or key[0] == self.model_batch:
                raise
            raise _cannot_change(f"building it for batch {key[0]} fails ({_short(err)})", self.reshapes,
                                 self.model_batch) from None

    def checked(self, key, result):
        """``result`` (the build for bucket ``key``), once every output carries the bucket's sizes where the model
        names them (batch sizes: every output's leading dimension)."""
        plan = result.plan
        for i, t in enumerate(plan.outputs):
            slot = plan.tensors[t]
            if self.rows:
                if not slot.shape or slot.shape[0] != key[0]:
                    raise _cannot_change(f"built for batch {key[0]}, its output {i} ({slot.name!r}) has shape "
                                         f"{slot.shape}, not {key[0]} rows", self.reshapes, self.model_batch)
                continue
            axes = self.output_axes[i] if i < len(self.output_axes) else ()
            if len(slot.shape) <= max((a for a, _ in axes), default=-1) or \
                    BucketSpace.shape_at(slot.shape, axes, key) != slot.shape:
                name = self.dims[axes[0][1]][0]
                raise ModelError(f"built for {self.describe(key)}, the model's output {i} ({slot.name!r}) has shape "
                                 f"{slot.shape}, which does not follow {name} as its declared dims say: the graph "
                                 f"fixes {name} somewhere (a Reshape or Expand to a fixed shape?); export it with "
                                 f"{name} dynamic")
        return result

    def space(self, plan) -> BucketSpace:
        """The bucket space of the built buckets (``plan``: one of theirs, for the inputs' order)."""
        if self.rows:
            return BucketSpace.batch(self.dims[0][1], len(plan.inputs), len(plan.outputs))
        return BucketSpace(tuple(BucketDim(n, tuple(sizes)) for n, sizes in self.dims),
                           tuple(self.axes[name] for name in plan.input_names), self.output_axes)

    def module(self, built: dict, note=None) -> BucketedModule:
        """The buckets put together, the padding checked (:func:`check_padding`; ``note`` is told when it cannot
        run here)."""
        space = self.space(next(iter(built.values())).plan)
        built = one_vendor_library(built, self.options.target)
        module = BucketedModule.of({k: built[k] for k in sorted(built)}, space)
        if not self.rows:
            module.info["padding_check"] = check_padding(module, self.check_options, note)
        return module


# ---- is padding masked? --------------------------------------------------------------------------------
def is_mask(name: str) -> bool:
    """Whether input ``name`` is a mask (``attention_mask``, or any name holding "mask"): 1 at real positions."""
    return "mask" in name.lower()


@dataclass(frozen=True)
class PaddingProbe:
    """One comparison :func:`check_padding` makes for dimension ``dim``: inputs of ``extents`` run on bucket
    ``padded`` (padding with zeros, or with ``noise`` where the model has no smaller bucket) against ``exact``
    (their own bucket; for noise, the same bucket zero-padded)."""

    dim: int
    extents: tuple
    exact: tuple
    padded: tuple
    noise: bool


def padding_probes(space: BucketSpace) -> list[PaddingProbe]:
    """Per dimension with room to pad: the smallest size run on the next larger bucket, against its own; with one
    size, one position less run zero-padded against noise-padded (every other dimension at its smallest)."""
    smallest = tuple(d.sizes[0] for d in space.dims)
    out = []
    for i, dim in enumerate(space.dims):
        if len(dim.sizes) > 1:
            bigger = smallest[:i] + (dim.sizes[1],) + smallest[i + 1:]
            out.append(PaddingProbe(i, smallest, smallest, bigger, noise=False))
        elif dim.sizes[0] > 1:
            shorter = smallest[:i] + (dim.sizes[0] - 1,) + smallest[i + 1:]
            out.append(PaddingProbe(i, shorter, smallest, smallest, noise=True))
    return out


def _probe_inputs(plan, space: BucketSpace, extents, rng) -> list[np.ndarray]:
    """Seeded inputs of ``extents``: masks 1, indices inside their tables, other integers 1, floats normal."""
    out = []
    for t, axes in zip(plan.inputs, space.inputs):
        slot = plan.tensors[t]
        shape = space.shape_at(slot.shape, axes, extents)
        dtype = np.dtype(slot.dtype) if slot.dtype != "bfloat16" else np.float32
        if is_mask(slot.name) or dtype.kind in "iub":
            bound = plan.index_bounds.get(slot.name)
            x = rng.integers(0, bound, shape) if bound and not is_mask(slot.name) else np.ones(shape)
        else:
            x = rng.standard_normal(shape)
        out.append(np.asarray(x).astype(slot.dtype))
    return out


def _padded(x: np.ndarray, full, fill: np.ndarray | None) -> np.ndarray:
    """``x`` in the corner of an array of shape ``full``: zeros elsewhere, or ``fill``'s entries."""
    out = np.zeros(full, x.dtype) if fill is None else fill.astype(x.dtype).copy()
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out


def _run_bucket(ex, space: BucketSpace, key, inputs, extents, noise_rng=None) -> list[np.ndarray]:
    """The outputs (cut to ``extents``) of bucket ``key`` of the executor ``ex`` on ``inputs`` padded to it
    (zeros; with ``noise_rng``, other inputs' padding drawn at random, masks' still 0)."""
    bucket = ex.bucket(key)
    plan = bucket.plan
    noise = _probe_inputs(plan, space, key, noise_rng) if noise_rng is not None else [None] * len(inputs)
    outs = bucket(*[_padded(x, plan.tensors[t].shape, None if is_mask(plan.tensors[t].name) else fill)
                    for x, t, fill in zip(inputs, plan.inputs, noise)])
    cut = []
    for o, axes in zip(outs, space.outputs):
        o = o.numpy()
        real = space.shape_at(o.shape, axes, extents)
        cut.append(o[tuple(slice(0, n) for n in real)].astype(np.float64))
    return cut


def _error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest relative L2 difference of ``got`` against ``want`` over the outputs (inf where NaNs differ)."""
    worst = 0.0
    for a, b in zip(got, want):
        if not np.array_equal(np.isnan(a), np.isnan(b)):
            return float("inf")
        diff = np.where(np.isnan(b), 0.0, a - b)
        worst = max(worst, float(np.linalg.norm(diff) / max(np.linalg.norm(np.nan_to_num(b)), 1e-30)))
    return worst


def check_padding(module: BucketedModule, options, note=None) -> str:
    """Refuse (one line) a bucketed model whose padding is not masked; what was checked, in words.

    Where the build's target runs here (llvm; cuda on this machine's GPU), each bucketed dimension with room to
    pad runs its smallest size padded to the next bucket, against the exact bucket (with one size: one position
    less padded with zeros against padded with noise), on seeded inputs whose masks are 1 at the real positions;
    the real positions must agree (relative L2 1e-4 in fp32, 1e-2 in reduced precision). Elsewhere nothing is
    run: ``note`` says so."""
    from . import accuracy
    from tvm_nimble.runtime.bucketed import BucketedExecutor

    space = module.space
    probes = padding_probes(space)
    if not probes:
        return "nothing to check: no bucketed dimension pads"
    why = accuracy.unmeasurable(options) or (None if options.compile_kernels else "kernels were not compiled")
    if why is not None:
        text = (f"padding over {', '.join(space.names)} was not checked ({why}): a model whose padding is not "
                "masked (no attention mask) gives wrong outputs for inputs shorter than their bucket")
        if note is not None and options.compile_kernels:
            note(text)
        return "not checked: " + why
    limit = 1e-4 if options.precision == "fp32" else 1e-2
    rng = np.random.default_rng(0)
    with BucketedExecutor(module) as ex:
        for probe in probes:
            inputs = _probe_inputs(module.bucket(probe.padded).plan, space, probe.extents, rng)
            want = _run_bucket(ex, space, probe.exact, inputs, probe.extents)
            got = _run_bucket(ex, space, probe.padded, inputs, probe.extents,
                              np.random.default_rng(1) if probe.noise else None)
            err = _error(got, want)
            if not err <= limit:
                dim = space.dims[probe.dim]
                n, m = probe.extents[probe.dim], probe.padded[probe.dim]
                how = "with other padding values" if probe.noise else f"padded to {m}"
                raise ModelError(f"padding {dim.name} is not masked: a run of {n} positions {how} gives other outputs "
                                 f"at the real positions than unpadded (relative error {err:.2g}), so inputs shorter "
                                 f"than their bucket would get wrong outputs; give the model an attention mask input "
                                 f"(named 'attention_mask', 0 at padded positions), or bucket only sizes you run "
                                 f"exactly")
    return "passed: padded positions do not change the real ones (" + ", ".join(
        f"{space.dims[p.dim].name} {p.extents[p.dim]} on {p.padded[p.dim]}" for p in probes) + ")"


# ---- explain -----------------------------------------------------------------------------------------
def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def describe_buckets(module: BucketedModule) -> list[str]:
    """The buckets (each a BuildResult) in a few lines: weights stored once, the shared buffer, and per bucket its
    sizes, launches, streams, syncs, memory pool and (when measured: ``max_streams='auto'`` on a GPU) latency."""
    from tvm_nimble.runtime.buckets import arena_layout

    space = module.space
    _, weights = module.shared_weights()
    stored = sum(np.asarray(w).nbytes for w in weights.values())
    each = sum(np.asarray(p).nbytes for m in module.buckets.values() for p in m.params.values())
    arenas = [arena_layout(m.plan)[1] for m in module.buckets.values()]
    if space.rows:
        head = (f"batch buckets: {', '.join(map(str, module.batch_sizes))} (one plan each; a batch runs on the smallest "
                "bucket that holds it, padded; a larger one is split)")
    else:
        head = (f"buckets: {space.describe()} ({len(module.buckets)} plans, every combination; an input runs on the "
                "smallest bucket that holds it, padded with zeros, its outputs cut to its size)")
    lines = [head,
             f"weights: {len(weights)} constants stored once, {_size(stored)} ({_size(each)} if each bucket kept its own)",
             f"shared buffer (inputs, outputs, memory pool; one bucket runs at a time): {_size(max(arenas))}, the "
             f"largest bucket's need ({_size(sum(arenas))} if each bucket had its own)"]
    if "padding_check" in module.info:
        lines.append(f"padding check: {module.info['padding_check']}")
    width = [max(len(n), 5) for n in space.names]
    lines.append("  " + " ".join(f"{n:>{w}s}" for n, w in zip(space.names, width)) +
                 f" {'launches':>8s} {'streams':>7s} {'syncs':>5s} {'pool':>10s}  latency")
    for key, m in module.buckets.items():
        p = m.plan
        choice = m.report.stream_choice
        ms = choice.chosen_ms if choice is not None else None
        if ms is None:
            latency = "not measured (no GPU here)"
        else:
            latency = f"{ms:.3f} ms" + (f" ({ms / key[0] * 1000:.1f} us/row)" if space.rows else "")
        lines.append("  " + " ".join(f"{k:{w}d}" for k, w in zip(key, width)) +
                     f" {len(p.launches):8d} {p.num_streams:7d} {sum(len(l.waits) for l in p.launches):5d} "
                     f"{_size(p.memory.get('pool_bytes', 0)):>10s}  {latency}")
    top = max(module.buckets)
    lines.append(f"the largest bucket ({'batch ' + str(top[0]) if space.rows else space.describe(top)}):")
    return lines
