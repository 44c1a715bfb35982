"""A PyTorch module that runs an ONNX graph of the zoo's operator set, its initializers as parameters.

PyTorch's side of the training benchmark must train the very model Nimble trains, from the same
initial weights: this reads the zoo's ONNX graph (Conv, Relu, Add, Concat, MaxPool, AveragePool,
GlobalAveragePool, Flatten, Gemm, Clip) node by node into ``torch.nn.functional`` calls. The
initializers named in ``trainable`` become ``nn.Parameter`` s, the others buffers.
"""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from tvm_nimble.errors import NimbleError


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _same_pads(pads) -> int:
    if pads is None:
        return 0
    pads = list(pads)
    half = len(pads) // 2
    if pads[:half] != pads[half:] or len(set(pads[:half])) != 1:
        raise NimbleError(f"asymmetric padding {pads} is not supported by the PyTorch mirror of the model")
    return int(pads[0])


def torch_module(onnx_model, trainable=None):
    """``onnx_model`` as a ``torch.nn.Module`` (float32, on the CPU; move it with ``.to``)."""
    import torch
    import torch.nn.functional as F

    graph = onnx_model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    trainable = set(inits) if trainable is None else set(trainable)

    def conv(ins, a):
        return F.conv2d(ins[0], ins[1], ins[2] if len(ins) > 2 else None, stride=tuple(a.get("strides", (1, 1))),
                        padding=_same_pads(a.get("pads")), dilation=tuple(a.get("dilations", (1, 1))),
                        groups=int(a.get("group", 1)))

    def maxpool(ins, a):
        return F.max_pool2d(ins[0], tuple(a["kernel_shape"]), tuple(a.get("strides", (1, 1))),
                            _same_pads(a.get("pads")))

    def avgpool(ins, a):
        return F.avg_pool2d(ins[0], tuple(a["kernel_shape"]), tuple(a.get("strides", (1, 1))),
                            _same_pads(a.get("pads")), count_include_pad=bool(a.get("count_include_pad", 0)))

    def gemm(ins, a):
        w = ins[1].t() if a.get("transB", 0) else ins[1]
        x = ins[0].t() if a.get("transA", 0) else ins[0]
        y = a.get("alpha", 1.0) * (x @ w)
        return y + a.get("beta", 1.0) * ins[2] if len(ins) > 2 else y

    ops = {
        "Conv": conv,
        "Relu": lambda ins, a: F.relu(ins[0]),
        "Add": lambda ins, a: ins[0] + ins[1],
        "Concat": lambda ins, a: torch.cat(ins, dim=int(a.get("axis", 1))),
        "MaxPool": maxpool,
        "AveragePool": avgpool,
        "GlobalAveragePool": lambda ins, a: ins[0].mean(dim=(2, 3), keepdim=True),
        "Flatten": lambda ins, a: torch.flatten(ins[0], int(a.get("axis", 1))),
        "Gemm": gemm,
        "Clip": lambda ins, a: torch.clamp(ins[0], ins[1] if len(ins) > 1 else None, ins[2] if len(ins) > 2 else None),
    }
    unknown = sorted({n.op_type for n in graph.node} - set(ops))
    if unknown:
        raise NimbleError(f"the PyTorch mirror of the model lacks operator(s) {unknown}; it covers {sorted(ops)}")
    nodes = [(ops[n.op_type], list(n.input), n.output[0], _attrs(n)) for n in graph.node]
    input_names = [i.name for i in graph.input if i.name not in inits]
    output_name = graph.output[0].name

    class OnnxGraph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterDict()
            for name, value in inits.items():
                t = torch.from_numpy(np.array(value, copy=True))
                if name in trainable:
                    self.weights[name] = torch.nn.Parameter(t)
                else:
                    self.register_buffer(name, t)

        def forward(self, *xs):
            env = dict(zip(input_names, xs))
            for fn, ins, out, a in nodes:
                env[out] = fn([env[i] if i in env else self._tensor(i) for i in ins], a)
            return env[output_name]

        def _tensor(self, name):
            return self.weights[name] if name in self.weights else getattr(self, name)

    return OnnxGraph()
