"""Constant folding with one LLVM build per round instead of one per folded call.

TVM's ``FoldConstant`` evaluates every ``call_tir`` whose arguments are all constants by building its
PrimFunc for ``llvm`` on its own, and its cache of built functions never hits in TVM 0.27 (it stores
each function under a copy with another global symbol and looks it up under the original). The ONNX
importer turns every inference BatchNormalization into six such calls on its statistics (four
``expand_dims``, ``var + eps``, ``sqrt``), so densenet121 (121 of them) paid 726 separate builds, about
23 s of a 28 s lowering on a CPU, and the kernel choice lowers its probes and model checks again.

:func:`BatchedFoldConstant` runs right before ``FoldConstant`` and does the same evaluation in rounds:
every call whose arguments are constants (or variables bound to one) is evaluated with all the distinct
PrimFuncs of its round built as one module, and its binding becomes the constant. ``FoldConstant`` then
finds nothing left to build; it still inlines the constants into their uses and removes the dead
bindings, so the module that comes out is the one ``FoldConstant`` alone makes (the same PrimFuncs,
built for the same target, on the same inputs: ``tests/test_fold_constants.py`` checks it is
structurally equal). A call it cannot fold (a PrimFunc that does not build for ``llvm``, a tuple
output, symbolic shapes) is left as it is, for ``FoldConstant`` to decide as before.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant

_CALL_TIR = "relax.call_tir"
#: FoldConstant evaluates on the CPU with this target
_EVAL_TARGET = "llvm"
#: the rounds are the depth of constant chains (a BatchNormalization's is three); a bound keeps a
#: pathological module from looping: what is left goes to FoldConstant unchanged
MAX_ROUNDS = 16


def _static_tensor(ty) -> tuple[tuple[int, ...], str] | None:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = []
    for v in ty.shape.values:
        if not isinstance(v, tvm.tirx.IntImm):
            return None
        dims.append(int(v.value))
    return tuple(dims), str(ty.dtype)


def _foldable(call, mod: tvm.IRModule, constants: dict):
    """(PrimFunc, argument arrays, output shape, dtype) when FoldConstant would evaluate ``call``, else None."""
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == _CALL_TIR):
        return None
    if len(call.args) != 2 or len(call.ty_args) != 1 or not isinstance(call.args[1], relax.Tuple):
        return None  # symbolic TIR arguments, or not one output: FoldConstant does not fold these either
    gv = call.args[0]
    func = mod.functions.get(gv) if isinstance(gv, relax.GlobalVar) else None
    if not isinstance(func, tvm.tirx.PrimFunc):
        return None
    arrays = []
    for arg in call.args[1].fields:
        const = arg if isinstance(arg, Constant) else constants.get(arg)
        if const is None:
            return None
        arrays.append(const.value)
    out = _static_tensor(call.ty_args[0])
    return None if out is None else (func, arrays, *out)


def _build_all(funcs: list) -> list | None:
    """The built entry of each PrimFunc in ``funcs``, all compiled as one module; None if it does not build."""
    mod = tvm.IRModule({f"nimble_fold_{i}": f.with_attr("global_symbol", f"nimble_fold_{i}")
                        for i, f in enumerate(funcs)})
    try:
        built = tvm.tirx.build(mod, target=tvm.target.Target(_EVAL_TARGET))
    except tvm.error.TVMError:
        return None  # FoldConstant builds them one by one and skips the ones that fail
    return [built[f"nimble_fold_{i}"] for i in range(len(funcs))]


def fold_function(func: relax.Function, mod: tvm.IRModule) -> tuple[relax.Function, int]:
    """(``func`` with every constant call of its top-level blocks evaluated, how many were)."""
    if not isinstance(func.body, relax.SeqExpr):
        return func, 0
    blocks = [list(blk.bindings) for blk in func.body.blocks]
    constants = {b.var: b.value for blk in blocks for b in blk
                 if isinstance(b, relax.VarBinding) and isinstance(b.value, Constant)}
    folded = 0
    for _ in range(MAX_ROUNDS):
        todo = []  # (block, position, PrimFunc, arrays, shape, dtype)
        for bi, blk in enumerate(blocks):
            for pos, b in enumerate(blk):
                if isinstance(b, relax.VarBinding) and (found := _foldable(b.value, mod, constants)):
                    todo.append((bi, pos, *found))
        if not todo:
            break
        distinct: list = []  # one build per structurally distinct PrimFunc, as FoldConstant's cache means to
        index: dict = {}
        which = []
        for _, _, f, *_ in todo:
            key = tvm_ffi.structural_hash(f)
            at = next((i for i in index.get(key, []) if tvm_ffi.structural_equal(distinct[i], f)), None)
            if at is None:
                at = len(distinct)
                distinct.append(f)
                index.setdefault(key, []).append(at)
            which.append(at)
        built = _build_all(distinct)
        if built is None:
            break
        for (bi, pos, _, arrays, shape, dtype), at in zip(todo, which):
            out = tvm.runtime.empty(shape, dtype, tvm.cpu())
            built[at](*arrays, out)
            const = relax.const(out)
            var = blocks[bi][pos].var
            blocks[bi][pos] = relax.VarBinding(var, const)
            constants[var] = const
        folded += len(todo)
    if not folded:
        return func, 0
    seq = relax.SeqExpr([type(blk)(b) for blk, b in zip(func.body.blocks, blocks)], func.body.body)
    return relax.Function(func.params, seq, func.ret_ty, func.is_pure, func.attrs, func.span), folded


def BatchedFoldConstant() -> tvm.transform.Pass:
    """Module pass: :func:`fold_function` on every Relax function (put it right before ``FoldConstant``)."""

    @tvm.transform.module_pass(opt_level=0, name="nimble.BatchedFoldConstant")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = None
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function):
                new, count = fold_function(func, mod)
                if count:
                    out = out or mod.clone()
                    out[gv] = new
        return out or mod

    return _pass
