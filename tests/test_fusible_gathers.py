"""Gathers fused with their neighbours (relay_passes/fusible_gathers.py): an embedding's index wrap, lookups and sum
are one kernel, its outputs the ONNX reference evaluator's; what is not a gather keeps TVM's pattern; a decoder's
decode step starts with two launches (its embeddings, its mask), not eight."""
import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from tvm import relax

import tvm_nimble
from tvm_nimble import NimbleExecutor
from tvm_nimble.contract import vendor_abi
from tvm_nimble.relay_passes.fusible_gathers import INJECTIVE, OPAQUE, fusible_gathers


def _embeddings(vocab: int = 50, positions: int = 16, dim: int = 8):
    """GPT-2's prologue in ONNX: token and position embeddings looked up (Gathers on axis 0) and summed, then
    scaled."""
    rng = np.random.default_rng(0)
    wte = numpy_helper.from_array(rng.standard_normal((vocab, dim)).astype(np.float32), "wte")
    wpe = numpy_helper.from_array(rng.standard_normal((positions, dim)).astype(np.float32), "wpe")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["wte", "ids"], ["t"], axis=0),
         helper.make_node("Gather", ["wpe", "pos"], ["p"], axis=0),
         helper.make_node("Add", ["t", "p"], ["s"]),
         helper.make_node("Mul", ["s", "two"], ["y"])], "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5]),
         helper.make_tensor_value_info("pos", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, dim])], initializer=[wte, wpe, two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_lookups_and_their_sum_are_one_kernel_that_matches_the_reference():
    model = _embeddings()
    built = tvm_nimble.build(model, "llvm", max_streams=None, timing_cache="off")
    assert len(built.plan.launches) == 1, [l.kernel for l in built.plan.launches]
    ids = np.array([[3, 0, 49, -1, 7]], np.int64)  # -1: the last row, as ONNX's Gather wraps
    pos = np.arange(5, dtype=np.int64)[None]
    (want,) = ReferenceEvaluator(model).run(None, {"ids": ids, "pos": pos})
    (got,) = NimbleExecutor(built)(ids, pos)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)


def _legalized(build) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6), "float32"))
    ids = relax.Var("ids", relax.TensorType((3,), "int64"))
    with bb.function("main", [x, ids]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(build(x, ids)))
        bb.emit_func_output(out)
    return relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(bb.get()))


def _patterns(mod: tvm.IRModule) -> dict:
    return {gv.name_hint: int(f.attrs["op_pattern"]) for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)}


@pytest.mark.parametrize("op, changed", [
    (lambda x, ids: relax.op.take(x, ids, axis=0, mode="clip"), True),
    (lambda x, ids: relax.op.take(x, ids, axis=1, mode="clip"), True),
    (lambda x, ids: relax.op.add(x, x), False),
    # opaque too, but it stores at loaded indices: not a gather
    (lambda x, ids: relax.op.scatter_elements(x, relax.op.reshape(ids, (3, 1)), relax.op.zeros((3, 1), "float32")),
     False),
], ids=["take-rows", "take-columns", "add", "scatter"])
def test_gathers_and_only_gathers_become_injective(op, changed):
    mod = _legalized(op)
    before, after = _patterns(mod), _patterns(fusible_gathers(mod))
    gathers = [name for name, p in before.items() if p == OPAQUE and name.startswith("take")]
    assert bool(gathers) == changed  # TVM calls a gather opaque
    assert after == {name: INJECTIVE if name in gathers else p for name, p in before.items()}


def test_a_decode_steps_prologue_is_two_launches():
    """GPT-2's decode step (built for sm_90 on this CPU): the ids' and positions' wrap, both lookups, their cast and
    sum in one kernel, the mask's reshapes, row pick and select in another; then the first layer's GEMV. At its end
    the head's GEMV writes the float32 logits itself (an output the argmax reads too): no cast kernel between."""
    pytest.importorskip("transformers")
    import decoder_models
    from tvm_nimble import build_generator

    gen = build_generator(decoder_models.tiny_gpt2_past_onnx(), {"kind": "cuda", "arch": "sm_90"}, max_length=64,
                          prefill_lengths=(8,), kernels="vendor", precision="fp16", timing_cache="off")
    kernels = [l.kernel for l in gen.steps[1].plan.launches]
    first = next(i for i, k in enumerate(kernels) if k.startswith("nimble.gemv"))
    assert first == 2, kernels[:first + 1]
    assert kernels[-2:] == [vendor_abi.GEMV_NORM_MATMUL, "greedy_ids"], kernels[-3:]
