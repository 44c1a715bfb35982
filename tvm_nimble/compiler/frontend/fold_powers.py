"""A power by a constant 2 or 3 as multiplications.

GPT-2's GELU (``gelu_new``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``) exports ``x^3`` as ``Pow(x, 3.0)``.
TVM lowers a power to ``powf``, a transcendental call where two multiplies do, and warns at every legalization of
an exponent of 3 or more (``Detected pow(x, y) where y >= 3 ...``), several lines per build that say nothing to a
user. ``x * x`` and ``x * x * x`` are what ``pow`` computes for these exponents, negative ``x`` included.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .fold_shapes import small_constants, with_nodes

#: exponents written as multiplications
_EXPONENTS = (2.0, 3.0)


def fold_powers(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto:
    """``model`` with each ``Pow(x, c)``, ``c`` a constant scalar 2 or 3, as ``Mul`` nodes: a copy (``in_place``:
    ``model``, changed); ``model`` itself when there is none."""
    g = model.graph
    if not any(n.op_type == "Pow" for n in g.node):
        return model
    values = small_constants(model)

    def exponent(n):
        if n.op_type != "Pow" or n.domain not in ("", "ai.onnx") or n.input[1] not in values:
            return None
        c = np.asarray(values[n.input[1]])
        return float(c.reshape(())) if c.size == 1 and float(c.reshape(())) in _EXPONENTS else None

    if not any(exponent(n) is not None for n in g.node):
        return model
    nodes = []
    for n in g.node:
        c = exponent(n)
        if c is None:
            nodes.append(n)
            continue
        x, y = n.input[0], n.output[0]
        if c == 2.0:
            nodes.append(helper.make_node("Mul", [x, x], [y], name=n.name))
        else:
            square = f"{y}__square"
            nodes += [helper.make_node("Mul", [x, x], [square], name=f"{n.name}__square"),
                      helper.make_node("Mul", [square, x], [y], name=n.name)]
    return with_nodes(model, nodes, in_place)
