"""Batched constant folding (relay_passes/fold_constants.py): the module that comes out is the one TVM's
FoldConstant makes alone, and FoldConstant is left nothing to build (it builds each call on its own)."""
import copy

import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant

from tvm_nimble import zoo
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.relay_passes.fold_constants import BatchedFoldConstant
from tvm_nimble.relay_passes.pipeline import kernel_passes

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


def legalized(model):
    """What FoldConstant gets in TVM's pipelines: the model legalized to call_tir, op patterns annotated."""
    mod = relax.transform.LegalizeOps()(from_onnx(model))
    return relax.transform.AnnotateTIROpPattern()(mod)


def constant_calls(mod, kind: str = "call_tir") -> int:
    """call_tir bindings of ``main`` whose arguments are all constants (or variables bound to one); with
    ``kind="operators"``, the operator calls (before legalization) whose arguments are all constant."""
    constants, count = set(), 0
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, Constant):
                constants.add(b.var)
            elif not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)):
                continue
            elif kind == "call_tir" and v.op.name == "relax.call_tir":
                count += all(isinstance(a, Constant) or a in constants for a in v.args[1].fields)
            elif kind == "operators" and v.op.name != "relax.call_tir":
                count += bool(v.args) and all(isinstance(a, (Constant, relax.ShapeExpr)) or a in constants
                                              for a in v.args)
    return count


@pytest.mark.parametrize("name", ["densenet", "inception", "mobilenet", "vit"])
def test_batched_folding_gives_foldconstants_module_and_leaves_it_nothing_to_build(name):
    mod = legalized(zoo.get_model(name))
    batched = BatchedFoldConstant()(mod)
    if name == "densenet":  # its 13 BatchNormalizations expand their 4 statistics each (the first round)
        assert constant_calls(mod) >= 4 * 13
    assert constant_calls(batched) == 0
    # structural equality compares the constants' bytes too
    assert tvm_ffi.structural_equal(relax.transform.FoldConstant()(batched), relax.transform.FoldConstant()(mod))


@pytest.mark.parametrize("name, dtype", [("densenet", "float16"), ("vit", "bfloat16"), ("inception", "float16")])
def test_a_reduced_precision_builds_casts_fold_as_foldconstant_folds_them(name, dtype):
    """Before legalization (to_precision): the weights' casts and the BatchNormalization statistics are
    operator calls on constants, which FoldConstant legalizes and builds one by one."""
    from tvm_nimble.relay_passes.precision import to_precision

    converted = to_precision(from_onnx(zoo.get_model(name)), dtype, fold=False)
    batched = BatchedFoldConstant()(converted)
    assert constant_calls(converted, "operators") > 0 and constant_calls(batched, "operators") == 0
    assert tvm_ffi.structural_equal(relax.transform.FoldConstant()(batched), relax.transform.FoldConstant()(converted))


def test_every_foldconstant_of_the_pipeline_comes_after_the_batched_one():
    names = [p.info.name for p in kernel_passes(CUDA)]
    folds = [i for i, n in enumerate(names) if n == "FoldConstant"]
    assert folds and all(names[i - 1] == "nimble.BatchedFoldConstant" for i in folds)


def test_a_kernel_is_scheduled_once_per_process_and_gets_the_same_schedule():
    """The kernel choice lowers probes, both modules of its model check and the stock baselines: DLight
    schedules each distinct kernel once, and a kernel met again gets the very schedule (names included: the
    CUDA source, and so the fatbin cache's key, must not depend on what this process lowered before)."""
    from tvm_nimble.compiler.stages import lower
    from tvm_nimble.relay_passes.schedules import PROCESS_SCHEDULES as cache

    model = zoo.densenet()
    renamed = copy.deepcopy(model)  # the same kernels, but the first convolution's input named otherwise
    for node in renamed.graph.node:
        node.input[:] = ["x" if i == "input" else i for i in node.input]
    renamed.graph.input[0].name = "x"
    cache.clear()
    first = lower(from_onnx(model), CUDA)
    scheduled = cache.scheduled
    kernels = sum(isinstance(f, tvm.tirx.PrimFunc) for f in first.functions.values())
    assert 0 < scheduled <= kernels
    again = lower(from_onnx(model), CUDA)
    assert cache.scheduled == scheduled  # nothing scheduled again
    assert cache.reused >= scheduled
    other = lower(from_onnx(renamed), CUDA)
    cache.clear()
    for mod, lowered in ((model, again), (renamed, other)):  # DLight on every kernel again: the reference
        assert lowered.script() == lower(from_onnx(mod), CUDA).script()
        cache.clear()


def test_a_reduced_precision_builds_saturated_casts_fold_with_numpy_and_no_llvm_build(monkeypatch):
    """The BatchNormalization scales a float16 build computes from constants (saturated, then cast: five operator
    calls each) are evaluated with numpy, bit for bit FoldConstant's, with no LLVM build (seconds per build)."""
    from tvm_nimble.relay_passes import fold_constants
    from tvm_nimble.relay_passes.precision import to_precision

    converted = to_precision(from_onnx(zoo.get_model("densenet")), "float16", fold=False)
    builds = []
    real = fold_constants._build_all
    monkeypatch.setattr(fold_constants, "_build_all", lambda funcs: builds.append(len(funcs)) or real(funcs))
    batched = BatchedFoldConstant()(converted)
    assert constant_calls(converted, "operators") > 0 and constant_calls(batched, "operators") == 0
    assert builds == []
    assert tvm_ffi.structural_equal(relax.transform.FoldConstant()(batched), relax.transform.FoldConstant()(converted))
