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
structurally equal). An operator call on constants in a dataflow block (before legalization: the
weights' casts of a reduced-precision build, 41 s of densenet121's fp16 build alone) is legalized
as ``FoldConstant`` does, all of a round's together, and evaluated with the rest. A call it cannot fold
(a PrimFunc that does not build for ``llvm``, a legalization that is not one ``call_tir``, a tuple output,
symbolic shapes) is left as it is, for ``FoldConstant`` to decide as before.

The operator calls whose result numpy gives bit for bit (:data:`_NUMPY_OPS`: IEEE arithmetic and square root in
float32, comparisons and ``where``, casts between float32 and float16, axis moves) are evaluated with numpy, with
no legalization and no LLVM build: a reduced-precision build saturates and casts every BatchNormalization's
computed scale (five calls each, 485 chains in densenet121), which took 9 of its 12 s of precision conversion
through LLVM, in every build, warm ones included. The tests check the module is still FoldConstant's.
"""
from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant

_CALL_TIR = "relax.call_tir"
#: FoldConstant evaluates on the CPU with this target
_EVAL_TARGET = "llvm"
#: the rounds are the depth of constant chains (a BatchNormalization's is three, then five to saturate and cast its
#: scale in a reduced-precision build); a bound keeps a pathological module from looping: what is left goes to
#: FoldConstant unchanged
MAX_ROUNDS = 32


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


def _constant_args(call, constants: dict, shapes: dict) -> list | None:
    """``call``'s arguments with the variables bound to a constant or a shape put in (as FoldConstant does),
    or None if one is not constant."""
    args = []
    for a in call.args:
        if isinstance(a, relax.Var):
            a = constants[a] if a in constants else shapes.get(a)
            if a is None:
                return None
        if isinstance(a, relax.Tuple):
            fields = [constants.get(f, f) if isinstance(f, relax.Var) else f for f in a.fields]
            if not all(isinstance(f, Constant) for f in fields):
                return None
            a = relax.Tuple(fields)
        elif not isinstance(a, (Constant, relax.ShapeExpr)):
            return None
        args.append(a)
    return args


def _operator_call(value, constants: dict, shapes: dict):
    """``value`` with its constants put in, if it is an operator call FoldConstant legalizes and evaluates
    (every argument constant; before legalization: the casts of weights ``to_precision`` makes), else None."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name != _CALL_TIR):
        return None
    if value.op.get_attr("FLegalize") is None:
        return None
    args = _constant_args(value, constants, shapes)
    return None if args is None else relax.Call(value.op, args, value.attrs, value.ty_args)


def _elementwise(fn, dtypes: tuple):
    return lambda call, args: fn(*args) if all(str(a.dtype) in dtypes for a in args) else None


_FLOAT32 = ("float32",)
_COMPARABLE = ("float32", "float16")
#: relax operator -> (call, its arguments as numpy arrays) -> the value numpy computes, or None where numpy might
#: differ from TVM's LLVM evaluation (other dtypes: integer division rounds otherwise, float16 arithmetic, NaN rules
#: of maximum and minimum; bfloat16 casts, whose rounding TVM legalizes itself; integer comparisons, which
#: FoldConstant leaves in place in an imported model's index arithmetic)
_NUMPY_OPS = {
    "relax.add": _elementwise(np.add, _FLOAT32),
    "relax.subtract": _elementwise(np.subtract, _FLOAT32),
    "relax.multiply": _elementwise(np.multiply, _FLOAT32),
    "relax.divide": _elementwise(np.divide, _FLOAT32),
    "relax.negative": _elementwise(np.negative, _FLOAT32),
    "relax.sqrt": _elementwise(np.sqrt, _FLOAT32),
    "relax.less": _elementwise(np.less, _COMPARABLE),
    "relax.less_equal": _elementwise(np.less_equal, _COMPARABLE),
    "relax.greater": _elementwise(np.greater, _COMPARABLE),
    "relax.greater_equal": _elementwise(np.greater_equal, _COMPARABLE),
    "relax.equal": _elementwise(np.equal, _COMPARABLE),
    "relax.not_equal": _elementwise(np.not_equal, _COMPARABLE),
    "relax.where": lambda call, args: (np.where(*args) if str(args[0].dtype) == "bool"
                                       and {str(a.dtype) for a in args[1:]} <= set(_COMPARABLE) else None),
    "relax.astype": lambda call, args: (args[0].astype(str(call.attrs.dtype))
                                        if {str(args[0].dtype), str(call.attrs.dtype)} <= {"float32", "float16"}
                                        else None),
    "relax.expand_dims": lambda call, args: np.expand_dims(args[0], tuple(int(a) for a in call.attrs.axis)),
    "relax.permute_dims": lambda call, args: np.transpose(
        args[0], None if call.attrs.axes is None else [int(a) for a in call.attrs.axes]),
    "relax.squeeze": lambda call, args: np.squeeze(
        args[0], None if call.attrs.axis is None else tuple(int(a) for a in call.attrs.axis)),
}


def _numpy_value(call, ty):
    """The constant ``call`` (an operator call whose arguments are constants, of type ``ty``) evaluates to, computed
    by numpy where :data:`_NUMPY_OPS` has it and the result has that type's static shape and dtype; else None."""
    fn = _NUMPY_OPS.get(call.op.name)
    out = _static_tensor(ty)
    if fn is None or out is None or not all(isinstance(a, Constant) for a in call.args):
        return None
    value = fn(call, [a.value.numpy() for a in call.args])
    if value is None or tuple(value.shape) != out[0] or str(value.dtype) != out[1]:
        return None
    return relax.const(np.ascontiguousarray(value))


def _legalized_calls(calls: list) -> tuple[tvm.IRModule, list]:
    """The operator ``calls`` (constant arguments) legalized as FoldConstant legalizes them, in one module:
    (that module, per call its ``call_tir`` or None where the legalization is not a single one)."""
    bb = relax.BlockBuilder()
    with bb.function("nimble_fold", []):
        with bb.dataflow():
            outs = [bb.emit(c) for c in calls]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    values = {b.var: b.value for blk in mod["nimble_fold"].body.blocks for b in blk.bindings}
    legal = []
    for var in outs:
        v = values.get(var)
        legal.append(v if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == _CALL_TIR else None)
    return mod, legal


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
    dataflow = [isinstance(blk, relax.DataflowBlock) for blk in func.body.blocks]
    constants = {b.var: b.value for blk in blocks for b in blk
                 if isinstance(b, relax.VarBinding) and isinstance(b.value, Constant)}
    shapes = {b.var: b.value for blk in blocks for b in blk
              if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.ShapeExpr)}
    folded = 0
    for _ in range(MAX_ROUNDS):
        todo = []  # (block, position, PrimFunc, arrays, shape, dtype)
        ops = []  # (block, position, the operator call with its constants put in)
        for bi, blk in enumerate(blocks):
            for pos, b in enumerate(blk):
                if not isinstance(b, relax.VarBinding):
                    continue
                if found := _foldable(b.value, mod, constants):
                    todo.append((bi, pos, *found))
                elif dataflow[bi] and (call := _operator_call(b.value, constants, shapes)) is not None:
                    ops.append((bi, pos, call))  # FoldConstant folds an operator in a dataflow block only
        by_numpy = {(bi, pos): const for bi, pos, call in ops
                    if (const := _numpy_value(call, blocks[bi][pos].value.ty)) is not None}
        for (bi, pos), const in by_numpy.items():
            var = blocks[bi][pos].var
            blocks[bi][pos] = relax.VarBinding(var, const)
            constants[var] = const
        folded += len(by_numpy)
        ops = [op for op in ops if (op[0], op[1]) not in by_numpy]
        if by_numpy and not ops and not todo:
            continue  # the next round sees their values (they may feed the rest)
        if ops:  # legalized together, as FoldConstant legalizes each, then evaluated with the call_tir ones
            legal_mod, legal = _legalized_calls([c for _, _, c in ops])
            for (bi, pos, _), call in zip(ops, legal):
                if call is not None and (found := _foldable(call, legal_mod, {})):
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
