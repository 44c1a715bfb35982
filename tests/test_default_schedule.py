"""TVM's default GPU schedules (DLight) as the pipeline applies them: where the pipeline's guarded rules differ from
stock TVM's on purpose. Kernels only (lowered for sm_90, no GPU): each test reads the thread mapping of the lowered
kernels, and compares it with what stock TVM's own pipeline gives the same module."""
import re

import tvm
from tvm import relax

from tvm_nimble.compiler import stages
from tvm_nimble.compiler.target import resolve_target
from tvm_nimble.relay_passes.pipeline import backend_for

SM90 = resolve_target("cuda", "sm_90")


def _module(build_body, params):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build_body(bb))
        bb.emit_func_output(out)
    return bb.get()


def _block_counts(mod) -> dict[str, list[int]]:
    """The blockIdx.x extents of every scheduled kernel, by PrimFunc name."""
    found = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            found[gv.name_hint] = [int(n) for n in re.findall(
                r'T\.thread_binding\(T\.int64\((\d+)\), thread="blockIdx\.x"\)', func.script())]
    return found


def _stock(mod):
    with SM90:
        return tvm.transform.Sequential(list(backend_for(SM90).legalize_passes(SM90)))(mod)


def test_a_short_reduction_over_many_outputs_gets_a_thread_per_output_not_a_block():
    """25 products into each of 296,352 outputs: stock DLight's GeneralReduction gives every output a block of
    threads over its 25 terms (a grid of 296,352 blocks); the pipeline's guard leaves it to Fallback, a thread per
    output (blocks of 1,024)."""
    x = relax.Var("x", relax.TensorType((1, 42, 42, 168), "float16"))
    w = relax.Var("w", relax.TensorType((168, 5, 5, 1), "float16"))

    def body(bb):
        y = bb.emit(relax.op.nn.conv2d(x, w, padding=[2, 2, 2, 2], groups=168, data_layout="NHWC",
                                       kernel_layout="OHWI", out_dtype="float32"))
        return bb.emit(relax.op.astype(y, "float16"))

    mod = _module(body, [x, w])
    outputs = 42 * 42 * 168
    stock = [n for name, ns in _block_counts(_stock(mod)).items() if "conv2d" in name for n in ns]
    ours = [n for name, ns in _block_counts(stages.lower(mod, SM90)).items() if "conv2d" in name for n in ns]
    assert stock == [outputs]  # the block per output this guards against (TVM 0.27's DLight)
    assert ours and max(ours) <= -(-outputs // 1024)


def test_a_long_reduction_keeps_dlights_schedule():
    """A softmax over 768 columns of 197 rows (few outputs, long reductions) is scheduled as stock DLight does."""
    x = relax.Var("x", relax.TensorType((197, 768), "float32"))
    mod = _module(lambda bb: bb.emit(relax.op.nn.softmax(x, axis=-1)), [x])
    stock, ours = _block_counts(_stock(mod)), _block_counts(stages.lower(mod, SM90))
    assert ours == stock and any(197 in ns for ns in ours.values())


def test_a_3x3_average_pool_also_gets_a_thread_per_output():
    """An average pool is a sum and a division: stock DLight gives each of its 150,528 outputs a block; ours does
    not (inception_v3's and nasnetalarge's pools that stay on TVM's kernels)."""
    x = relax.Var("x", relax.TensorType((1, 192, 28, 28), "float32"))
    mod = _module(lambda bb: bb.emit(relax.op.nn.avg_pool2d(x, (3, 3), (1, 1), (1, 1, 1, 1))), [x])
    outputs = 192 * 28 * 28
    stock = [n for ns in _block_counts(_stock(mod)).values() for n in ns]
    ours = [n for ns in _block_counts(stages.lower(mod, SM90)).values() for n in ns]
    assert stock == [outputs]
    assert ours and max(ours) <= -(-outputs // 1024)


def test_the_stock_schedule_is_one_variable_away_for_experiments(monkeypatch):
    """NIMBLE_STOCK_REDUCTION_SCHEDULES gives the stock block per output back (an A/B for GPU experiments)."""
    from tvm_nimble.relay_passes import tvm_compat

    x = relax.Var("x", relax.TensorType((1, 192, 28, 28), "float32"))
    mod = _module(lambda bb: bb.emit(relax.op.nn.avg_pool2d(x, (3, 3), (1, 1), (1, 1, 1, 1))), [x])
    monkeypatch.setenv(tvm_compat.STOCK_REDUCTIONS_ENV, "1")
    monkeypatch.setattr(tvm_compat, "_SCHEDULED", {})  # this process's schedules, made with the guard on
    assert _block_counts(stages.lower(mod, SM90)) == _block_counts(_stock(mod))
    from tvm_nimble.compiler.timing_cache import context_of  # and its measurements are kept apart

    with_stock = context_of(SM90)
    monkeypatch.delenv(tvm_compat.STOCK_REDUCTIONS_ENV)
    assert with_stock == {**context_of(SM90), "stock_reductions": True}
