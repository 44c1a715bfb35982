"""The cuBLASLt algorithm of each GEMM, chosen by measurement (part of ``kernels="best"``).

cuBLASLt's heuristic lists several algorithms for a GEMM; its first is often not the fastest at the
small M of batch-1 inference (too few output tiles for the SMs: on an H100, BERT-base's QKV GEMM
16.6 us with the third candidate against 27.1 us with the first). Every distinct cuBLASLt call of the
selected module is timed here, each candidate over back-to-back calls on this machine's GPU
(``nimble.cublas.matmul_timings``, through the timer's ``gemm_us``), and the index of the fastest is
written into the call's attrs, so the artifact runs what was measured. A candidate must beat the
heuristic's first by 3% to replace it (timing noise is not a reason to differ from the library's
default). Without a GPU of the target's arch here (a remote-measured build) the heuristic's first
stays. The candidates' times are kept in the timing cache (:mod:`.timing_cache`), per GEMM signature.

Our fp32 GEMM (provider ``simt_gemm``) is chosen the same way among its tile and split-K candidates
(``nimble.gemm.matmul_timings``); its index 0 is no library default, so the fastest is always baked in
(a call without an index would measure them again on its first run).
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_nimble.contract import vendor_abi
from tvm_nimble.relay_passes.providers import cublaslt, provider_of, simt_gemm, tf32x3
from tvm_nimble.relay_passes.vendor_offload import BATCHED_MATMUL, MATMUL, MATMUL_ADD, type_str

from . import timing_cache
from .report import GemmAlgorithm

#: calls per candidate timing
REPS = 20
#: how much faster than the heuristic's first a candidate must be to be chosen
MARGIN = 0.97

_TIMINGS = {MATMUL: vendor_abi.CUBLAS_MATMUL_TIMINGS, MATMUL_ADD: vendor_abi.CUBLAS_MATMUL_ADD_TIMINGS,
            BATCHED_MATMUL: vendor_abi.CUBLAS_BATCHED_MATMUL_TIMINGS,
            simt_gemm.MATMUL: vendor_abi.GEMM_MATMUL_TIMINGS, simt_gemm.MATMUL_ADD: vendor_abi.GEMM_MATMUL_ADD_TIMINGS,
            # provider tf32x3's calls are cuBLASLt's Linear under other names: the same candidates, the same timings
            tf32x3.MATMUL: vendor_abi.CUBLAS_MATMUL_TIMINGS, tf32x3.MATMUL_ADD: vendor_abi.CUBLAS_MATMUL_ADD_TIMINGS}
_ATTRS_LEN = {MATMUL: 3, MATMUL_ADD: 3, BATCHED_MATMUL: 2,  # without the algorithm index
              simt_gemm.MATMUL: 1, simt_gemm.MATMUL_ADD: 1, tf32x3.MATMUL: 3, tf32x3.MATMUL_ADD: 3}


def gemm_calls(mod: tvm.IRModule):
    """(binding, function name, signature) of every cuBLASLt call in ``mod["main"]`` whose attrs carry
    no algorithm index yet."""
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if not (isinstance(v, relax.Call) and v.op.same_as(tvm.ir.Op.get("relax.call_dps_packed"))):
                continue
            name = str(v.args[0].global_symbol)
            if name in _TIMINGS and len(v.args[1].fields[-1].values) == _ATTRS_LEN[name]:
                yield b, name, _signature(name, v)


def _signature(name: str, call) -> str:
    args = ", ".join(type_str(a) for a in call.args[1].fields)
    return f"{name}({args}) -> " + ", ".join("x".join(str(int(d)) for d in t.shape.values) + ":" + str(t.dtype)
                                            for t in call.ty.fields)


def with_algorithms(mod: tvm.IRModule, chosen: dict[str, int]) -> tvm.IRModule:
    """``mod`` with the algorithm index ``chosen[signature]`` appended to the attrs of each GEMM call listed
    there."""
    replace = {}
    for b, _name, sig in gemm_calls(mod):
        if sig in chosen:
            call = b.value
            fields = list(call.args[1].fields)
            fields[-1] = relax.ShapeExpr([int(x) for x in fields[-1].values] + [int(chosen[sig])])
            replace[b.var] = relax.Call(call.op, [call.args[0], relax.Tuple(fields)], call.attrs, call.ty_args)
    if not replace:
        return mod
    func = mod["main"]
    blocks = []
    for block in func.body.blocks:
        bindings = [relax.VarBinding(b.var, replace[b.var]) if b.var in replace else b for b in block.bindings]
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    out = mod.clone()
    out["main"] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                                 func.attrs, func.span)
    return out


def choose_gemm_algorithms(mod: tvm.IRModule, session) -> tuple[tvm.IRModule, list[GemmAlgorithm]]:
    """``mod`` with each cuBLASLt call's fastest algorithm measured on the build session's GPU (a timer that
    cannot time them, such as a remote one, leaves the heuristic's first), and a record per distinct call: its
    signature, the candidates' microseconds and the index chosen. The times are kept in the session's cache
    (kind ``gemm``, by the call's signature)."""
    timer = session.timer
    if getattr(timer, "gemm_us", None) is None or not session.can_measure():
        return mod, []
    chosen, records, seen = {}, [], set()
    for b, name, sig in gemm_calls(mod):
        if sig in seen:
            continue
        seen.add(sig)
        us = session.measured(session.key("gemm", signature=sig, reps=REPS),
                              lambda: timer.gemm_us(_TIMINGS[name], b.value, REPS), valid=timing_cache.numbers())
        best = int(np.argmin(us)) if us else 0
        provider = provider_of(name).name
        # cuBLASLt's candidate 0 is its heuristic's first, the library's default: kept unless beaten by MARGIN
        default_first = provider in (cublaslt.PROVIDER.name, tf32x3.PROVIDER.name)
        index = best if us and (not default_first or us[best] < MARGIN * us[0]) else 0
        if us and (index or not default_first):  # index 0 of cuBLASLt is what a call without one runs
            chosen[sig] = index
        records.append(GemmAlgorithm(sig, tuple(round(x, 2) for x in us), index, provider))
    return with_algorithms(mod, chosen), records

