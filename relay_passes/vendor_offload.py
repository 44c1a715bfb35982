"""OffloadToVendor: convolutions and GEMMs to cuDNN / cuBLASLt, as ordinary launches of the plan.

The pass runs on the imported Relax module, before TVM's legalization, and replaces chains

    conv2d(x, W) [+ bias] [+ residual] [-> relu | clip(0, 6)]     (NCHW / OIHW, symmetric padding)
    matmul(x, permute_dims(W)) [+ bias] [-> relu]                  (2-D, fp32 / fp16)
    avg_pool2d(x)                                                  (as a depthwise convolution)

by one destination-passing call of a global function of the vendor extension
(``codegen/vendor/``), e.g. ``R.call_dps_packed("nimble.cudnn.conv2d", (x, W, b, R.shape(attrs)),
[y, workspace])``. After ``CallTIRRewrite`` that is ``nimble.cudnn.conv2d(x, W, b, attrs, y, ws)``:
a kernel of the stream DAG like any TIR kernel, so stream assignment, the concurrency-safe
memory plan and the race checker treat it the same way. The workspace is an extra output
tensor (uint8), so each call gets its own scratch memory and the memory plan reuses it only
where every earlier use happens-before: two streams never share a workspace while they run.

Only chains whose intermediate values have no other use are replaced; anything else (other
layouts, asymmetric padding, other dtypes) stays with TVM's kernels, and :func:`offload_report`
says why.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from numpy.lib.stride_tricks import sliding_window_view
from tvm.ir.expr import Constant


CONV2D = "nimble.cudnn.conv2d"
CONV2D_ADD = "nimble.cudnn.conv2d_add"
MATMUL = "nimble.cublas.matmul"
ACT_NONE, ACT_RELU, ACT_RELU6 = 0, 1, 2
DTYPES = ("float32", "float16")
#: scratch memory per vendor call; cuDNN/cuBLASLt pick the fastest algorithm that fits
DEFAULT_WORKSPACE_BYTES = 8 << 20


@dataclass
class OffloadReport:
    """What the pass did: calls emitted per function, and operators kept on TVM with the reason."""

    offloaded: dict[str, int] = field(default_factory=dict)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (operator, reason)


def _op(expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def _shape(expr) -> tuple[int, ...] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape.values)
    except TypeError:
        return None


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _ints(arr) -> list[int]:
    return [int(v) for v in arr]


class _Chains:
    """The bindings of one dataflow block, and how often each var is used in the whole function."""

    def __init__(self, block, uses):
        self.value = {b.var: b.value for b in block.bindings}
        self.uses = uses
        self.claimed: set = set()  # vars of chains already replaced
        self.consumers: dict = {}  # var -> the bindings of this block that take it as an argument, in order
        for b in block.bindings:
            for a in getattr(b.value, "args", []):
                if isinstance(a, relax.Var):
                    self.consumers.setdefault(a, []).append(b.var)

    def single_use(self, var) -> bool:
        return self.uses.get(var, 0) == 1

    def const(self, expr) -> np.ndarray | None:
        """The constant behind ``expr`` (through a reshape of a constant), else None."""
        if isinstance(expr, relax.Var) and expr in self.value:
            expr = self.value[expr]
        if isinstance(expr, Constant):
            return expr.value.numpy()
        if _op(expr) == "relax.reshape" and isinstance(expr.args[0], Constant):
            return expr.args[0].value.numpy()
        return None


def _bias_of(chains: _Chains, add, produced, channels: int):
    """If ``add`` adds a per-channel constant to ``produced``: the bias as a 1-D array, else None."""
    if _op(add) != "relax.add":
        return None
    a, b = add.args
    other = b if a.same_as(produced) else a if b.same_as(produced) else None
    if other is None:
        return None
    c = chains.const(other)
    if c is None or c.size != channels:
        return None
    shape = tuple(int(d) for d in c.shape)
    if shape not in ((channels,), (1, channels), (1, channels, 1, 1), (channels, 1, 1)):
        return None
    return c.reshape(channels)


def _follow(chains: _Chains, var):
    """The binding that consumes ``var``, when ``var`` is used exactly once inside this block and that
    binding is not part of a chain already replaced."""
    if not chains.single_use(var):
        return None, None
    for v in chains.consumers.get(var, []):
        if v not in chains.claimed:
            return v, chains.value[v]
    return None, None


def _activation(expr) -> int | None:
    op = _op(expr)
    if op == "relax.nn.relu":
        return ACT_RELU
    if op == "relax.clip":
        lo, hi = (float(getattr(a, "value", 0)) for a in expr.args[1:3])
        if lo == 0 and hi == 6:
            return ACT_RELU6
    return None


def _conv_reason(call) -> str | None:
    """Why this conv2d cannot go to cuDNN, or None."""
    a = call.attrs
    if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return f"layout {a.data_layout}/{a.kernel_layout}"
    if _dtype(call) not in DTYPES or _dtype(call.args[0]) != _dtype(call):
        return f"dtype {_dtype(call)}"
    if a.out_dtype and str(a.out_dtype) not in ("", "void", _dtype(call)):
        return f"out_dtype {a.out_dtype}"
    pad = _ints(a.padding)
    if len(pad) != 4 or pad[0] != pad[2] or pad[1] != pad[3]:
        return f"asymmetric padding {pad}"
    if not isinstance(call.args[1], Constant):
        return "weights are not a constant"
    if _shape(call) is None or _shape(call.args[0]) is None:
        return "dynamic shape"
    return None


class _Offloader:
    def __init__(self, workspace_bytes: int, allow_tf32: bool, report: OffloadReport):
        self.ws = workspace_bytes
        self.tf32 = int(allow_tf32)
        self.report = report

    def _call(self, name, args, out, dtype):
        """``call_dps_packed(name, args) -> (out, workspace)``; the caller binds item 0."""
        sinfo = [relax.TensorType(out, dtype), relax.TensorType((self.ws,), "uint8")]
        return relax.op.call_dps_packed(name, relax.Tuple(args), sinfo)

    def conv_chain(self, chains: _Chains, var, call):
        """(vars removed, final var, (vendor call, None)) for the chain starting at conv2d ``var``, or None."""
        why = _conv_reason(call)
        if why:
            self.report.kept.append(("conv2d", why))
            return None
        out_shape, dtype = _shape(call), _dtype(call)
        channels = out_shape[1]
        removed, last, bias, residual, act = [], var, None, None, ACT_NONE
        nxt, val = _follow(chains, last)
        b = _bias_of(chains, val, last, channels) if val is not None else None
        if b is not None:
            bias, removed, last = b, removed + [last], nxt
            nxt, val = _follow(chains, last)
        if val is not None and _op(val) == "relax.add" and bias is not None:
            other = val.args[1] if val.args[0].same_as(last) else val.args[0]
            if (_shape(other) == out_shape and _dtype(other) == dtype and chains.const(other) is None
                    and other not in chains.claimed):
                residual, removed, last = other, removed + [last], nxt
                nxt, val = _follow(chains, last)
        if val is not None and _activation(val) is not None:
            act, removed, last = _activation(val), removed + [last], nxt
        if bias is None:
            bias = np.zeros(channels, dtype=dtype)
        a = call.attrs
        strides, pad, dil = _ints(a.strides), _ints(a.padding), _ints(a.dilation)
        attrs = [strides[0], strides[1], pad[0], pad[1], dil[0], dil[1], int(a.groups), act, -1, self.tf32]
        args = [call.args[0], call.args[1], relax.const(bias.astype(dtype))]
        name = CONV2D
        if residual is not None:
            args.append(residual)
            name = CONV2D_ADD
        return removed, last, (self._call(name, args + [relax.ShapeExpr(attrs)], out_shape, dtype), None)

    def avg_pool(self, call):
        """avg_pool2d as a depthwise cuDNN convolution with constant weights (TVM's default avg_pool2d
        schedule is slow: 29% of inception_v3's batch-1 kernel time on an H100): (new value, scale) or None.
        With ``count_include_pad=False`` and padding, the border divisor is a constant map the output
        is multiplied with."""
        a = call.attrs
        x = call.args[0]
        out_shape, xs, dtype = _shape(call), _shape(x), _dtype(call)
        pad, size, strides, dil = _ints(a.padding), _ints(a.pool_size), _ints(a.strides), _ints(a.dilation)
        why = ("layout" if a.layout != "NCHW" or (a.out_layout and a.out_layout != "NCHW") else
               "ceil_mode" if a.ceil_mode else "dtype" if dtype not in DTYPES else
               "asymmetric padding" if len(pad) != 4 or pad[0] != pad[2] or pad[1] != pad[3] else
               "dilation" if dil != [1, 1] else "dynamic shape" if out_shape is None or xs is None else None)
        if why:
            self.report.kept.append(("avg_pool2d", why))
            return None
        channels, (kh, kw) = xs[1], size
        weight = np.full((channels, 1, kh, kw), 1.0 / (kh * kw), dtype=dtype)
        scale = None
        if not a.count_include_pad and (pad[0] or pad[1]):
            ones = np.pad(np.ones(xs[2:]), ((pad[0], pad[0]), (pad[1], pad[1])))
            counts = sliding_window_view(ones, (kh, kw))[::strides[0], ::strides[1]].sum(axis=(2, 3))
            weight[:] = 1.0
            scale = (1.0 / counts).reshape(1, 1, *counts.shape).astype(dtype)
        attrs = [strides[0], strides[1], pad[0], pad[1], 1, 1, channels, ACT_NONE, -1, self.tf32]
        args = [x, relax.const(weight), relax.const(np.zeros(channels, dtype=dtype)), relax.ShapeExpr(attrs)]
        return self._call(CONV2D, args, out_shape, dtype), scale

    def matmul_chain(self, chains: _Chains, var, call):
        x, w = call.args
        xs, out_shape, dtype = _shape(x), _shape(call), _dtype(call)
        if xs is None or len(xs) != 2 or out_shape is None or dtype not in DTYPES or _dtype(x) != dtype:
            self.report.kept.append(("matmul", "only 2-D fp32/fp16 matmuls"))
            return None
        transpose_b = 0
        weight = chains.const(w)
        if weight is None and isinstance(w, relax.Var) and _op(chains.value.get(w)) == "relax.permute_dims":
            inner = chains.value[w]
            axes = inner.attrs.axes
            if (axes is None or _ints(axes) == [1, 0]) and chains.const(inner.args[0]) is not None:
                weight, transpose_b = chains.const(inner.args[0]), 1
        if weight is None or weight.ndim != 2:
            self.report.kept.append(("matmul", "weights are not a constant 2-D matrix"))
            return None
        n = out_shape[1]
        removed, last, bias, act = [], var, None, ACT_NONE
        nxt, val = _follow(chains, last)
        b = _bias_of(chains, val, last, n) if val is not None else None
        if b is not None:
            bias, removed, last = b, [last], nxt
            nxt, val = _follow(chains, last)
        if val is not None and _activation(val) == ACT_RELU:
            act, removed, last = ACT_RELU, removed + [last], nxt
        if bias is None:
            bias = np.zeros(n, dtype=dtype)
        args = [x, relax.const(weight.astype(dtype)), relax.const(bias.astype(dtype)),
                relax.ShapeExpr([transpose_b, act, self.tf32])]
        return removed, last, (self._call(MATMUL, args, out_shape, dtype), None)


def _use_counts(func: relax.Function) -> dict:
    uses: dict = {}

    def visit(e):
        if isinstance(e, relax.Var):
            uses[e] = uses.get(e, 0) + 1

    for block in func.body.blocks:
        for b in block.bindings:
            relax.analysis.post_order_visit(b.value, visit)
    relax.analysis.post_order_visit(func.body.body, visit)
    return uses


@dataclass
class Offload:
    """One chain the pass can replace: its original bindings (in order), the vendor call replacing the
    final one, and a signature that equal workloads share (what a kernel measurement is keyed by)."""

    block: int  # index of the dataflow block
    bindings: list  # the chain's original VarBindings, in block order
    last: relax.Var  # the var the vendor call's result is bound to
    value: tuple  # (vendor call, constant scale of its output or None)
    signature: str


def _type_str(expr) -> str:
    ty = expr.ty
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        return "x".join(str(int(d)) for d in ty.shape.values) + ":" + str(ty.dtype)
    if isinstance(expr, relax.ShapeExpr):
        return "[" + ",".join(str(int(v)) for v in expr.values) + "]"
    return type(expr).__name__


def _signature(ops: list[str], call) -> str:
    """``conv2d+add+relu -> nimble.cudnn.conv2d(1x64x56x56:float32, ..., [1,1,...])``: the original
    operators (an average pool and a depthwise convolution map to the same vendor call) and the vendor
    call's argument types and attributes."""
    packed = call.args[0]
    args = call.args[1].fields
    return "+".join(ops) + " -> " + str(packed.global_symbol) + "(" + ", ".join(_type_str(a) for a in args) + ")"


def find_offloads(func: relax.Function, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
                  allow_tf32: bool = False, report: OffloadReport | None = None) -> list[Offload]:
    """Every chain of ``func`` that :func:`offload_function` would replace, in program order."""
    report = report if report is not None else OffloadReport()
    off = _Offloader(workspace_bytes, allow_tf32, report)
    uses = _use_counts(func)
    found_all: list[Offload] = []
    for bi, block in enumerate(func.body.blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        chains = _Chains(block, uses)
        taken: set = set()
        for b in block.bindings:
            if b.var in taken:
                continue
            op = _op(b.value)
            found = None
            if op == "relax.nn.conv2d":
                found = off.conv_chain(chains, b.var, b.value)
            elif op == "relax.matmul":
                found = off.matmul_chain(chains, b.var, b.value)
            elif op == "relax.nn.avg_pool2d":
                pooled = off.avg_pool(b.value)
                if pooled:
                    found = [], b.var, pooled
            if found:
                removed, last, value = found
                members = set(removed) | {b.var, last}
                taken.update(members)
                chains.claimed.update(members)
                bindings = [x for x in block.bindings if x.var in members]
                ops = [_op(x.value).split(".")[-1] for x in bindings]
                found_all.append(Offload(bi, bindings, last, value, _signature(ops, value[0])))
    return found_all


def offload_function(func: relax.Function, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
                     allow_tf32: bool = False, report: OffloadReport | None = None,
                     select=None) -> relax.Function:
    """``func`` with its offloadable chains replaced by vendor calls; ``select(offload) -> bool``
    (default: all) picks which ones, e.g. by measured kernel times."""
    report = report if report is not None else OffloadReport()
    chosen = []
    for o in find_offloads(func, workspace_bytes, allow_tf32, report):
        if select is None or select(o):
            chosen.append(o)
            name = str(o.value[0].args[0].global_symbol)
            report.offloaded[name] = report.offloaded.get(name, 0) + 1
        else:
            report.kept.append((o.signature.split(" -> ")[0], "TVM's kernel measured faster"))
    blocks = []
    for bi, block in enumerate(func.body.blocks):
        mine = [o for o in chosen if o.block == bi]
        if not mine:
            blocks.append(block)
            continue
        replace = {o.last: o.value for o in mine}
        drop = {x.var for o in mine for x in o.bindings} - set(replace)
        bindings = []
        for b in block.bindings:
            if b.var in drop:
                continue
            if b.var in replace:
                value, scale = replace[b.var]
                call = relax.DataflowVar(f"{b.var.name}_vendor", value.ty)
                bindings.append(relax.VarBinding(call, value))
                if scale is None:
                    bindings.append(relax.VarBinding(b.var, relax.TupleGetItem(call, 0)))
                else:
                    item = relax.DataflowVar(f"{b.var.name}_sum", b.var.ty)
                    bindings.append(relax.VarBinding(item, relax.TupleGetItem(call, 0)))
                    bindings.append(relax.VarBinding(b.var, relax.op.multiply(item, relax.const(scale))))
            else:
                bindings.append(b)
        blocks.append(relax.DataflowBlock(bindings))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs, func.span)


def OffloadToVendor(workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, allow_tf32: bool = False,
                    report: OffloadReport | None = None, select=None) -> tvm.transform.Pass:
    """Module pass: conv2d / matmul chains of every Relax function to cuDNN / cuBLASLt calls
    (those ``select(offload)`` accepts, when given)."""

    @tvm.transform.module_pass(opt_level=0, name="nimble.OffloadToVendor")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = mod.clone()
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = offload_function(func, workspace_bytes, allow_tf32, report, select)
        return relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))

    return _pass
