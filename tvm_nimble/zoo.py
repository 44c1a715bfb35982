"""A zoo of small ONNX models built in code, for tests, demos and benchmarks.

Every model has seeded random weights (``numpy.random.default_rng(seed)``), static shapes,
opset 17, one float32 input named ``"input"`` of shape ``(batch, in_channels, hw, hw)`` and one
output named ``"output"`` produced by a small classifier head
(GlobalAveragePool -> Flatten -> Gemm). Defaults are small so a CPU (llvm) TVM compile takes
a few seconds; ``hw`` and ``channels`` scale them up for GPU benchmarks.

    >>> from tvm_nimble import zoo
    >>> model = zoo.get_model("inception", blocks=2)
    >>> inputs = zoo.random_inputs(model, seed=0)      # {"input": float32 array (1, 3, 16, 16)}
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17: readable by older ONNX tooling too
INPUT_NAME = "input"
OUTPUT_NAME = "output"
NUM_CLASSES = 10

__all__ = ["ZOO", "get_model", "save", "input_shape", "random_inputs", "inception", "nasnet",
           "resnet_chain", "mobilenet_chain", "densenet", "random_dag", "vit", "bert", "bert_inputs", "OPSET"]


def _positive(name: str, value: int, minimum: int = 1) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class _GraphBuilder:
    """Collects nodes and initializers; tracks every tensor's channel count and a rough estimate
    of its mean square so weights can be scaled to keep activations O(1) (the ONNX reference
    evaluator and TVM are compared with tight tolerances)."""

    def __init__(self, name: str, seed: int, batch: int, in_channels: int, hw: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.batch = _positive("batch", batch)
        self.hw = _positive("hw", hw)
        self.in_channels = _positive("in_channels", in_channels)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.channels: dict[str, int] = {INPUT_NAME: self.in_channels}
        self.m2: dict[str, float] = {INPUT_NAME: 1.0}  # random_inputs draws standard normals
        self._count: dict[str, int] = {}

    # ---- naming and constants ---------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        n = self._count.get(prefix, 0)
        self._count[prefix] = n + 1
        return f"{prefix}_{n}"

    def const(self, prefix: str, array: np.ndarray) -> str:
        name = self._fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name))
        return name

    def _node(self, op: str, inputs: list[str], channels: int, m2: float, **attrs) -> str:
        out = self._fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_node", **attrs))
        self.channels[out] = channels
        self.m2[out] = max(float(m2), 1e-3)
        return out

    # ---- ops --------------------------------------------------------------------------------
    def conv(self, x: str, cout: int, k: int = 1, group: int = 1, stride: int = 1, gain: float = 2.0,
             relu: bool = False, bias: bool = True) -> str:
        """Conv with 'same' padding. ``gain`` 2 suits a following Relu (He), 1 keeps the scale. ``bias``
        off: no bias input (a conv followed by BatchNormalization, as torchvision's are)."""
        cin = self.channels[x]
        if cin % group or cout % group:
            raise ValueError(f"conv groups {group} must divide channels {cin} -> {cout}")
        fan_in = (cin // group) * k * k
        std = np.sqrt(gain / (fan_in * self.m2[x]))
        w = self.const("w", self.rng.normal(0.0, std, size=(cout, cin // group, k, k)))
        b = [self.const("b", self.rng.normal(0.0, 0.05, size=(cout,)))] if bias else []
        p = k // 2
        y = self._node("Conv", [x, w, *b], cout, gain, kernel_shape=[k, k], pads=[p, p, p, p],
                       strides=[stride, stride], group=group, dilations=[1, 1])
        return self.relu(y) if relu else y

    def relu(self, x: str) -> str:
        return self._node("Relu", [x], self.channels[x], self.m2[x] / 2)

    def clip6(self, x: str) -> str:
        lo = self.const("clip_min", np.array(0.0))
        hi = self.const("clip_max", np.array(6.0))
        return self._node("Clip", [x, lo, hi], self.channels[x], self.m2[x] / 2)

    def add(self, a: str, b: str) -> str:
        if self.channels[a] != self.channels[b]:
            raise ValueError(f"Add of {a} ({self.channels[a]} ch) and {b} ({self.channels[b]} ch)")
        return self._node("Add", [a, b], self.channels[a], self.m2[a] + self.m2[b])

    def concat(self, xs: list[str]) -> str:
        c = sum(self.channels[x] for x in xs)
        m2 = sum(self.m2[x] * self.channels[x] for x in xs) / c
        return self._node("Concat", list(xs), c, m2, axis=1)

    def maxpool(self, x: str, k: int = 3, stride: int = 1) -> str:
        p = k // 2
        return self._node("MaxPool", [x], self.channels[x], self.m2[x] * 1.5, kernel_shape=[k, k],
                          pads=[p, p, p, p], strides=[stride, stride])

    def avgpool(self, x: str, k: int = 3, stride: int = 1, pad: int | None = None) -> str:
        p = k // 2 if pad is None else pad
        return self._node("AveragePool", [x], self.channels[x], self.m2[x] / 2, kernel_shape=[k, k],
                          pads=[p, p, p, p], strides=[stride, stride], count_include_pad=0)

    def batchnorm(self, x: str) -> str:
        """Inference BatchNormalization whose running variance is the input's estimated mean square, so
        the output stays O(1) whatever came before (a trained net's statistics do the same)."""
        c = self.channels[x]
        scale = self.const("bn_scale", 1.0 + self.rng.normal(0.0, 0.1, size=(c,)))
        shift = self.const("bn_shift", self.rng.normal(0.0, 0.1, size=(c,)))
        mean = self.const("bn_mean", self.rng.normal(0.0, 0.1 * np.sqrt(self.m2[x]), size=(c,)))
        var = self.const("bn_var", self.m2[x] * self.rng.uniform(0.5, 1.5, size=(c,)))
        return self._node("BatchNormalization", [x, scale, shift, mean, var], c, 1.0, epsilon=1e-5)

    def sep_conv(self, x: str, k: int) -> str:
        """Separable conv, NASNet style: Relu -> depthwise kxk (group = C) -> 1x1 conv."""
        c = self.channels[x]
        y = self.conv(self.relu(x), c, k=k, group=c, gain=1.0)
        return self.conv(y, c, k=1, gain=1.0)

    # ---- model ------------------------------------------------------------------------------
    def finish(self, x: str, num_classes: int = NUM_CLASSES) -> onnx.ModelProto:
        """Classifier head (GlobalAveragePool -> Flatten -> Gemm) and the ModelProto."""
        c = self.channels[x]
        g = self._node("GlobalAveragePool", [x], c, self.m2[x])
        f = self._node("Flatten", [g], c, self.m2[g], axis=1)
        w = self.const("fc_w", self.rng.normal(0.0, np.sqrt(1.0 / (c * max(self.m2[f], 1e-3))),
                                               size=(num_classes, c)))
        b = self.const("fc_b", self.rng.normal(0.0, 0.05, size=(num_classes,)))
        self.nodes.append(helper.make_node("Gemm", [f, w, b], [OUTPUT_NAME], name="fc_node", transB=1))
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT,
                                           [self.batch, self.in_channels, self.hw, self.hw])],
            [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [self.batch, num_classes])],
            initializer=self.inits,
        )
        model = helper.make_model(graph, producer_name="tvm-nimble.zoo",
                                  opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        return model


# ---- builders -------------------------------------------------------------------------------
def inception(blocks: int = 3, batch: int = 1, seed: int = 0, *, hw: int = 16, channels: int = 16,
              in_channels: int = 3) -> onnx.ModelProto:
    """Inception-style net: a 3x3 stem, then ``blocks`` blocks of four parallel branches
    (1x1; 1x1->3x3; 1x1->3x3->3x3; 3x3 maxpool->1x1), each conv followed by Relu, joined by a
    channel Concat. Every branch has ``channels // 4`` channels so blocks chain."""
    blocks = _positive("blocks", blocks)
    channels = _positive("channels", channels, 4)
    if channels % 4:
        raise ValueError(f"inception channels must be a multiple of 4, got {channels}")
    b = _GraphBuilder(f"inception{blocks}", seed, batch, in_channels, hw)
    q = channels // 4
    x = b.conv(INPUT_NAME, channels, k=3, relu=True)
    for _ in range(blocks):
        b1 = b.conv(x, q, k=1, relu=True)
        b2 = b.conv(b.conv(x, q, k=1, relu=True), q, k=3, relu=True)
        b3 = b.conv(b.conv(b.conv(x, max(q // 2, 1), k=1, relu=True), q, k=3, relu=True), q, k=3, relu=True)
        b4 = b.conv(b.maxpool(x), q, k=1, relu=True)
        x = b.concat([b1, b2, b3, b4])
    return b.finish(x)


def nasnet(cells: int = 2, batch: int = 1, seed: int = 0, *, hw: int = 16, channels: int = 16,
           in_channels: int = 3) -> onnx.ModelProto:
    """NASNet-A-style normal cells. Each cell takes the previous two cell outputs (skip
    connections), preprocesses each with Relu -> 1x1 conv, and combines five pairs of small ops
    (separable 3x3/5x5 convs = depthwise Conv(group=C) + 1x1 Conv, 3x3 avg/max pools, identity)
    by Add; the five sums are concatenated and a 1x1 conv brings the channels back to
    ``channels``."""
    cells = _positive("cells", cells)
    channels = _positive("channels", channels)
    b = _GraphBuilder(f"nasnet{cells}", seed, batch, in_channels, hw)
    stem = b.conv(INPUT_NAME, channels, k=3, gain=1.0)
    prev, cur = stem, stem
    for _ in range(cells):
        hp = b.conv(b.relu(prev), channels, k=1, gain=1.0)  # h_{i-1}
        h = b.conv(b.relu(cur), channels, k=1, gain=1.0)    # h_i
        outs = [
            b.add(b.sep_conv(h, 3), h),
            b.add(b.sep_conv(hp, 3), b.sep_conv(h, 5)),
            b.add(b.avgpool(h), hp),
            b.add(b.avgpool(hp), b.maxpool(h)),
            b.add(b.sep_conv(hp, 5), b.sep_conv(hp, 3)),
        ]
        prev, cur = cur, b.conv(b.concat(outs), channels, k=1, gain=1.0)
    return b.finish(b.relu(cur))


def resnet_chain(blocks: int = 4, batch: int = 1, seed: int = 0, *, hw: int = 16, channels: int = 16,
                 in_channels: int = 3) -> onnx.ModelProto:
    """ResNet basic blocks in a chain: conv3x3-Relu-conv3x3, residual Add, Relu."""
    blocks = _positive("blocks", blocks)
    channels = _positive("channels", channels)
    b = _GraphBuilder(f"resnet{blocks}", seed, batch, in_channels, hw)
    x = b.conv(INPUT_NAME, channels, k=3, relu=True)
    for _ in range(blocks):
        y = b.conv(x, channels, k=3, relu=True)
        y = b.conv(y, channels, k=3, gain=0.5)
        x = b.relu(b.add(x, y))
    return b.finish(x)


def mobilenet_chain(blocks: int = 4, batch: int = 1, seed: int = 0, *, hw: int = 16, channels: int = 16,
                    in_channels: int = 3, expand: int = 4) -> onnx.ModelProto:
    """MobileNetV2 inverted-residual blocks: 1x1 expand -> Clip(0, 6), depthwise 3x3
    (group = expanded channels) -> Clip(0, 6), linear 1x1 project. The first block widens
    ``channels // 2`` to ``channels`` and the middle block has stride 2 (when the spatial size
    allows it); the others keep the shape and add the residual."""
    blocks = _positive("blocks", blocks)
    channels = _positive("channels", channels, 2)
    expand = _positive("expand", expand)
    b = _GraphBuilder(f"mobilenet{blocks}", seed, batch, in_channels, hw)
    x = b.clip6(b.conv(INPUT_NAME, max(channels // 2, 1), k=3))
    size = hw
    for i in range(blocks):
        stride = 2 if (i == blocks // 2 and i > 0 and size >= 4) else 1
        cin = b.channels[x]
        e = cin * expand
        y = b.clip6(b.conv(x, e, k=1))
        y = b.clip6(b.conv(y, e, k=3, group=e, stride=stride))
        y = b.conv(y, channels, k=1, gain=1.0)
        size = (size - 1) // stride + 1
        x = b.add(x, y) if (stride == 1 and cin == channels) else y
    return b.finish(x)


def densenet(blocks: tuple[int, ...] = (2, 3), batch: int = 1, seed: int = 0, *, hw: int = 16, growth: int = 4,
             init_channels: int = 8, bn_size: int = 4, in_channels: int = 3, concat: str = "nested",
             stem: str = "small") -> onnx.ModelProto:
    """DenseNet: a stem, then dense blocks of ``blocks[i]`` layers, each BN-Relu-Conv1x1 (``bn_size *
    growth`` channels) -BN-Relu-Conv3x3 (``growth`` channels) whose output is concatenated onto all
    earlier features of its block; between blocks a transition (BN-Relu-Conv1x1 to half the channels,
    2x2 average pool, stride 2); a final BN-Relu before the head. ``concat="nested"``: each layer's
    features are ``Concat(previous features, new)`` (the ONNX model zoo's densenet121, from Caffe2);
    ``"list"``: each layer concatenates every earlier output afresh, as torchvision's ``_DenseLayer`` does
    (``torch.cat(features, 1)``). ``stem="imagenet"`` is torchvision's (7x7 conv stride 2, 3x3 max pool
    stride 2), ``"small"`` one 3x3 conv. ``densenet(blocks=(6, 12, 24, 16), growth=32, init_channels=64,
    hw=224, stem="imagenet")`` has torchvision densenet121's shape (:data:`BENCH_MODELS` ``densenet121``)."""
    blocks = tuple(_positive("blocks", n) for n in blocks)
    growth = _positive("growth", growth)
    bn_size = _positive("bn_size", bn_size)
    if not blocks:
        raise ValueError("densenet needs at least one block")
    if concat not in ("nested", "list") or stem not in ("small", "imagenet"):
        raise ValueError(f"concat must be 'nested' or 'list' and stem 'small' or 'imagenet', got {concat!r}, {stem!r}")
    b = _GraphBuilder(f"densenet{sum(blocks) * 2 + len(blocks) + 1}", seed, batch, in_channels, hw)
    if stem == "imagenet":
        x = b.maxpool(b.relu(b.batchnorm(b.conv(INPUT_NAME, init_channels, k=7, stride=2, bias=False))), stride=2)
    else:
        x = b.relu(b.batchnorm(b.conv(INPUT_NAME, init_channels, k=3, bias=False)))
    for i, layers in enumerate(blocks):
        features = [x]
        for _ in range(layers):
            y = b.conv(b.relu(b.batchnorm(x)), bn_size * growth, k=1, bias=False)
            y = b.conv(b.relu(b.batchnorm(y)), growth, k=3, bias=False)
            features.append(y)
            x = b.concat([x, y] if concat == "nested" else features)
        if i + 1 < len(blocks):
            x = b.conv(b.relu(b.batchnorm(x)), b.channels[x] // 2, k=1, bias=False)
            x = b.avgpool(x, k=2, stride=2, pad=0)
    return b.finish(b.relu(b.batchnorm(x)))


def random_dag(num_ops: int = 12, seed: int = 0, batch: int = 1, *, hw: int = 8, channels: int = 8,
               in_channels: int = 3) -> onnx.ModelProto:
    """A random DAG of ``num_ops`` ops (Conv 3x3 / Conv 1x1 with same padding, Add, Relu, and
    Concat followed by a 1x1 Conv back to ``channels``) over tensors that all have ``channels``
    channels and the same spatial size. Inputs are drawn from earlier tensors, favouring recent
    ones. Tensors nobody consumes are concatenated (+ 1x1 conv) at the end, so the single output
    depends on every op. Deterministic for a given ``seed``."""
    num_ops = _positive("num_ops", num_ops)
    channels = _positive("channels", channels)
    b = _GraphBuilder(f"random_dag{num_ops}_s{seed}", seed, batch, in_channels, hw)
    rng = b.rng
    pool = [b.conv(INPUT_NAME, channels, k=3, gain=1.0)]
    consumed: set[str] = set()

    def pick(k: int) -> list[str]:
        # favour recent tensors (deeper graphs) without starving old ones (wider graphs)
        w = np.arange(1, len(pool) + 1, dtype=np.float64) ** 1.5
        idx = rng.choice(len(pool), size=min(k, len(pool)), replace=False, p=w / w.sum())
        return [pool[i] for i in sorted(idx)]

    kinds = ["conv3", "conv1", "add", "concat", "relu"]
    probs = [0.3, 0.2, 0.2, 0.15, 0.15]
    for _ in range(num_ops):
        kind = kinds[rng.choice(len(kinds), p=probs)]
        if kind in ("add", "concat") and len(pool) < 2:
            kind = "conv1"
        if kind == "conv3":
            ins = pick(1)
            out = b.conv(ins[0], channels, k=3, gain=1.0)
        elif kind == "conv1":
            ins = pick(1)
            out = b.conv(ins[0], channels, k=1, gain=1.0)
        elif kind == "relu":
            ins = pick(1)
            out = b.relu(ins[0])
        elif kind == "add":
            ins = pick(2)
            out = b.add(ins[0], ins[1])
        else:
            ins = pick(int(rng.integers(2, 4)))
            out = b.conv(b.concat(ins), channels, k=1, gain=1.0)
        consumed.update(ins)
        pool.append(out)
    sinks = [t for t in pool if t not in consumed]
    out = sinks[0] if len(sinks) == 1 else b.conv(b.concat(sinks), channels, k=1, gain=1.0)
    return b.finish(out)


class _Layers:
    """The transformer builders' ONNX graph under construction: nodes, initializers with fresh names,
    and the layers both draw (weights from one seeded generator, in call order)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self._count = [], [], {}

    def fresh(self, prefix: str) -> str:
        self._count[prefix] = self._count.get(prefix, 0) + 1
        return f"{prefix}_{self._count[prefix] - 1}"

    def const(self, prefix: str, array, dtype=np.float32) -> str:
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array, dtype=dtype), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out + "_node", **attrs))
        return out

    def linear(self, x: str, cin: int, cout: int) -> str:
        w = self.const("w", self.rng.normal(0.0, 1.0 / np.sqrt(cin), size=(cin, cout)))
        return self.node("Add", [self.node("MatMul", [x, w]), self.const("b", self.rng.normal(0.0, 0.05, size=(cout,)))])

    def layer_norm(self, x: str, dim: int, epsilon: float) -> str:
        return self.node("LayerNormalization", [x, self.const("ln_g", 1.0 + self.rng.normal(0.0, 0.1, size=(dim,))),
                                               self.const("ln_b", self.rng.normal(0.0, 0.1, size=(dim,)))],
                         axis=-1, epsilon=epsilon)


def vit(depth: int = 2, batch: int = 1, seed: int = 0, *, hw: int = 16, patch: int = 4, dim: int = 32,
        heads: int = 2, mlp: int = 64, in_channels: int = 3, unbind: str = "gather") -> onnx.ModelProto:
    """A small ViT as timm exports it: a patch convolution, then ``depth`` pre-norm blocks of multi-head
    attention (LayerNorm, one QKV Linear on [B, T, C], batched Q·Kᵀ, scale, Softmax, ·V, the output
    Linear, a residual add) and an MLP (LayerNorm, Linear, erf GELU, Linear, a residual add), a final
    LayerNorm, the mean over tokens and a classifier. Weights are drawn so activations stay O(1).
    ``unbind``: how Q, K and V leave the QKV tensor: "gather" (three Gathers, the scale on the scores)
    or "split" (Split + Squeeze, and the scale's square root on Q and on Kᵀ: the export of PyTorch's
    scaled_dot_product_attention that timm uses)."""
    if unbind not in ("gather", "split"):
        raise ValueError(f"unbind must be 'gather' or 'split', got {unbind!r}")
    for name, v in (("depth", depth), ("batch", batch), ("hw", hw), ("patch", patch), ("dim", dim),
                    ("heads", heads), ("mlp", mlp)):
        _positive(name, v)
    if hw % patch or dim % heads:
        raise ValueError(f"hw ({hw}) must be a multiple of patch ({patch}) and dim ({dim}) of heads ({heads})")
    g = _Layers(seed)
    rng, nodes, inits, fresh, const, node, linear = g.rng, g.nodes, g.inits, g.fresh, g.const, g.node, g.linear
    tokens, head_dim = (hw // patch) ** 2, dim // heads

    def layer_norm(x):
        return g.layer_norm(x, dim, 1e-6)

    def shape(*dims):
        return const("shape", dims, np.int64)

    pw = const("patch_w", rng.normal(0.0, 1.0 / np.sqrt(in_channels * patch * patch), size=(dim, in_channels, patch, patch)))
    x = node("Conv", [INPUT_NAME, pw, const("patch_b", rng.normal(0.0, 0.05, size=(dim,)))],
             kernel_shape=[patch, patch], strides=[patch, patch])
    x = node("Transpose", [node("Reshape", [x, shape(batch, dim, tokens)])], perm=[0, 2, 1])
    x = node("Add", [x, const("pos", rng.normal(0.0, 0.5, size=(1, tokens, dim)))])
    for _ in range(depth):
        qkv = node("Transpose", [node("Reshape", [linear(layer_norm(x), dim, 3 * dim), shape(batch, tokens, 3, heads, head_dim)])],
                   perm=[2, 0, 3, 1, 4])
        if unbind == "gather":
            q, k, v = (node("Gather", [qkv, const("idx", i, np.int64)], axis=0) for i in range(3))
            scores = node("Mul", [node("MatMul", [q, node("Transpose", [k], perm=[0, 1, 3, 2])]),
                                  const("scale", 1.0 / np.sqrt(head_dim))])
        else:
            parts = [fresh("split") for _ in range(3)]
            nodes.append(helper.make_node("Split", [qkv], parts, name=parts[0] + "_node", axis=0))
            q, k, v = (node("Squeeze", [p, const("axes", [0], np.int64)]) for p in parts)
            root = const("scale", head_dim ** -0.25)
            scores = node("MatMul", [node("Mul", [q, root]), node("Mul", [node("Transpose", [k], perm=[0, 1, 3, 2]), root])])
        attn = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        attn = node("Reshape", [node("Transpose", [attn], perm=[0, 2, 1, 3]), shape(batch, tokens, dim)])
        x = node("Add", [x, linear(attn, dim, dim)])
        h = linear(layer_norm(x), dim, mlp)
        gelu = node("Mul", [node("Mul", [h, const("half", 0.5)]),
                            node("Add", [node("Erf", [node("Div", [h, const("sqrt2", np.sqrt(2.0))])]), const("one", 1.0)])])
        x = node("Add", [x, linear(gelu, mlp, dim)])
    pooled = node("ReduceMean", [layer_norm(x)], axes=[1], keepdims=0)
    w = const("fc_w", rng.normal(0.0, 1.0 / np.sqrt(dim), size=(dim, NUM_CLASSES)))
    nodes.append(helper.make_node("Gemm", [pooled, w, const("fc_b", rng.normal(0.0, 0.05, size=(NUM_CLASSES,)))],
                                  [OUTPUT_NAME], name="fc_node"))
    graph = helper.make_graph(
        nodes, f"vit{depth}",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [batch, in_channels, hw, hw])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [batch, NUM_CLASSES])],
        initializer=inits)
    model = helper.make_model(graph, producer_name="tvm-nimble.zoo", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def bert(layers: int = 2, batch: int = 1, seed: int = 0, *, seq: int = 16, dim: int = 32, heads: int = 2,
         ffn: int = 64, vocab: int = 50, mask: str = "additive") -> onnx.ModelProto:
    """A small BERT encoder as Hugging Face exports it: int64 ``input_ids`` and ``attention_mask`` [batch,
    seq] in, word + position embeddings and LayerNorm, then ``layers`` post-norm blocks: Q, K and V
    Linears, heads split by Reshape + Transpose (K straight to Kᵀ with perm [0, 2, 3, 1]), Q·Kᵀ / √d plus
    the padding mask (1 - mask) · -10000 broadcast from [batch, 1, 1, seq], Softmax, ·V, the head
    merge, the output Linear, residual adds, LayerNorms and an erf-GELU MLP; the output is the last
    hidden state [batch, seq, dim]. ``mask="where"`` applies the mask with Where(mask, scores, -1e4)
    instead (a form the fused attention does not take). Weights are drawn so activations stay O(1)."""
    for name, v in (("layers", layers), ("batch", batch), ("seq", seq), ("dim", dim), ("heads", heads),
                    ("ffn", ffn), ("vocab", vocab)):
        _positive(name, v)
    if dim % heads:
        raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
    if mask not in ("additive", "where"):
        raise ValueError(f"mask must be 'additive' or 'where', got {mask!r}")
    g = _Layers(seed)
    rng, nodes, inits, const, node, linear = g.rng, g.nodes, g.inits, g.const, g.node, g.linear
    head_dim = dim // heads

    def layer_norm(x):
        return g.layer_norm(x, dim, 1e-12)

    def heads_of(x, perm):
        return node("Transpose", [node("Reshape", [x, const("shape", [batch, seq, heads, head_dim], np.int64)])],
                    perm=perm)

    words = const("word_emb", rng.normal(0.0, 1.0, size=(vocab, dim)))
    x = node("Add", [node("Gather", [words, "input_ids"], axis=0), const("pos_emb", rng.normal(0.0, 0.5, size=(1, seq, dim)))])
    x = layer_norm(x)
    keep = node("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    keep = node("Unsqueeze", [keep, const("axes", [1, 2], np.int64)])  # [batch, 1, 1, seq]
    additive = node("Mul", [node("Sub", [const("one", 1.0), keep]), const("neg", -10000.0)])
    is_kept = node("Cast", [keep], to=TensorProto.BOOL)
    for _ in range(layers):
        q = heads_of(linear(x, dim, dim), [0, 2, 1, 3])
        kt = heads_of(linear(x, dim, dim), [0, 2, 3, 1])
        v = heads_of(linear(x, dim, dim), [0, 2, 1, 3])
        scores = node("Div", [node("MatMul", [q, kt]), const("sqrt_d", np.sqrt(head_dim))])
        if mask == "additive":
            scores = node("Add", [scores, additive])
        else:
            scores = node("Where", [is_kept, scores, const("masked", -10000.0)])
        ctx = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        ctx = node("Reshape", [node("Transpose", [ctx], perm=[0, 2, 1, 3]), const("shape", [batch, seq, dim], np.int64)])
        x = layer_norm(node("Add", [x, linear(ctx, dim, dim)]))
        h = linear(x, dim, ffn)
        gelu = node("Mul", [node("Mul", [h, const("half", 0.5)]),
                            node("Add", [node("Erf", [node("Div", [h, const("sqrt2", np.sqrt(2.0))])]), const("one", 1.0)])])
        x = layer_norm(node("Add", [x, linear(gelu, ffn, dim)]))
    nodes.append(helper.make_node("Identity", [x], [OUTPUT_NAME], name="output_node"))
    graph = helper.make_graph(
        nodes, f"bert{layers}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, seq])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [batch, seq, dim])],
        initializer=inits)
    model = helper.make_model(graph, producer_name="tvm-nimble.zoo", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def bert_inputs(model: onnx.ModelProto, seed: int = 0, vocab: int = 50) -> dict[str, np.ndarray]:
    """Token ids in [0, vocab) and a padding mask (ones, then zeros over the last quarter) for ``bert``."""
    dims = _dims(next(vi for vi in _graph_inputs(model) if vi.name == "input_ids"))
    rng = np.random.default_rng(seed)
    mask = np.ones(dims, dtype=np.int64)
    mask[:, dims[1] - dims[1] // 4:] = 0
    return {"input_ids": rng.integers(0, vocab, size=dims).astype(np.int64), "attention_mask": mask}


ZOO: dict[str, Callable[..., onnx.ModelProto]] = {
    "inception": inception,
    "nasnet": nasnet,
    "resnet": resnet_chain,
    "mobilenet": mobilenet_chain,
    "densenet": densenet,
    "random_dag": random_dag,
    "vit": vit,
}
# bert is not in ZOO: its inputs are two int64 tensors (token ids and a padding mask), not the one
# float image every ZOO net takes (and that `tvm-nimble zoo`, `bench zoo:` and random_inputs assume)


#: Benchmark-sized zoo nets, one table for `tvm-nimble bench`, `tvm-nimble tune zoo:<name>` and
#: scripts/gpu_prepare.py, so a tuning database made for one matches the others' kernels.
#: name -> (zoo builder, keyword arguments). incept6 is the README's Inception-style anchor.
BENCH_MODELS: dict[str, tuple[str, dict]] = {
    "incept6": ("inception", {"blocks": 6, "hw": 64, "channels": 64}),
    "nasnet": ("nasnet", {"cells": 4, "hw": 32, "channels": 32}),
    "resnet": ("resnet", {"blocks": 8, "hw": 32, "channels": 64}),
    "mobilenet": ("mobilenet", {"blocks": 6, "hw": 32, "channels": 32}),
    # torchvision densenet121's shape; its Concats nested as in the ONNX model zoo's export
    "densenet121": ("densenet", {"blocks": (6, 12, 24, 16), "growth": 32, "init_channels": 64, "hw": 224,
                                 "stem": "imagenet"}),
}
BENCH_ALIASES = {"inception": "incept6"}


def bench_model_spec(name: str, batch: int = 1, small: bool = False) -> tuple[str, str, dict]:
    """(label, zoo builder, keyword arguments) of a benchmark-sized zoo net, without building it."""
    label = BENCH_ALIASES.get(name, name)
    builder, kw = BENCH_MODELS.get(label, (label, {}))
    if builder not in ZOO:
        # the names this function takes, not ZOO's: incept6 is one, inception an alias of it
        sized = ", ".join(f"{n} (or {a})" if (a := next((k for k, v in BENCH_ALIASES.items() if v == n), None)) else n
                          for n in sorted(BENCH_MODELS))
        others = ", ".join(sorted(set(ZOO) - {b for b, _ in BENCH_MODELS.values()}))
        raise ValueError(f"unknown zoo model {name!r}: valid names are {sized} (benchmark size), and {others} "
                         "(the zoo's own size)")
    return label, builder, {**({} if small else kw), "batch": batch}


def get_bench_model(name: str, batch: int = 1, small: bool = False) -> tuple[str, onnx.ModelProto]:
    """(label, model): a benchmark-sized zoo net (``small``: the zoo's defaults), batch ``batch``."""
    label, builder, kw = bench_model_spec(name, batch, small)
    return label, get_model(builder, **kw)


def get_model(name: str, **kw) -> onnx.ModelProto:
    """Build the zoo model ``name`` (a key of :data:`ZOO`) with the builder's keyword arguments."""
    try:
        fn = ZOO[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown zoo model {name!r}: valid names are {', '.join(sorted(ZOO))}") from None
    return fn(**kw)


def save(model: onnx.ModelProto, path: str | os.PathLike) -> str:
    """Write ``model`` to ``path`` (parent folders are created); returns the path."""
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    onnx.save(model, path)
    return path


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Real graph inputs: older exporters also list initializers (weights) as inputs."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _dims(vi: onnx.ValueInfoProto) -> tuple:
    return tuple(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
                 for d in vi.type.tensor_type.shape.dim)


def input_shape(model: onnx.ModelProto) -> dict[str, tuple]:
    """``{input name: shape}``; a symbolic dim appears as its name (``"N"``), an unknown one as ``None``."""
    return {vi.name: _dims(vi) for vi in _graph_inputs(model)}


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for every graph input: standard normals for float inputs; for an integer
    input, ids below the size of the table it indexes (a Gather of a constant, e.g. an embedding, also through
    the reshapes and casts exporters put in between) or, when it indexes none, an attention mask: ones, with the
    last quarter of its last axis zero (right padding, as a batch of prompts has; random 0/1 would mask whole
    rows of a causal decoder, whose outputs no two frameworks define alike); random booleans for bool inputs."""
    from tvm_nimble.errors import ShapeError

    rng = np.random.default_rng(seed)
    out = {}
    tables = _index_tables(model)
    for vi in _graph_inputs(model):
        shape = _dims(vi)
        if any(not isinstance(d, int) for d in shape):
            raise ShapeError(f"input {vi.name!r} has a dynamic shape {shape}: random_inputs needs static shapes "
                             f"(fix the dims in the model first)")
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating):
            out[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            out[vi.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif vi.name in tables:
            out[vi.name] = rng.integers(0, tables[vi.name], size=shape).astype(dtype)
        else:
            mask = np.ones(shape, dtype=dtype)
            if shape:
                mask[..., shape[-1] - shape[-1] // 4:] = 0
            out[vi.name] = mask
    return out


def _index_tables(model: onnx.ModelProto) -> dict[str, int]:
    """input name -> the smallest size of a constant table it indexes directly (Gather's indices)."""
    sizes = {t.name: list(t.dims) for t in model.graph.initializer}
    source = {vi.name: vi.name for vi in _graph_inputs(model)}  # value -> the graph input it views
    out: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in _ID_VIEWS and node.input and node.input[0] in source:
            source[node.output[0]] = source[node.input[0]]
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in sizes and node.input[1] in source:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = sizes[node.input[0]]
            size = dims[axis % len(dims)] if dims else 1
            name = source[node.input[1]]
            out[name] = min(out.get(name, size), size)
    return out


#: operators through which exporters pass token ids to their embedding's Gather (GPT-2: Reshape to [-1, seq])
_ID_VIEWS = ("Reshape", "Flatten", "Unsqueeze", "Squeeze", "Cast", "Identity")
