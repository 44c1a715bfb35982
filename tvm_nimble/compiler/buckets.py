"""``build(..., batch_sizes=[1, 2, 4, 8])``: one build per batch size, one artifact, the weights once.

Each bucket is a whole build of the ONNX model with its batch dimension (the leading dimension of every
input) set to that size, so the kernel choice and the stream choice are made, and measured, per
bucket. The buckets are put together as a :class:`~tvm_nimble.runtime.buckets.BucketedModule`, whose
artifact stores every distinct constant once and whose executor serves any batch size (see
:mod:`tvm_nimble.runtime.buckets`).

A model whose batch cannot be changed is refused in one line: an input without the batch as its
leading dimension, or a graph that bakes the batch in (a Reshape to a fixed shape whose leading entry is
the exported batch, named in the message when there is one), found because building another batch
size fails or gives outputs whose leading dimension is not the batch.
"""
from __future__ import annotations

import contextlib

from tvm_nimble.errors import ModelError, NimbleError, ShapeError
from tvm_nimble.runtime.module import BucketedModule

#: the dim_param the buckets' ONNX models give their outputs' batch dimension
BATCH_DIM = "batch"


def _batch_inputs(model, shape_dict) -> tuple[dict[str, list], int | None]:
    """(input name -> its dims after the batch, the model's static batch or None) of an ONNX model; one
    line when an input does not have the batch as its leading dimension."""
    from tvm_nimble.compiler.frontend.fold_shapes import declared_dims

    inits = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    shape_dict = dict(shape_dict or {})
    unknown = [k for k in shape_dict if k not in {vi.name for vi in inputs}]
    if unknown:
        raise ShapeError(f"shape_dict names input {unknown[0]!r}, which the model does not have: its inputs are "
                         f"{', '.join(repr(vi.name) for vi in inputs)}")
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


def with_batch(model, rest: dict[str, list], batch: int):
    """A copy of the ONNX ``model`` whose inputs have ``batch`` rows (``rest``: each input's other dims);
    its outputs' leading dimension becomes symbolic and the intermediate shape hints are dropped (they
    name the exported batch)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for vi in g.input:
        if vi.name in rest and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
            vi.type.tensor_type.shape.SetInParent()
            for d in [batch, *rest[vi.name]]:
                vi.type.tensor_type.shape.dim.add().dim_value = d
    for vi in g.output:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and len(tt.shape.dim):
            tt.shape.dim[0].Clear()
            tt.shape.dim[0].dim_param = BATCH_DIM
    del g.value_info[:]
    return out


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
    """A bucketed build of an ONNX ``model`` with ``options.batch_sizes``, as ``build`` strings it::

        request = BucketRequest(model, options, shape_dict)
        for batch, onnx_model in request.models():          # the model with that batch, exported batch first
            with request.building(batch):                   # a failure at another batch: one line naming why
                built[batch] = request.checked(batch, build_with(onnx_model, request.options, params))
        module = request.module(built)                      # one BucketedModule, the weights once
    """

    def __init__(self, model, options, shape_dict: dict | None = None):
        import tvm

        from .frontend.onnx_import import load_onnx_model

        if isinstance(model, tvm.IRModule) or type(model).__name__ == "Selection":
            raise NimbleError("batch_sizes needs an ONNX model (a .onnx file or an onnx.ModelProto) whose batch is the "
                              f"leading dimension of every input, not a {type(model).__name__}: the batch is set per "
                              "bucket at import")
        self.onnx_model = load_onnx_model(model)
        self.batch_sizes = tuple(options.batch_sizes)
        self.options = options.replace(batch_sizes=None)  # each bucket: one ordinary build
        self.rest, self.model_batch = _batch_inputs(self.onnx_model, shape_dict)
        self.reshapes = baked_reshapes(self.onnx_model, self.model_batch)

    def models(self):
        """(batch, the ONNX model with that batch) per bucket; the exported batch first, so that a failure there
        is the model's own, not the batch's."""
        for batch in sorted(self.batch_sizes, key=lambda b: (b != self.model_batch, b)):
            yield batch, with_batch(self.onnx_model, self.rest, batch)

    @contextlib.contextmanager
    def building(self, batch: int):
        """An import at another batch than the exported one that fails is one line: the batch is baked in.
        (Failures after the import, in TVM's lowering or code generation, are not the batch's and pass as they are.)"""
        try:
            yield
        except (ModelError, ShapeError) as err:  # what the ONNX import raises
            if batch == self.model_batch:
                raise
            raise _cannot_change(f"building it for batch {batch} fails ({_short(err)})", self.reshapes,
                                 self.model_batch) from None

    def checked(self, batch: int, result):
        """``result`` (the build for ``batch``), once every output has ``batch`` rows."""
        plan = result.plan
        for i, t in enumerate(plan.outputs):
            slot = plan.tensors[t]
            if not slot.shape or slot.shape[0] != batch:
                raise _cannot_change(f"built for batch {batch}, its output {i} ({slot.name!r}) has shape "
                                     f"{slot.shape}, not {batch} rows", self.reshapes, self.model_batch)
        return result

    def module(self, built: dict) -> BucketedModule:
        return BucketedModule.of(built)


# ---- explain -----------------------------------------------------------------------------------------
def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def describe_buckets(module: BucketedModule) -> list[str]:
    """The buckets (each a BuildResult) in a few lines: weights stored once, the shared buffer, and per bucket its
    launches, streams, syncs, memory pool and (when measured: ``max_streams='auto'`` on a GPU) latency."""
    import numpy as np

    from tvm_nimble.runtime.buckets import arena_layout

    _, weights = module.shared_weights()
    stored = sum(np.asarray(w).nbytes for w in weights.values())
    each = sum(np.asarray(p).nbytes for m in module.buckets.values() for p in m.params.values())
    arenas = [arena_layout(m.plan)[1] for m in module.buckets.values()]
    lines = [f"batch buckets: {', '.join(map(str, module.batch_sizes))} (one plan each; a batch runs on the smallest "
             "bucket that holds it, padded; a larger one is split)",
             f"weights: {len(weights)} constants stored once, {_size(stored)} ({_size(each)} if each bucket kept its own)",
             f"shared buffer (inputs, outputs, memory pool; one bucket runs at a time): {_size(max(arenas))}, the "
             f"largest bucket's need ({_size(sum(arenas))} if each bucket had its own)",
             f"  {'batch':>5s} {'launches':>8s} {'streams':>7s} {'syncs':>5s} {'pool':>10s}  latency"]
    for b, m in module.buckets.items():
        p = m.plan
        choice = m.report.stream_choice
        ms = choice.chosen_ms if choice is not None else None
        latency = f"{ms:.3f} ms ({ms / b * 1000:.1f} us/row)" if ms is not None else "not measured (no GPU here)"
        lines.append(f"  {b:5d} {len(p.launches):8d} {p.num_streams:7d} {sum(len(l.waits) for l in p.launches):5d} "
                     f"{_size(p.memory.get('pool_bytes', 0)):>10s}  {latency}")
    lines.append(f"the largest bucket (batch {module.max_batch}):")
    return lines
