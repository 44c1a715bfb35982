"""A probe module: every distinct offloadable chain of a model, each on its own, in one function.

Choosing cuDNN/cuBLASLt or TVM per operator needs both kernels timed on the GPU the model will run
on. Timing them inside the full model would need a map from each chain to the fused TIR kernels
TVM makes of it, which fusion does not keep. The probe side-steps that: it holds one copy of each
distinct chain (by :attr:`Offload.signature`) with its own inputs as parameters and its result as
one field of the output tuple. Built with TVM's kernels and again with the vendor offload, every
launch of either build feeds exactly one output, so a per-launch profile sums to a per-chain time.
The chains keep their original operators, so TVM legalizes and fuses them as it does in the model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant

from .precision import ATTR_ELEMENTWISE_FP32
from .providers.chains import const_value, operands
from .vendor_offload import Offload, find_offloads

#: operators through which a chain reaches its constant weights (reshape of a bias, transpose of a
#: matmul's weights); their bindings are copied into the probe instead of becoming parameters
_CONSTANT_VIEWS = ("relax.reshape", "relax.permute_dims")


@dataclass
class Probe:
    """The probe module and, per output field, the signature it measures and how often it occurs."""

    mod: tvm.IRModule
    signatures: list[str]
    counts: list[int]


def _constant_view(value) -> bool:
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _CONSTANT_VIEWS
            and isinstance(value.args[0], Constant))


def _substitute(value, var_map: dict):
    if isinstance(value, Constant):  # an index computed from constants, evaluated (see _inputs)
        return value
    if isinstance(value, relax.TupleGetItem):  # an item of a split the chain reads through
        return relax.TupleGetItem(var_map.get(value.tuple_value, value.tuple_value), value.index)
    if not isinstance(value, relax.Call):
        raise TypeError(f"unexpected binding in an offload chain: {type(value).__name__}")
    args = [var_map.get(a, a) if isinstance(a, relax.Var) else a for a in value.args]
    return relax.Call(value.op, args, value.attrs, value.ty_args)


def _constant_index(var, bound: dict):
    """A small integer tensor computed from constants (the ONNX importer's Gather index that picks Q, K or V
    out of a QKV tensor) as a constant, else None. As a parameter it would hide the index from a provider
    that needs it (the attention kernel takes nothing in the probe, and its time would be TVM's, built
    and measured twice)."""
    ty = var.ty
    if not (isinstance(ty, relax.TensorType) and str(ty.dtype).startswith("int") and ty.ndim in (0, 1)):
        return None
    value = const_value(bound, var)
    return None if value is None else relax.const(np.asarray(value, dtype=str(ty.dtype)))


def _inputs(offload: Offload, bound: dict) -> tuple[list, list, list]:
    """(parameters, constant-view bindings to copy, the chain's bindings to emit) of one chain, parameters in
    first-use order. A parameter is a tensor: an item of a tuple computed outside the chain (the Split of a fused
    QKV projection whose other items the model also reads elsewhere, e.g. as a key/value cache output) is the
    input, not the tuple, and its item binding is not emitted."""
    members = {b.var for b in offload.bindings}
    items = {b.var for b in offload.bindings
             if isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value not in members}
    inside = members - items
    emitted = [b for b in offload.bindings if b.var not in items]
    params, views, seen = [], [], set()
    for b in emitted:
        for a in operands(b.value):
            if not isinstance(a, relax.Var) or a in inside or a in seen:
                continue
            seen.add(a)
            value = bound.get(a)
            index = _constant_index(a, bound)
            if value is not None and _constant_view(value):
                views.append(relax.VarBinding(a, value))
            elif index is not None:
                views.append(relax.VarBinding(a, index))
            else:
                params.append(a)
    return params, views, emitted


def build_probe(mod: tvm.IRModule, func_name: str = "main", allow_tf32: bool = False,
                providers=None, offloads=None, key=None) -> Probe | None:
    """The probe of ``mod[func_name]`` for the chains ``providers`` (default: all registered) would take,
    or None when there are none (``allow_tf32`` as the offload will use it: it is part of the signatures).
    ``offloads``: what ``find_offloads`` gives for them, where the caller has it already. ``key``: what makes
    two chains the same (default: their signatures; :func:`chain_keys` for the chains of several providers),
    which the probe's ``signatures`` then hold."""
    func = mod[func_name]
    if offloads is None:
        offloads = find_offloads(func, allow_tf32=allow_tf32, providers=providers)
    if not offloads:
        return None
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    first: dict = {}
    counts: dict = {}
    for o in offloads:
        k = o.signature if key is None else key(o)
        first.setdefault(k, o)
        counts[k] = counts.get(k, 0) + 1
    plan = []  # (offload, {original param var: probe param}, views, the chain's bindings to emit)
    all_params = []
    for i, o in enumerate(first.values()):
        params, views, emitted = _inputs(o, bound)
        fresh = {p: relax.Var(f"c{i}_{k}", p.ty) for k, p in enumerate(params)}
        all_params.extend(fresh.values())
        plan.append((o, fresh, views, emitted))
    bb = relax.BlockBuilder()
    with bb.function("main", all_params):
        with bb.dataflow():
            outs = []
            for o, var_map, views, emitted in plan:
                var_map = dict(var_map)
                for b in views + emitted:
                    var_map[b.var] = bb.emit(_substitute(b.value, var_map))
                outs.append(var_map[o.last])
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    probe = bb.get()
    # a reduced-precision model's mark for the lowering (fp32 element-wise chains, and TVM's convolutions and GEMMs
    # accumulating in fp32 with a rounding cast after them): without it the probe's TVM kernels would be other
    # kernels than the model's (fp16 accumulators, no cast; nasnetalarge fp16: a convolution fused with its cast
    # took 0.55 ms in the model and far less in the probe, so a mix of TVM kernels chosen there lost 5x)
    mark = func.attrs.get(ATTR_ELEMENTWISE_FP32) if func.attrs else None
    if mark is not None:
        probe["main"] = probe["main"].with_attr(ATTR_ELEMENTWISE_FP32, mark)
    return Probe(probe, list(first), [counts[s] for s in first])


def chain_keys(mod: tvm.IRModule, offloads, func_name: str = "main") -> dict[str, int]:
    """{signature: the structural hash of its chain's operators, with their inputs as parameters} for the first
    offload of each signature: the same for every provider that takes the same chain (a signature names the
    provider's call), so TVM's kernels for a chain several providers offer are built and timed once."""
    keys: dict[str, int] = {}
    for o in offloads:
        if o.signature not in keys:
            keys[o.signature] = tvm_ffi.structural_hash(build_probe(mod, func_name, offloads=[o]).mod["main"])
    return keys
