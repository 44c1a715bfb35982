"""Fold an ONNX Pad into the convolution or pool that reads it.

Exporters write TensorFlow's "SAME" padding (timm's ``Conv2dSame``, ``MaxPool2dSame``, ``AvgPool2dSame``, all of
NASNet's and EfficientNet-TF's strided layers) as a Pad node in front of an unpadded Conv or pool. TVM's importer
turns every Pad into an opaque TE call, which has no layout rule: a channels-last build sends its tensor back to
NCHW, pads it there and transposes it again (nasnetalarge in fp16: 28 pads, 81 transposes over the stem's largest
tensors). Relax's conv2d and pools take asymmetric padding, so the pad belongs in their attributes:

    Pad(x, zeros)  -> Conv                       = Conv with the pads added
    Pad(x, zeros)  -> AveragePool (no pads)      = AveragePool with the pads, count_include_pad=1 (the padded
                                                   zeros were elements of the pooled tensor)
    Pad(x, -inf)   -> MaxPool                    = MaxPool with the pads added (its own pads are -inf)

Only a constant-mode Pad of a 4-D tensor with constant, non-negative pads on the two spatial axes, read by nothing
but that one node, folds; anything else is imported as it was (a negative pad is a crop, e.g. NASNet's shifted
path, and stays a Pad).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from .fold_shapes import small_constants, with_nodes


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _spatial_pads(pad: onnx.NodeProto, values: dict) -> tuple[list[int], float] | None:
    """([top, left, bottom, right], pad value) of a foldable Pad, else None."""
    a = _attrs(pad)
    if a.get("mode", b"constant") not in (b"constant", "constant"):
        return None
    if len(pad.input) > 1 and pad.input[1]:  # opset >= 11: pads (and value, axes) are inputs
        if len(pad.input) > 3 and pad.input[3]:
            return None  # axes given: rare, not worth a second spelling
        pads = values.get(pad.input[1])
        value = values.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(())
    else:
        pads, value = a.get("pads"), np.asarray(a.get("value", 0.0))
    if pads is None or value is None or np.size(value) != 1:
        return None
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    if len(pads) != 8 or pads[0] or pads[1] or pads[4] or pads[5] or min(pads) < 0:
        return None
    return [pads[2], pads[3], pads[6], pads[7]], float(np.asarray(value).reshape(()))


def _folded_attrs(consumer: onnx.NodeProto, pads: list[int], value: float) -> dict | None:
    """The attributes ``consumer`` gets with the pad folded in, or None when it cannot take it."""
    a = _attrs(consumer)
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    own = list(a.get("pads", [0, 0, 0, 0]))
    if len(own) != 4:
        return None
    total = [p + q for p, q in zip(own, pads)]
    if consumer.op_type == "Conv":
        return {"pads": total} if value == 0.0 else None
    if a.get("ceil_mode", 0):
        return None
    kernel = list(a.get("kernel_shape", []))
    if len(kernel) != 2 or any(max(total[i], total[i + 2]) >= kernel[i] for i in range(2)):
        return None  # a window of padding alone: no pool defines it the same way
    if consumer.op_type == "AveragePool" and value == 0.0 and (not any(own) or a.get("count_include_pad", 0)):
        return {"pads": total, "count_include_pad": 1}
    if consumer.op_type == "MaxPool" and value == -math.inf and len(consumer.output) == 1 \
            and not a.get("storage_order", 0):
        return {"pads": total}
    return None


def fold_pads(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto:
    """``model`` with each foldable Pad folded into its reader (see the module docstring): a copy (``in_place``:
    ``model``, changed); ``model`` itself when none folds."""
    g = model.graph
    if not any(n.op_type == "Pad" for n in g.node):
        return model
    values = small_constants(model)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}
    fold = {}  # a Pad's index -> (its reader's index, new attributes, the pad's input)
    index = {id(n): i for i, n in enumerate(g.node)}
    for at, n in enumerate(g.node):
        if n.op_type != "Pad" or n.domain not in ("", "ai.onnx") or n.output[0] in outputs:
            continue
        users = readers.get(n.output[0], [])
        if len(users) != 1 or users[0].op_type not in ("Conv", "AveragePool", "MaxPool") \
                or users[0].domain not in ("", "ai.onnx") or list(users[0].input).count(n.output[0]) != 1 \
                or users[0].input[0] != n.output[0]:
            continue
        spec = _spatial_pads(n, values)
        attrs = _folded_attrs(users[0], *spec) if spec else None
        if attrs is not None:
            fold[at] = (index[id(users[0])], attrs, n.input[0])
    if not fold:
        return model
    moved = {}  # each folded Pad's reader, by index: a copy reading the Pad's input, the pads among its attributes
    for reader, attrs, source in fold.values():
        target = onnx.NodeProto()
        target.CopyFrom(g.node[reader])
        target.input[0] = source
        kept = [a for a in target.attribute if a.name not in attrs]
        del target.attribute[:]
        target.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in attrs.items()])
        moved[reader] = target
    return with_nodes(model, [moved.get(i, n) for i, n in enumerate(g.node) if i not in fold], in_place)
