"""The offload pass: chains of Relax operators to the kernel providers' calls, as ordinary launches.

The pass runs on the imported Relax module, before TVM's legalization. For every anchor operator of a
dataflow block (a conv2d, a matmul, ...), the registered providers that take that operator
(:mod:`.providers`: cuDNN, cuBLASLt, ...) are asked in turn; the first whose matcher accepts the chain
(and which ``select`` keeps, when given) replaces it with one destination-passing call of a global
function of the vendor extension (``codegen/vendor/``), e.g. ``R.call_dps_packed("nimble.cudnn.conv2d",
(x, W, b, R.shape(attrs)), [y, workspace])``. After ``CallTIRRewrite`` that is
``nimble.cudnn.conv2d(x, W, b, attrs, y, ws)``: a kernel of the stream DAG like any TIR kernel, so
stream assignment, the concurrency-safe memory plan and the race checker treat it the same way. The
workspace is an extra output tensor (uint8), so each call gets its own scratch memory and the memory
plan reuses it only where every earlier use happens-before: two streams never share a workspace
while they run.

Only chains whose intermediate values have no other use are replaced; anything else stays with
TVM's kernels, and the :class:`OffloadReport` says why.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from . import providers as registry
from .providers.chains import (ACT_NONE, ACT_RELU, ACT_RELU6, DEFAULT_WORKSPACE_BYTES,  # noqa: F401
                               Chains, Columns, MatchContext, OffloadReport, operator_of, use_counts)
from .providers.cublaslt import BATCHED_MATMUL, MATMUL, MATMUL_ADD  # noqa: F401  (the call names, as tests and references spell them)
from .providers.cudnn import CONV2D, CONV2D_ADD  # noqa: F401


@dataclass
class Offload:
    """One chain the pass can replace: its original bindings (in order), the vendor call replacing the
    final one, and a signature that equal workloads share (what a kernel measurement is keyed by)."""

    block: int  # index of the dataflow block
    bindings: list  # the chain's original VarBindings, in block order
    last: relax.Var  # the var the vendor call's result is bound to
    value: tuple  # (vendor call, what makes the chain's value of its output: None, a constant scale, or Columns)
    signature: str
    provider: str  # the provider whose call replaces the chain
    anchor: relax.Var  # the var of the operator the chain starts at (what providers compete for)


def type_str(expr) -> str:
    """``1x64x56x56:float32`` for a tensor, ``[1,1,0]`` for an attrs shape: how signatures spell arguments."""
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
    return "+".join(ops) + " -> " + str(packed.global_symbol) + "(" + ", ".join(type_str(a) for a in args) + ")"


def find_offloads(func: relax.Function, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
                  allow_tf32: bool = False, report: OffloadReport | None = None, providers=None,
                  select=None) -> list[Offload]:
    """Every chain of ``func`` that :func:`offload_function` would replace, in program order: for each
    anchor, the first of ``providers`` (default: every registered one for CUDA) that accepts its chain
    and that ``select(offload) -> bool`` keeps (default: all)."""
    report = report if report is not None else OffloadReport()
    ctx = MatchContext(workspace_bytes, allow_tf32, report)
    providers = registry.offloading("cuda") if providers is None else providers
    uses = use_counts(func)
    found_all: list[Offload] = []
    for bi, block in enumerate(func.body.blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        chains = Chains(block, uses)
        taken: set = set()
        # the block's bindings read once: a chain's bindings are looked up by position (scanning the block per
        # chain was quadratic, a second per provider on nasnetalarge's 3,000 bindings)
        block_bindings = list(block.bindings)
        position = {x.var: i for i, x in enumerate(block_bindings)}
        for b in block_bindings:
            if b.var in taken:
                continue
            op = operator_of(b.value)
            rejected = None
            noted = len(report.kept)
            for provider in providers:
                matcher = provider.matchers.get(op)
                found = matcher(ctx, chains, b.var, b.value) if matcher else None
                if not found:
                    continue
                removed, last, value = found
                members = set(removed) | {b.var, last}
                bindings = [block_bindings[i] for i in sorted(position[v] for v in members if v in position)]
                ops = [(operator_of(x.value) or "get_item").split(".")[-1] for x in bindings]
                offload = Offload(bi, bindings, last, value, _signature(ops, value[0]), provider.name, b.var)
                if select is not None and not select(offload):
                    rejected = rejected or offload
                    continue
                _claim(members, taken, chains)
                found_all.append(offload)
                break
            else:
                if rejected is not None:  # stays on TVM, but its chain is matched as if replaced, so that
                    # the chains after it are the ones that were measured
                    _claim({b.var, rejected.last} | {x.var for x in rejected.bindings}, taken, chains)
                    report.kept.append((rejected.signature.split(" -> ")[0], "TVM's kernel measured faster"))
            if len(report.kept) - noted > 1:  # providers that decline an operator for the same reason: said once
                report.kept[noted:] = list(dict.fromkeys(report.kept[noted:]))
    return found_all


def _claim(members: set, taken: set, chains: Chains) -> None:
    taken.update(members)
    chains.claimed.update(members)


def offload_function(func: relax.Function, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
                     allow_tf32: bool = False, report: OffloadReport | None = None,
                     select=None, providers=None, found: list[Offload] | None = None) -> relax.Function:
    """``func`` with its offloadable chains replaced by the providers' calls; ``select(offload) -> bool``
    (default: all) picks which ones, e.g. by measured kernel times. ``found``: what :func:`find_offloads`
    gives for these arguments (its report filled already), where the caller has it."""
    report = report if report is not None else OffloadReport()
    chosen = found if found is not None else find_offloads(func, workspace_bytes, allow_tf32, report, providers,
                                                           select)
    for o in chosen:
        name = str(o.value[0].args[0].global_symbol)
        report.offloaded[name] = report.offloaded.get(name, 0) + 1
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
                elif isinstance(scale, Columns):  # the call's first columns
                    item = relax.DataflowVar(f"{b.var.name}_padded", value.ty_args[0].fields[0])
                    bindings.append(relax.VarBinding(item, relax.TupleGetItem(call, 0)))
                    bindings.append(relax.VarBinding(b.var, relax.op.strided_slice(item, [-1], [0], [scale.n])))
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
                    report: OffloadReport | None = None, select=None, providers=None,
                    found_in_main: list[Offload] | None = None) -> tvm.transform.Pass:
    """Module pass: the chains of every Relax function to the calls of ``providers`` (default: every
    registered one for CUDA), those ``select(offload)`` accepts when given. ``found_in_main``: what
    :func:`find_offloads` gives for ``main`` with these arguments, where the caller has it."""

    chosen = registry.offloading("cuda") if providers is None else providers

    @tvm.transform.module_pass(opt_level=0, name="nimble.OffloadToVendor")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = mod.clone()
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                found = found_in_main if gv.name_hint == "main" else None
                mod[gv] = offload_function(func, workspace_bytes, allow_tf32, report, select, chosen, found)
        mod = relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))
        for provider in chosen:
            if provider.rewrite is not None:  # fuses calls the providers made (registry.Provider.rewrite)
                mod = provider.rewrite(mod)
        return mod

    return _pass
