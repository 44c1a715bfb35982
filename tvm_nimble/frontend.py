"""ONNX -> Relax, with one-line errors for the problems people actually hit.

``from_onnx`` wraps ``tvm.relax.frontend.onnx.from_onnx`` (weights folded in as constants,
inference decompositions applied) so the result compiles with
``tvm.compile(mod, target={"kind": "llvm"})`` or goes straight to ``tvm_nimble.build``.
Before TVM sees the model it is checked here, so a bad file, an operator TVM cannot convert,
a dynamic input dim or a wrong ``shape_dict`` is reported as a :class:`~tvm_nimble.errors.NimbleError`
naming the problem and the fix, never as a traceback from deep inside the importer.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from .errors import ModelError, ShapeError, UnsupportedOperatorError

__all__ = ["from_onnx", "load_onnx_model", "unsupported_operators", "supported_operators",
           "fold_static_shapes", "OnnxFileNotFoundError"]

# Domains whose operators the TVM importer converts (it looks converters up by op_type alone;
# the contrib ops it knows, e.g. FastGelu, come from onnxruntime's com.microsoft domain).
_CONVERTIBLE_DOMAINS = ("", "ai.onnx", "com.microsoft")
# Handled by the importer itself rather than through its converter map.
_DIRECT_OPS = frozenset({"If", "Constant"})
_MAX_PROTO_BYTES = 2**31 - 1


class OnnxFileNotFoundError(ModelError, FileNotFoundError):
    """The ONNX file does not exist (also a ``FileNotFoundError``)."""


def _one_line(msg: object, limit: int = 300, whole: bool = False) -> str:
    """An exception message squeezed to one line: its first meaningful line, or (``whole``)
    all of it (the ONNX checker breaks one sentence over several lines)."""
    text = str(msg).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = (" ".join(lines) if whole else lines[0]) if lines else type(msg).__name__
    line = re.sub(r"\s+", " ", line).rstrip(".")
    return line if len(line) <= limit else line[: limit - 3] + "..."


# ---- loading ------------------------------------------------------------------------------
def _parse(data: bytes, label: str) -> onnx.ModelProto:
    if len(data) == 0:
        raise ModelError(f"{label} is not a valid ONNX model (it is empty): re-export it")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # google.protobuf.message.DecodeError, RuntimeWarning, ...
        raise ModelError(f"{label} is not a valid ONNX model (protobuf parse failed: {_one_line(e)}; "
                         f"the file may be truncated or not ONNX at all): re-export it") from None
    _check_parsed(model, label)
    return model


def _check_parsed(model: onnx.ModelProto, label: str) -> None:
    if not model.HasField("graph") or model.ir_version == 0:
        what = "no graph" if not model.HasField("graph") else "no IR version"
        raise ModelError(f"{label} is not a valid ONNX model ({what}; the file may be truncated or not ONNX "
                         f"at all): re-export it")


def load_onnx_model(path_or_model) -> onnx.ModelProto:
    """An ``onnx.ModelProto`` from a file path (str / ``os.PathLike``, external data is loaded
    from beside it), serialized bytes, or a ModelProto (returned as is).

    Raises :class:`OnnxFileNotFoundError` for a missing file and :class:`ModelError` for an
    empty, truncated or malformed one.
    """
    if isinstance(path_or_model, onnx.ModelProto):
        _check_parsed(path_or_model, "the ONNX model")
        return path_or_model
    if isinstance(path_or_model, (bytes, bytearray, memoryview)):
        return _parse(bytes(path_or_model), "the ONNX bytes")
    if not isinstance(path_or_model, (str, os.PathLike)):
        raise ModelError(f"expected an ONNX file path, bytes or onnx.ModelProto, got "
                         f"{type(path_or_model).__name__}: pass one of those")
    path = os.fspath(path_or_model)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not os.path.exists(path):
        raise OnnxFileNotFoundError(f"ONNX file not found: {path}")
    if os.path.isdir(path):
        raise ModelError(f"{path} is a directory, not an ONNX file: pass the path of the .onnx file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelError(f"cannot read ONNX file {path}: {e.strerror or e}: check its permissions") from None
    model = _parse(data, path)
    if _uses_external_data(model):
        try:
            onnx.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
        except Exception as e:
            raise ModelError(f"{path}: cannot load the model's external weight data ({_one_line(e)}): keep the "
                             f"weight files next to the .onnx file") from None
    return model


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


# ---- operators ----------------------------------------------------------------------------
def supported_operators() -> frozenset[str]:
    """ONNX op types the installed TVM's Relax ONNX importer can convert."""
    from tvm.relax.frontend.onnx import onnx_frontend

    get_map = getattr(onnx_frontend, "_get_convert_map", None) or onnx_frontend._get_converter_map
    return frozenset(get_map()) | _DIRECT_OPS


def _walk_nodes(graph: onnx.GraphProto):
    """Nodes of ``graph`` and of the If branches the importer converts with it."""
    for node in graph.node:
        yield node
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from _walk_nodes(attr.g)


def unsupported_operators(model: onnx.ModelProto) -> dict[str, list[str]]:
    """``{op: [node names]}`` for the nodes TVM's ONNX importer cannot convert; an op outside
    the ONNX / com.microsoft domains is named ``domain::OpType``."""
    supported = supported_operators()
    bad: dict[str, list[str]] = {}
    for node in _walk_nodes(model.graph):
        if node.op_type in supported and node.domain in _CONVERTIBLE_DOMAINS:
            continue
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        bad.setdefault(key, []).append(node.name or "<unnamed>")
    return bad


def _check_operators(model: onnx.ModelProto, label: str) -> None:
    bad = unsupported_operators(model)
    if not bad:
        return
    import tvm

    parts = [f"{op} ({len(names)} node{'s' if len(names) > 1 else ''}, e.g. {names[0]!r})"
             for op, names in sorted(bad.items())]
    funcs = {f.name for f in model.functions}
    them = "them" if len(bad) > 1 else "it"
    hint = (f"replace {them} with supported ONNX ops (re-export with another opset or decompose {them}), "
            "or run that part of the model outside TVM")
    if funcs & {op.split("::")[-1] for op in bad}:
        hint = "inline the model's local functions (onnx.inliner.inline_local_functions) or " + hint
    raise UnsupportedOperatorError(
        f"{label} uses {len(bad)} operator type{'s' if len(bad) > 1 else ''} that TVM {tvm.__version__}'s ONNX "
        f"importer does not support: {', '.join(parts)}: {hint}")


# ---- checker ------------------------------------------------------------------------------
def _check_model(model: onnx.ModelProto, label: str, path: str | None) -> None:
    try:
        if model.ByteSize() > _MAX_PROTO_BYTES:
            if path is None:
                return  # too large for the in-memory checker; the importer will still validate it
            onnx.checker.check_model(path)
        else:
            onnx.checker.check_model(model)
    except Exception as e:  # onnx.checker.ValidationError and friends
        raise ModelError(f"{label} fails the ONNX checker: {_one_line(e, whole=True)}: fix the model or re-export it") from None


# ---- inputs and shapes --------------------------------------------------------------------
def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _dims(vi: onnx.ValueInfoProto):
    """Declared dims (int, or the dim_param string / None when dynamic); None for unknown rank."""
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
            for d in tt.shape.dim]


def _example(inputs: list[onnx.ValueInfoProto], shape_dict: Mapping) -> str:
    """A ready-to-paste shape_dict: the model's static dims, 1 for dynamic ones."""
    ex = {}
    for vi in inputs:
        if vi.name in shape_dict:
            ex[vi.name] = tuple(int(d) for d in shape_dict[vi.name])
            continue
        dims = _dims(vi)
        ex[vi.name] = (1, 3, 224, 224) if dims is None else tuple(d if isinstance(d, int) else 1 for d in dims)
    return "{" + ", ".join(f"{k!r}: {v}" for k, v in ex.items()) + "}"


def _normalize_shape_dict(shape_dict, inputs: list[onnx.ValueInfoProto]) -> dict[str, tuple[int, ...]]:
    if shape_dict is None:
        return {}
    names = [vi.name for vi in inputs]
    if not isinstance(shape_dict, Mapping):
        raise ShapeError(f"shape_dict must map input names to shapes, e.g. shape_dict={_example(inputs, {})}, "
                         f"got {type(shape_dict).__name__}")
    unknown = [k for k in shape_dict if k not in names]
    if unknown:
        raise ShapeError(f"shape_dict names input{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(k) for k in unknown)} that the model does not have: its inputs are "
                         f"{', '.join(repr(n) for n in names) or '(none)'}")
    out = {}
    for vi in inputs:
        if vi.name not in shape_dict:
            continue
        shape = shape_dict[vi.name]
        ok = isinstance(shape, Sequence) and not isinstance(shape, (str, bytes)) or isinstance(shape, np.ndarray)
        if ok:
            shape = tuple(shape)
            ok = all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shape)
        if not ok:
            raise ShapeError(f"shape_dict[{vi.name!r}] = {shape!r} is not a static shape: give positive ints, "
                             f"e.g. shape_dict={_example(inputs, {})}")
        shape = tuple(int(d) for d in shape)
        dims = _dims(vi)
        if dims is not None and len(dims) != len(shape):
            raise ShapeError(f"shape_dict[{vi.name!r}] = {shape} has rank {len(shape)} but input {vi.name!r} has "
                             f"rank {len(dims)} ({_fmt_dims(dims)}): give a shape of rank {len(dims)}")
        if dims is not None:
            clash = [(i, d, s) for i, (d, s) in enumerate(zip(dims, shape)) if isinstance(d, int) and d != s]
            if clash:
                i, d, s = clash[0]
                warnings.warn(f"shape_dict[{vi.name!r}] overrides the model's static dim {i} ({d} -> {s}); "
                              f"the import may fail if the graph depends on it", stacklevel=3)
        out[vi.name] = shape
    return out


def _fmt_dims(dims) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


def _check_static_inputs(inputs: list[onnx.ValueInfoProto], shape_dict: dict) -> None:
    problems = []
    for vi in inputs:
        if vi.name in shape_dict or not vi.type.HasField("tensor_type"):
            continue  # (sequence / optional inputs are left to the importer)
        dims = _dims(vi)
        if dims is None:
            problems.append(f"input {vi.name!r} has unknown rank")
            continue
        dyn = [f"dim {i} ({d!r})" if d else f"dim {i} (unknown)" for i, d in enumerate(dims) if not isinstance(d, int)]
        if dyn:
            problems.append(f"input {vi.name!r} {_fmt_dims(dims)} has dynamic {', '.join(dyn)}")
    if problems:
        raise ShapeError(f"{'; '.join(problems)}: tvm-nimble needs static shapes, pass them as "
                         f"shape_dict={_example(inputs, shape_dict)}")


# ---- folding shape computations --------------------------------------------------------
# Exporters leave shape arithmetic in the graph even when every shape is static: torch's
# F.pad with computed pads (timm's "same" padding, e.g. nasnetalarge) becomes
# Shape -> Gather -> Sub -> ConstantOfShape -> Concat -> Reshape(-1, 2) -> ... -> Pad.
# TVM 0.27's importer turns such a chain into tensor ops whose shapes it cannot see (a
# ConstantOfShape fed by a computed tensor has no known shape) and then fails on the Reshape
# ("Reshape expects the input tensor to have known shape") or on the Pad ("Dynamic pads are not
# supported"). Since tvm-nimble imports static shapes only, such chains are evaluated here
# instead: Shape / Size of a statically shaped tensor and any small node whose inputs are all
# constants become Constant nodes, repeating with ONNX shape inference until nothing changes.
_FOLD_MAX_ELEMENTS = 1 << 16  # shape arithmetic is tiny; larger constant work is left to TVM
_FOLD_MAX_ROUNDS = 64
_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_NO_FOLD_OPS = frozenset({"Constant", "RandomNormal", "RandomNormalLike", "RandomUniform",
                          "RandomUniformLike", "Multinomial", "Bernoulli", "If", "Loop", "Scan"})


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
        dims = _dims(vi)
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


def fold_static_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its static shape computations folded to Constant nodes (see above).

    Only top-level nodes of the default ONNX domain fold: ``Shape`` / ``Size`` of a tensor with
    a fully static (inferred) shape, and deterministic nodes whose inputs are all constants and
    at most ``_FOLD_MAX_ELEMENTS`` elements in and out, evaluated with ``onnx.reference``.
    Returns ``model`` itself when nothing folds; a failure while folding leaves the model as it
    was (the importer then reports what it makes of it).
    """
    try:
        return _fold_static_shapes(model)
    except Exception:  # noqa: BLE001  (best effort: never worse than importing the model as is)
        return model


def _fold_static_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        return model
    numel = lambda dims: int(np.prod(dims, dtype=np.int64))  # noqa: E731
    big_inits = {t.name for t in g.initializer if numel(t.dims) > _FOLD_MAX_ELEMENTS}
    known: dict[str, np.ndarray] = {}  # small constant values: initializers and Constant nodes
    for t in g.initializer:
        if t.name not in big_inits and t.data_location != onnx.TensorProto.EXTERNAL:
            known[t.name] = onnx.numpy_helper.to_array(t)
    for node in g.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            if any(a.name == "value" and numel(a.t.dims) > _FOLD_MAX_ELEMENTS for a in node.attribute):
                continue  # a weight: not read into memory here
            try:
                value = np.asarray(ReferenceEvaluator(node, opsets={"": opset}).run(None, {})[0])
            except Exception:  # noqa: BLE001
                continue
            if value.size <= _FOLD_MAX_ELEMENTS:
                known[node.output[0]] = value
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
                    value = np.array(numel(dims), dtype=np.int64)
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
                    if numel(known[node.input[0]].astype(np.int64)) > _FOLD_MAX_ELEMENTS:
                        continue
                elif op in ("Expand", "Tile", "Range", "Resize", "Upsample", "OneHot", "EyeLike"):
                    if shapes is None:
                        shapes = _static_shapes(model, folded, big_inits)
                    if shapes.get(node.output[0]) is None or numel(shapes[node.output[0]]) > _FOLD_MAX_ELEMENTS:
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
    return _replace_folded(model, folded, set(known))


def _replace_folded(model: onnx.ModelProto, folded: Mapping[str, np.ndarray], known: set) -> onnx.ModelProto:
    """A copy of ``model`` whose folded nodes are replaced by Constant nodes for the values
    something still reads; the Constant and Identity nodes of known values that nothing reads
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
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(consts + kept)
    # stale annotations of values that are now constants are dropped (the importer reads values)
    keep_vi = [vi for vi in out.graph.value_info if vi.name not in folded]
    del out.graph.value_info[:]
    out.graph.value_info.extend(keep_vi)
    return out


# ---- import -------------------------------------------------------------------------------
def from_onnx(path_or_model, shape_dict: Mapping[str, Sequence[int]] | None = None):
    """Import an ONNX model (file path, bytes or ModelProto) as a Relax ``tvm.IRModule``.

    ``shape_dict`` (``{"input": (1, 3, 224, 224)}``) fixes the shapes of inputs with dynamic
    dims. Weights become constants and inference-only decompositions (batch norm, ...) are
    applied, so ``tvm.compile(mod, target={"kind": "llvm"})`` works on the result.

    Raises :class:`~tvm_nimble.errors.ModelError` (missing / malformed file, checker failure,
    importer failure), :class:`~tvm_nimble.errors.UnsupportedOperatorError` (naming every op
    type TVM cannot convert) or :class:`~tvm_nimble.errors.ShapeError` (dynamic input dims,
    bad ``shape_dict``).
    """
    path = None
    if isinstance(path_or_model, (str, os.PathLike)):
        path = os.fsdecode(os.fspath(path_or_model))
        label = path
    else:
        label = "the ONNX model"
    model = load_onnx_model(path_or_model)

    if len(model.functions):
        try:  # the importer does not expand model-local functions: inline them first
            from onnx import inliner

            model = inliner.inline_local_functions(model)
        except Exception:  # noqa: BLE001  (the operator check below reports what remains)
            pass

    _check_operators(model, label)
    inputs = _graph_inputs(model)
    shapes = _normalize_shape_dict(shape_dict, inputs)
    _check_static_inputs(inputs, shapes)
    if shapes:  # check and import the model with its inputs fixed (the checker insists on input shapes)
        model = _with_input_shapes(model, shapes)
        path = None
    _check_model(model, label, path)
    return _import(fold_static_shapes(model), shapes, label)


def _with_input_shapes(model: onnx.ModelProto, shapes: dict) -> onnx.ModelProto:
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        if vi.name in shapes and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
            vi.type.tensor_type.shape.SetInParent()  # present even for a rank-0 shape
            for d in shapes[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = d
    return fixed


def _import(model: onnx.ModelProto, shapes: dict, label: str):
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

    printed = io.StringIO()
    try:
        # on a failure the importer prints "Error converting operator <op>, with inputs: <IR>"
        # to stdout: keep that out of the user's terminal, but use it to name the operator
        with contextlib.redirect_stdout(printed):
            mod = tvm_from_onnx(model, shape_dict=shapes or None, keep_params_in_input=False)
    except Exception as e:  # noqa: BLE001  (anything from deep inside the importer)
        m = re.search(r"Error converting operator (\S+?),", printed.getvalue())
        where = f" while converting a {m.group(1)} node" if m else ""
        raise ModelError(f"TVM {tvm.__version__}'s ONNX importer failed on {label}{where}: {type(e).__name__}: "
                         f"{_one_line(e)}: simplify or re-export the model (e.g. onnxsim, another opset)") from e
    try:
        mod = relax.transform.DecomposeOpsForInference()(mod)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"TVM could not prepare {label} for inference (DecomposeOpsForInference): "
                         f"{_one_line(e)}: simplify or re-export the model") from e
    return mod
