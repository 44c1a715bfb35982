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

from tvm_nimble.errors import ModelError, ShapeError, UnsupportedOperatorError
from tvm_nimble.relay_passes.tvm_compat import onnx_converter_map
from tvm_nimble.runtime.buckets import BATCH

from .fold_pads import fold_pads
from .fold_powers import fold_powers
from .fold_shapes import declared_dims, fold_static_shapes

__all__ = ["from_onnx", "load_onnx_model", "unsupported_operators", "supported_operators",
           "max_supported_opset", "fold_static_shapes", "OnnxFileNotFoundError"]

# Domains whose operators the TVM importer converts (it looks converters up by op_type alone;
# the contrib ops it knows, e.g. FastGelu, come from onnxruntime's com.microsoft domain).
_CONVERTIBLE_DOMAINS = ("", "ai.onnx", "com.microsoft")
# Handled by the importer itself rather than through its converter map.
_DIRECT_OPS = frozenset({"If", "Constant"})
_IN_MEMORY_CHECK_BYTES = 2**30  # see fits_in_memory_checks


class OnnxFileNotFoundError(ModelError, FileNotFoundError):
    """The ONNX file does not exist (also a ``FileNotFoundError``)."""


def one_line(msg: object, limit: int = 300, whole: bool = False) -> str:
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
        raise ModelError(f"{label} is not a valid ONNX model (protobuf parse failed: {one_line(e)}; "
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
            raise ModelError(f"{path}: cannot load the model's external weight data ({one_line(e)}): keep the "
                             f"weight files next to the .onnx file") from None
    return model


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


# ---- operators ----------------------------------------------------------------------------
def supported_operators() -> frozenset[str]:
    """ONNX op types the installed TVM's Relax ONNX importer can convert."""
    return frozenset(onnx_converter_map()) | _DIRECT_OPS


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
    if {"Loop", "Scan"} & set(bad):  # control flow: no other opset helps, the exporter must unroll it
        hint = ("export the model with static control flow (unroll the loop: trace it with fixed sizes, e.g. "
                "torch.onnx.export without torch.jit.script), or " + hint)
    if funcs & {op.split("::")[-1] for op in bad}:
        hint = "inline the model's local functions (onnx.inliner.inline_local_functions) or " + hint
    raise UnsupportedOperatorError(
        f"{label} uses {len(bad)} operator type{'s' if len(bad) > 1 else ''} that TVM {tvm.__version__}'s ONNX "
        f"importer does not support: {', '.join(parts)}: {hint}")


#: operators whose output shape depends on input values: never static
_DATA_DEPENDENT = frozenset({"NonZero", "NonMaxSuppression", "Unique", "Compress", "StringSplit"})
#: operators whose output shape is set by one of their inputs (index): static only when it is a constant
_SHAPE_INPUT = {"TopK": 1, "Range": 0, "Expand": 1, "Tile": 1}


def _check_data_dependent_shapes(model: onnx.ModelProto, label: str) -> None:
    """Operators whose output shape depends on run-time values, every one named before TVM's legalization fails
    on them (after static shape computations are folded, so shapes computed from static shapes pass)."""
    constants = {t.name for t in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    dynamic: dict[str, list[str]] = {}
    for node in _walk_nodes(model.graph):
        k = _SHAPE_INPUT.get(node.op_type)
        if node.op_type in _DATA_DEPENDENT or (
                k is not None and len(node.input) > k and node.input[k] and node.input[k] not in constants):
            dynamic.setdefault(node.op_type, []).append(node.name or "<unnamed>")
    if dynamic:
        named = ", ".join(f"{op} (node {names[0]!r})" if len(names) == 1 else
                          f"{op} ({len(names)} nodes, e.g. {names[0]!r})" for op, names in dynamic.items())
        several = len(dynamic) > 1
        raise ShapeError(f"{label}: operator{'s' if several else ''} {named} produce{'' if several else 's'} a "
                         "shape that depends on the input's values; tvm-nimble needs static shapes: move that part "
                         "of the model out of the graph, or make its shape input a constant")


def _check_control_flow(model: onnx.ModelProto, label: str) -> None:
    """An If still in the graph once static shapes are folded (which inlines an If whose condition folds)
    branches on a value computed at run time.
    TVM imports it (as a Relax If bound to an internal name such as gv4), but a Nimble plan is one fixed
    sequence of launches, replayed as one CUDA graph: name the node before that name is all there is."""
    for node in _walk_nodes(model.graph):
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            raise UnsupportedOperatorError(
                f"{label}: ONNX If node {node.name or '<unnamed>'!r} branches on {node.input[0]!r}, which is not a "
                "constant once static shapes are folded (it depends on the input values); tvm-nimble builds one "
                "fixed sequence of kernels and cannot branch: export the model with static control flow (no "
                "data-dependent `if` in forward), or make the condition a constant (e.g. onnxsim for the input "
                "shapes you deploy)")


def max_supported_opset() -> int:
    """The newest ONNX opset the installed TVM's importer has converters for: the highest version among its
    converters' ``_impl_vN`` (it picks, per operator, the newest implementation not above the model's opset)."""
    versions = [int(m.group(1)) for conv in onnx_converter_map().values() for name in dir(conv)
                if (m := re.fullmatch(r"_impl_v(\d+)", name))]
    return max(versions, default=1)


def _check_opset(model: onnx.ModelProto, label: str) -> None:
    """Warn (one line) about a default-domain opset newer than the importer knows: it converts every node with
    its newest older converter, which is wrong wherever an operator changed meaning since."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    newest = max_supported_opset()
    if opset is not None and opset > newest:
        import tvm

        warnings.warn(f"{label} declares ONNX opset {opset}, newer than TVM {tvm.__version__}'s importer knows "
                      f"(up to opset {newest}): operators that changed since are converted by their opset-{newest} "
                      f"rules; export with opset_version={newest} (or convert with onnx.version_converter) to be "
                      "sure", stacklevel=3)


# ---- checker ------------------------------------------------------------------------------
def fits_in_memory_checks(model: onnx.ModelProto, limit: int = _IN_MEMORY_CHECK_BYTES) -> bool:
    """Whether ``model`` serializes in memory below ``limit`` bytes (the in-memory ONNX checker, ONNX Runtime's
    session from bytes). Protobuf cannot serialize a message over its 2 GB limit (it raises "Failed to serialize
    proto": a 0.5B-parameter decoder in float32, its weights loaded from external data); such a model is checked from
    its file, or by the importer."""
    return _serialized_in_memory(model, limit) is not None


def _initializer_bytes(model: onnx.ModelProto) -> int:
    """The bytes of ``model``'s initializers as their dims and element types give them (no data is read)."""
    total = 0
    for t in model.graph.initializer:
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except (KeyError, TypeError, ValueError):  # a type numpy has no dtype for: sized at one byte an element
            itemsize = 1
        n = 1
        for d in t.dims:
            n *= int(d)
        total += n * itemsize
    return total


def _serialized_in_memory(model: onnx.ModelProto, limit: int = _IN_MEMORY_CHECK_BYTES) -> bytes | None:
    """``model`` serialized when that is below ``limit`` bytes, else None (:func:`fits_in_memory_checks`); the
    import's checker reads these bytes: the model serialized once, where sizing it and checking it took twice."""
    if _initializer_bytes(model) >= limit:  # the weights alone, from their shapes (serializing walks the bytes)
        return None
    try:
        data = model.SerializeToString()
    except Exception:  # noqa: BLE001  (protobuf's EncodeError, by implementation: over its 2 GB limit)
        return None
    return data if len(data) < limit else None


def _check_model(model: onnx.ModelProto, label: str, path: str | None) -> None:
    try:
        data = _serialized_in_memory(model)
        if data is None:
            if path is None:
                return  # too large for the in-memory checker; the importer will still validate it
            onnx.checker.check_model(path)
        else:
            onnx.checker.check_model(data)
    except Exception as e:  # onnx.checker.ValidationError and friends
        raise ModelError(f"{label} fails the ONNX checker: {one_line(e, whole=True)}: fix the model or re-export it") from None


# ---- inputs and shapes --------------------------------------------------------------------
def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


#: what an example shape shows for a dim the model declares as 0 or negative: the real size is not known
_REAL_SIZE = "N"


def _invalid_dims(vi: onnx.ValueInfoProto) -> dict[int, int]:
    """{index: value} of the dims ``vi`` declares as 0 or negative: not a size, and not how ONNX says "unknown"
    (a dim_param, or no value at all), so neither static nor dynamic."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return {}
    return {i: int(d.dim_value) for i, d in enumerate(vi.type.tensor_type.shape.dim)
            if d.HasField("dim_value") and d.dim_value <= 0}


def _example_shapes(inputs: list[onnx.ValueInfoProto], shape_dict: Mapping) -> dict[str, tuple[int | str, ...]]:
    """Ready-to-use static shapes: the given ones, else the model's static dims with 1 for dynamic ones
    (and ``N`` for a declared 0 or negative dim, whose real size only the user knows)."""
    ex = {}
    for vi in inputs:
        if vi.name in shape_dict:
            ex[vi.name] = tuple(int(d) for d in shape_dict[vi.name])
            continue
        dims, invalid = declared_dims(vi), _invalid_dims(vi)
        ex[vi.name] = (1, 3, 224, 224) if dims is None else tuple(
            _REAL_SIZE if i in invalid else d if isinstance(d, int) else 1 for i, d in enumerate(dims))
    return ex


def _example(inputs: list[onnx.ValueInfoProto], shape_dict: Mapping) -> str:
    """A ready-to-paste shape_dict."""
    def tup(dims):
        return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"

    return "{" + ", ".join(f"{k!r}: {tup(v)}" for k, v in _example_shapes(inputs, shape_dict).items()) + "}"


def _example_flags(inputs: list[onnx.ValueInfoProto], shape_dict: Mapping) -> str:
    """The same example as ``--shape NAME=D1,D2,...`` flags."""
    return " ".join(f"--shape {k}={','.join(str(d) for d in v)}" for k, v in _example_shapes(inputs, shape_dict).items())


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
            ok = all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape)
        if not ok:
            raise ShapeError(f"shape_dict[{vi.name!r}] = {shape!r} is not a static shape: give positive ints, "
                             f"e.g. shape_dict={_example(inputs, {})}")
        bad = [(i, int(d)) for i, d in enumerate(shape) if d <= 0]
        if bad:
            raise ShapeError(f"shape_dict[{vi.name!r}] = {tuple(int(d) for d in shape)} has dim {bad[0][0]} = "
                             f"{bad[0][1]}, which is not a valid size (dimensions must be positive): give the "
                             "input's real shape")
        shape = tuple(int(d) for d in shape)
        dims = declared_dims(vi)
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
    """Every input not in ``shape_dict`` must declare a static shape; one line naming each that does not: a
    dynamic dim (a dim_param or no value, fixed with ``shape_dict``) or an invalid one (0 or negative, which
    the model's exporter wrote and only the user can replace with the real size)."""
    problems, invalid_any = [], False
    for vi in inputs:
        if vi.name in shape_dict or not vi.type.HasField("tensor_type"):
            continue  # (sequence / optional inputs are left to the importer)
        dims = declared_dims(vi)
        if dims is None:
            problems.append(f"input {vi.name!r} has unknown rank")
            continue
        invalid = _invalid_dims(vi)
        shown = _fmt_dims([invalid.get(i, d) for i, d in enumerate(dims)])
        dyn = [f"dim {i} ({d!r})" if d else f"dim {i} (unknown)" for i, d in enumerate(dims)
               if not isinstance(d, int) and i not in invalid]
        what = ([f"declares {', '.join(f'dim {i} as {v}' for i, v in invalid.items())}, not a valid size "
                 "(dimensions must be positive)"] if invalid else []) + ([f"has dynamic {', '.join(dyn)}"] if dyn else [])
        if what:
            invalid_any = invalid_any or bool(invalid)
            problems.append(f"input {vi.name!r} {shown} {', and '.join(what)}")
    if problems:
        real = (f", with {_REAL_SIZE} the real size (or re-export the model with positive dims)"
                if invalid_any else "")
        raise ShapeError(f"{'; '.join(problems)}: tvm-nimble needs static shapes, pass them as "
                         f"shape_dict={_example(inputs, shape_dict)} (on the command line: "
                         f"{_example_flags(inputs, shape_dict)}){real}")


# ---- import -------------------------------------------------------------------------------
def from_onnx(path_or_model, shape_dict: Mapping[str, Sequence[int]] | None = None, keep_params_in_input: bool = False,
              check: bool = True):
    """Import an ONNX model (file path, bytes or ModelProto) as a Relax ``tvm.IRModule``.

    ``shape_dict`` (``{"input": (1, 3, 224, 224)}``) fixes the shapes of inputs with dynamic
    dims. Weights become constants and inference-only decompositions (batch norm, ...) are
    applied, so ``tvm.compile(mod, target={"kind": "llvm"})`` works on the result.

    Raises :class:`~tvm_nimble.errors.ModelError` (missing / malformed file, checker failure,
    importer failure), :class:`~tvm_nimble.errors.UnsupportedOperatorError` (naming every op
    type TVM cannot convert) or :class:`~tvm_nimble.errors.ShapeError` (dynamic input dims,
    bad ``shape_dict``). ``keep_params_in_input`` makes the weights parameters of ``main`` after the
    model's inputs (their values in ``main.attrs["params"]``), as training needs. ``check=False`` leaves out
    the ONNX checker, for a model checked already (a generator imports one export once per step, with other shapes).
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

    _check_opset(model, label)
    _check_operators(model, label)
    inputs = _graph_inputs(model)
    shapes = _normalize_shape_dict(shape_dict, inputs)
    _check_static_inputs(inputs, shapes)
    if shapes:  # check and import the model with its inputs fixed (the checker insists on input shapes)
        model = _with_input_shapes(model, shapes)
        path = None
    if check:
        _check_model(model, label, path)
    # a Pad's amounts are often shape arithmetic: folded first. Each fold copies the model where it changes one
    # the caller gave (its initializers too), and changes the copy in place after that
    owned = bool(shapes)  # _with_input_shapes made this copy
    folded = model
    for fold in (fold_static_shapes, fold_pads, fold_powers):
        step = fold(folded, in_place=owned)
        owned, folded = owned or step is not folded, step
    _check_data_dependent_shapes(folded, label)
    _check_control_flow(folded, label)
    return _import(folded, shapes, label, keep_params_in_input)


def with_shapes(model, shapes: dict[str, list], output_batch: bool = False):
    """A copy of the ONNX ``model`` whose inputs have ``shapes`` (input name -> dims); with ``output_batch``
    its outputs' leading dimension becomes the symbolic ``batch``. The intermediate shape hints are dropped
    (they name the exported sizes)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for vi in g.input:
        if vi.name in shapes and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
            vi.type.tensor_type.shape.SetInParent()
            for d in shapes[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = int(d)
    for vi in g.output if output_batch else ():
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and len(tt.shape.dim):
            tt.shape.dim[0].Clear()
            tt.shape.dim[0].dim_param = BATCH  # (the runtime's name of a batch bucket's dimension)
    del g.value_info[:]
    return out


#: float initializers of this many bytes or more are what :func:`weights_as_inputs` lifts
LIFTED_WEIGHT_BYTES = 64 * 1024


def weights_as_inputs(model: onnx.ModelProto, min_bytes: int = LIFTED_WEIGHT_BYTES):
    """``(model', weights)``: ``model`` with each float initializer of ``min_bytes`` or more made an input (after
    the model's own inputs, in initializer order, its shape declared), and those initializers' values as
    ``[(name, numpy array)]``. A model imported several times at other input shapes (a generator's steps) then
    parses, checks and copies its weights once: each import binds the same arrays. The small initializers (shapes,
    indices, norms' parameters, masks) stay, so that shape folding sees them."""
    from onnx import helper, numpy_helper

    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    graph, kept, lifted = model.graph, [], []
    for init in graph.initializer:
        size = int(np.prod(init.dims)) * helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        (lifted if init.data_type in floats and size >= min_bytes else kept).append(init)
    if not lifted:
        return model, []
    names = {t.name for t in lifted}
    inputs = [i for i in graph.input if i.name not in names]  # (an old export lists its initializers as inputs too)
    inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in lifted]
    stripped = helper.make_graph(list(graph.node), graph.name, inputs, list(graph.output), kept,
                                 value_info=list(graph.value_info))
    out = helper.make_model(stripped, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                            functions=list(model.functions))
    return out, [(t.name, numpy_helper.to_array(t)) for t in lifted]


def from_onnx_trainable(path_or_model, shape_dict=None):
    """(module whose ``main`` takes the inputs then the weights, the weights' initial values)."""
    mod = from_onnx(path_or_model, shape_dict, keep_params_in_input=True)
    weights = mod["main"].attrs["params"] if mod["main"].attrs and "params" in mod["main"].attrs else []
    if not weights:
        raise ModelError("the model has no weights to train")
    return mod, [w.numpy() for w in weights]


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


def _tvm_import(model: onnx.ModelProto, shapes: dict, keep_params_in_input: bool):
    """TVM's ONNX importer (``tvm.relax.frontend.onnx.from_onnx``) without the ONNX checker it runs first: the
    model was checked here already (or, over protobuf's 2 GB, from its file), and the second check serialized the
    whole model again -- a fifth of a GPT-2 generator's build on a 2-core machine -- or, over 2 GB, only warned
    "Failed to serialize proto"."""
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    if model.ir_version < 3:
        raise ValueError(f"model IR version {model.ir_version} is not supported: it must be 3 (ONNX 1.1.0) or later")
    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    importer = ONNXGraphImporter(shapes or None, "float32", keep_params_in_input=keep_params_in_input, sanitize=True)
    return importer.from_onnx(model.graph, opset)


def _import(model: onnx.ModelProto, shapes: dict, label: str, keep_params_in_input: bool = False):
    import tvm
    from tvm import relax

    from tvm_nimble.relay_passes.clip_ops import ClipAsOperators
    from tvm_nimble.relay_passes.static_shapes import FoldStaticShapeOf
    from tvm_nimble.relay_passes.take_indices import clip_take_indices

    printed = io.StringIO()
    try:
        # on a failure the importer prints "Error converting operator <op>, with inputs: <IR>"
        # to stdout: keep that out of the user's terminal, but use it to name the operator
        with contextlib.redirect_stdout(printed):
            mod = _tvm_import(model, shapes, keep_params_in_input)
    except Exception as e:  # noqa: BLE001  (anything from deep inside the importer)
        m = re.search(r"Error converting operator (\S+?),", printed.getvalue())
        where = f" while converting a {m.group(1)} node" if m else ""
        raise ModelError(f"TVM {tvm.__version__}'s ONNX importer failed on {label}{where}: {type(e).__name__}: "
                         f"{one_line(e)}: simplify or re-export the model (e.g. onnxsim, another opset)") from e
    try:
        mod = FoldStaticShapeOf(relax.transform.DecomposeOpsForInference()(mod))
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"TVM could not prepare {label} for inference (DecomposeOpsForInference): "
                         f"{one_line(e)}: simplify or re-export the model") from e
    return clip_take_indices(ClipAsOperators(mod))
