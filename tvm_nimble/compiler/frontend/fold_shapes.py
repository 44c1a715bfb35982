"""Fold static shape computations out of an ONNX graph before TVM's importer sees it.

Exporters leave shape arithmetic in the graph even when every shape is static: torch's
F.pad with computed pads (timm's "same" padding, e.g. nasnetalarge) becomes
Shape -> Gather -> Sub -> ConstantOfShape -> Concat -> Reshape(-1, 2) -> ... -> Pad.
TVM 0.27's importer turns such a chain into tensor ops whose shapes it cannot see (a
ConstantOfShape fed by a computed tensor has no known shape) and then fails on the Reshape
("Reshape expects the input tensor to have known shape") or on the Pad ("Dynamic pads are not
supported"). Since tvm-nimble imports static shapes only, such chains are evaluated here
instead: Shape / Size of a statically shaped tensor and any small node whose inputs are all
constants become Constant nodes, repeating with ONNX shape inference until nothing changes.
An If whose condition folds to a constant (exporters branch on static shapes too) is replaced by
the branch it takes: a Nimble plan cannot branch, and a Relax If is what TVM would make of it.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

_FOLD_MAX_ELEMENTS = 1 << 16  # shape arithmetic is tiny; larger constant work is left to TVM
_FOLD_MAX_ROUNDS = 64
_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_NO_FOLD_OPS = frozenset({"Constant", "RandomNormal", "RandomNormalLike", "RandomUniform",
                          "RandomUniformLike", "Multinomial", "Bernoulli", "If", "Loop", "Scan"})


def with_nodes(model: onnx.ModelProto, nodes, in_place: bool, dropped_value_info=frozenset()) -> onnx.ModelProto:
    """``model`` with ``nodes`` (copied first: they may be ``model``'s own) as its graph's nodes, and the value_info
    of ``dropped_value_info`` left out: a copy of ``model``, or with ``in_place`` ``model`` itself, changed. The
    ONNX-level folds change a few nodes of a graph whose bytes are mostly initializers: a copy of a 0.5B-parameter
    decoder's is 2 GB, seconds a fold, so the import folds its own copy in place."""
    new = []
    for n in nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        new.append(copy)
    out = model
    if not in_place:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(new)
    if dropped_value_info:
        keep = [vi for vi in out.graph.value_info if vi.name not in dropped_value_info]
        del out.graph.value_info[:]
        out.graph.value_info.extend(keep)
    return out


def declared_dims(vi: onnx.ValueInfoProto):
    """Declared dims (int, or the dim_param string / None when dynamic); None for unknown rank."""
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
            for d in tt.shape.dim]


def _static_shapes(model: onnx.ModelProto, consts: Mapping, big_inits) -> dict[str, tuple[int, ...]]:
    """Fully static shapes of the graph's values by ONNX shape inference, run on a copy that
    carries the known small constants as initializers and the large weights only as typed inputs."""
    g = model.graph
    small = [t for t in g.initializer if t.name not in big_inits]
    small_names = {t.name for t in small}
    folded = [onnx.numpy_helper.from_array(v, k) for k, v in consts.items() if k not in small_names]
    big = [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
           for t in g.initializer if t.name in big_inits]
    graph = onnx.helper.make_graph([n for n in g.node if not any(o in consts for o in n.output)], g.name,
                                   [vi for vi in g.input if vi.name not in big_inits] + big, list(g.output),
                                   small + folded, value_info=list(g.value_info))
    probe = onnx.helper.make_model(graph, opset_imports=list(model.opset_import),
                                   ir_version=max(model.ir_version, 4))
    try:
        probe = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001  (no shapes then: only constants fold)
        pass
    shapes = {}
    for vi in [*probe.graph.input, *probe.graph.value_info, *probe.graph.output]:
        dims = declared_dims(vi)
        if dims is not None and all(isinstance(d, int) for d in dims):
            shapes[vi.name] = tuple(dims)
    for t in g.initializer:
        shapes[t.name] = tuple(t.dims)
    return shapes


def _subgraph_inputs(node: onnx.NodeProto):
    """Names a node's subgraphs (If / Loop / Scan bodies) read, outer-scope values among them."""
    for attr in node.attribute:
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else
                    list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []):
            for n in sub.node:
                yield from n.input
                yield from _subgraph_inputs(n)
            yield from (o.name for o in sub.output)


def fold_static_shapes(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto:
    """``model`` with its static shape computations folded to Constant nodes (see above).

    Only top-level nodes of the default ONNX domain fold: ``Shape`` / ``Size`` of a tensor with
    a fully static (inferred) shape, and deterministic nodes whose inputs are all constants and
    at most ``_FOLD_MAX_ELEMENTS`` elements in and out, evaluated with ``onnx.reference``.
    Returns ``model`` itself when nothing folds, else a copy (``in_place``: ``model``, changed); a
    failure while folding leaves the model as it was (the importer then reports what it makes of
    it): every value is computed before the nodes are replaced.
    """
    try:
        folded, owned = model, in_place
        for _ in range(_FOLD_MAX_ROUNDS):  # a branch taken may hold more to fold, and decide more Ifs
            step = _fold_static_shapes(folded, owned)
            owned, folded = owned or step is not folded, step
            taken = _inline_decided_ifs(folded, owned)
            if taken is None:
                break
            owned, folded = owned or taken is not folded, taken
        return folded
    except Exception:  # noqa: BLE001  (best effort: never worse than importing the model as is)
        return model


def _inline_decided_ifs(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto | None:
    """A copy of ``model`` whose top-level If nodes with a constant condition are replaced by the nodes of
    the branch taken (its initializers as Constant nodes, its outputs renamed through Identity nodes);
    None when there is none. A branch defining a name the graph defines too is left alone."""
    g = model.graph
    consts = {t.name: t for t in g.initializer}
    consts.update({n.output[0]: a.t for n in g.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                   for a in n.attribute if a.name == "value"})
    defined = {t.name for t in g.initializer} | {i.name for i in g.input} | {o for n in g.node for o in n.output}
    nodes, changed = [], False
    for node in g.node:
        cond = consts.get(node.input[0]) if node.op_type == "If" and node.domain in ("", "ai.onnx") else None
        if cond is None or int(np.prod(cond.dims, dtype=np.int64)) != 1 or "" in node.output:
            nodes.append(node)
            continue
        taken = bool(onnx.numpy_helper.to_array(cond).reshape(-1)[0])
        branch = next(a.g for a in node.attribute if a.name == ("then_branch" if taken else "else_branch"))
        if ({t.name for t in branch.initializer} | {o for n in branch.node for o in n.output}) & defined:
            nodes.append(node)
            continue
        nodes += [onnx.helper.make_node("Constant", [], [t.name], value=t) for t in branch.initializer]
        nodes += list(branch.node)
        nodes += [onnx.helper.make_node("Identity", [b.name], [o], name=f"{node.name or 'If'}/{o}")
                  for b, o in zip(branch.output, node.output)]
        changed = True
    if not changed:
        return None
    return with_nodes(model, nodes, in_place)


def _numel(dims) -> int:
    return int(np.prod(dims, dtype=np.int64))


def small_constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The values of the top-level initializers and Constant nodes of at most ``_FOLD_MAX_ELEMENTS`` elements, by
    name (shapes, pads, axes: what folding reads); weights are not read into memory."""
    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    known: dict[str, np.ndarray] = {}
    for t in g.initializer:
        if _numel(t.dims) <= _FOLD_MAX_ELEMENTS and t.data_location != onnx.TensorProto.EXTERNAL:
            known[t.name] = onnx.numpy_helper.to_array(t)
    if opset is None:
        return known
    from onnx.reference import ReferenceEvaluator

    for node in g.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            if any(a.name == "value" and _numel(a.t.dims) > _FOLD_MAX_ELEMENTS for a in node.attribute):
                continue  # a weight: not read into memory here
            try:
                value = np.asarray(ReferenceEvaluator(node, opsets={"": opset}).run(None, {})[0])
            except Exception:  # noqa: BLE001
                continue
            if value.size <= _FOLD_MAX_ELEMENTS:
                known[node.output[0]] = value
    return known


def _fold_static_shapes(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto:
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        return model
    big_inits = {t.name for t in g.initializer if _numel(t.dims) > _FOLD_MAX_ELEMENTS}
    known = small_constants(model)  # small constant values: initializers and Constant nodes
    folded: dict[str, np.ndarray] = {}  # values computed here (their nodes are dropped)
    for _ in range(_FOLD_MAX_ROUNDS):
        shapes = None
        progress = False
        for node in g.node:
            if any(o in folded for o in node.output) or node.domain not in ("", "ai.onnx"):
                continue
            op = node.op_type
            if op == "Identity":  # an alias: kept (dropped below if nothing reads it any more)
                if node.output[0] not in known and node.input[0] in known:
                    known[node.output[0]] = known[node.input[0]]
                    progress = True
                continue
            if op in ("Shape", "Size"):
                if shapes is None:
                    shapes = _static_shapes(model, folded, big_inits)
                src = node.input[0]
                dims = known[src].shape if src in known else shapes.get(src)
                if dims is None:
                    continue
                if op == "Size":
                    value = np.array(_numel(dims), dtype=np.int64)
                else:
                    attrs = {a.name: a.i for a in node.attribute}  # Shape-15 start / end slice the dims
                    value = np.array(list(dims)[attrs.get("start", 0):attrs.get("end", len(dims))], dtype=np.int64)
                outs = [value]
            else:
                ins = [i for i in node.input if i]
                if (op in _NO_FOLD_OPS or not ins or any(i not in known for i in ins)
                        or any(a.type in _GRAPH_ATTRS for a in node.attribute)):
                    continue
                if op == "ConstantOfShape":  # the output can be much larger than the inputs: bound it first
                    if _numel(known[node.input[0]].astype(np.int64)) > _FOLD_MAX_ELEMENTS:
                        continue
                elif op in ("Expand", "Tile", "Range", "Resize", "Upsample", "OneHot", "EyeLike"):
                    if shapes is None:
                        shapes = _static_shapes(model, folded, big_inits)
                    if shapes.get(node.output[0]) is None or _numel(shapes[node.output[0]]) > _FOLD_MAX_ELEMENTS:
                        continue
                try:
                    outs = ReferenceEvaluator(node, opsets={"": opset}).run(
                        None, {i: known[i] for i in ins})
                except Exception:  # noqa: BLE001  (left to the importer)
                    continue
                if len(outs) != len([o for o in node.output if o]):
                    continue
                if not all(isinstance(v, (np.ndarray, np.generic)) for v in outs):
                    continue  # sequences, optionals
                outs = [np.asarray(v) for v in outs]
                if any(v.size > _FOLD_MAX_ELEMENTS for v in outs):
                    continue
                try:  # a dtype a TensorProto cannot hold stays in the graph
                    for v in outs:
                        onnx.helper.np_dtype_to_tensor_dtype(v.dtype)
                except Exception:  # noqa: BLE001
                    continue
            for name, value in zip([o for o in node.output if o], outs):
                known[name] = folded[name] = value
            progress = True
        if not progress:
            break
    if not folded:
        return model
    return _replace_folded(model, folded, set(known), in_place)


def _replace_folded(model: onnx.ModelProto, folded: Mapping[str, np.ndarray], known: set,
                    in_place: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` (``in_place``: ``model``, changed) whose folded nodes are replaced by Constant nodes for
    the values something still reads; the Constant and Identity nodes of known values that nothing reads
    any more are dropped."""
    g = model.graph
    kept = [n for n in g.node if not any(o in folded for o in n.output)]
    while True:
        used = {o.name for o in g.output}
        for n in kept:
            used.update(n.input)
            used.update(_subgraph_inputs(n))
        dead = [n for n in kept if all(o in known for o in n.output) and not any(o in used for o in n.output)]
        if not dead:
            break
        dead_ids = {id(n) for n in dead}
        kept = [n for n in kept if id(n) not in dead_ids]
    consts = [onnx.helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value, name))
              for name, value in folded.items() if name in used]
    # stale annotations of values that are now constants are dropped (the importer reads values)
    return with_nodes(model, consts + kept, in_place, dropped_value_info=frozenset(folded))
