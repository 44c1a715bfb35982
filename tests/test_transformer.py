"""Transformers, first piece: a small ViT (zoo ``vit``) through Nimble, its GEMMs on cuBLASLt.

A Linear on [B, T, C] is a GEMM of rank 3: the cuBLASLt provider takes it (the extension folds the
leading dimensions); attention's Q·Kᵀ and ·V become strided-batched GEMMs. Checked against the ONNX reference evaluator, with vendor calls run as the numpy contract of
the extension (tests/vendor_reference.py) on llvm.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.relay_passes.vendor_offload import BATCHED_MATMUL, MATMUL, OffloadReport, OffloadToVendor, find_offloads
from tvm_nimble.runtime.race_check import check_races


@pytest.fixture(scope="module")
def vit():
    model = zoo.get_model("vit")
    inputs = zoo.random_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, inputs)
    other = ReferenceEvaluator(model).run(None, zoo.random_inputs(model, seed=1))[0]
    assert np.linalg.norm(other - ref[0]) > 0.1 * np.linalg.norm(ref[0])  # the reference depends on the input
    return model, inputs, ref


def test_vit_matches_the_reference_and_its_plan_is_race_free(vit):
    model, inputs, ref = vit
    result = build(model, "llvm", max_streams=None)
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-4)
    assert check_races(result, inputs, ref, seeds=range(10)) == []


def test_rank3_linears_and_attention_matmuls_go_to_cublaslt(vit, vendor_reference):
    """Per block: QKV, output projection and two MLP Linears on [1, 16, C], plus the classifier; and the
    attention's Q·Kᵀ (the transpose of K folded into the call) and ·V as batched GEMMs."""
    model, inputs, ref = vit
    mod = from_onnx(model)
    report = OffloadReport()
    offloads = find_offloads(mod["main"], report=report)
    gemms = [o for o in offloads if MATMUL + "(" in o.signature]
    batched = [o for o in offloads if BATCHED_MATMUL in o.signature]
    depth = 2
    assert sum("1x16x" in o.signature for o in gemms) == 4 * depth and len(gemms) == 4 * depth + 1
    assert len(batched) == 2 * depth and {o.provider for o in gemms + batched} == {"cublaslt"}
    assert sum(o.signature.startswith("permute_dims+matmul") and o.signature.endswith("[1,0])") for o in batched) == depth
    assert not [why for op, why in report.kept if op == "matmul"]
    result = build(OffloadToVendor()(mod), "llvm", max_streams=None)
    assert sum(l.kernel == MATMUL for l in result.plan.launches) == len(gemms)
    assert sum(l.kernel == BATCHED_MATMUL for l in result.plan.launches) == len(batched)
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-4)
    assert check_races(result, inputs, ref, seeds=range(5)) == []


def test_on_cuda_the_built_plan_runs_vits_linears_on_cublaslt():
    from tvm_nimble.codegen.vendor_build import vendor_available

    ok, why = vendor_available()
    if not ok:
        pytest.skip(why)
    result = build(zoo.get_model("vit"), {"kind": "cuda", "arch": "sm_90"}, kernels="vendor", compile_kernels=False)
    matmuls = [l for l in result.plan.launches if l.kernel == MATMUL]
    shapes = [result.plan.tensors[l.args[0]].shape for l in matmuls]
    assert len(matmuls) == 9 and sum(len(s) == 3 for s in shapes) == 8
    assert sum(l.kernel == BATCHED_MATMUL for l in result.plan.launches) == 4


def _matmul_add(bias: np.ndarray) -> "onnx.ModelProto":
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w")
    b = numpy_helper.from_array(bias.astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])], "mm_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 6])], initializer=[w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("shape", [(6,), (1, 6), (1, 1, 6), (6, 1), (1, 6, 1), (6, 6)])
def test_only_a_bias_along_the_output_columns_is_fused(shape, vendor_reference):
    """An added constant broadcast along any other axis (here rows and columns both have 6 elements, so
    every shape type-checks) must stay an add: fused as a bias it would give wrong outputs."""
    bias = np.random.default_rng(1).standard_normal(shape)
    model = _matmul_add(bias)
    x = np.random.default_rng(2).standard_normal((1, 6, 8)).astype(np.float32)
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    (offload,) = find_offloads(from_onnx(model)["main"])
    per_column = int(np.prod(shape)) == 6 and shape[-1] == 6
    assert offload.signature.startswith("matmul+add ->" if per_column else "matmul ->")
    out = NimbleExecutor(build(OffloadToVendor()(from_onnx(model)), "llvm"))(x)[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 1, 1), (1, 4, 1, 1), (4,), (1, 4), (4, 1)])
def test_only_a_per_channel_constant_is_fused_into_a_convolution(shape, vendor_reference):
    """Conv output [1, 4, 4, 4]: a (4,) or (1, 4) constant broadcasts along the width, not the channels."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["h", "b"], ["y"])],
        "conv_add", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    (offload,) = find_offloads(from_onnx(model)["main"])
    per_channel = len(shape) >= 3 and shape[-3] == 4
    assert offload.signature.startswith("conv2d+add ->" if per_channel else "conv2d ->")
    out = NimbleExecutor(build(OffloadToVendor()(from_onnx(model)), "llvm"))(x)[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_a_broadcast_batched_matmul_stays_on_tvm_with_a_reason(vendor_reference):
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Relu", ["b"], ["rb"]),
         helper.make_node("MatMul", ["ra", "rb"], ["y"])], "bmm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4, 5]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3, 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    report = OffloadReport()
    assert find_offloads(from_onnx(model)["main"], report=report) == []
    assert report.kept == [("matmul", "a batched matmul needs two static fp32/fp16 tensors of one rank >= 3 with the "
                                      "same batch dimensions")]
    a, b = rng.standard_normal((2, 3, 4, 5)).astype(np.float32), rng.standard_normal((1, 3, 5, 6)).astype(np.float32)
    out = NimbleExecutor(build(OffloadToVendor()(from_onnx(model)), "llvm"))(a, b)[0].numpy()
    np.testing.assert_allclose(out, np.maximum(a, 0) @ np.maximum(b, 0), rtol=1e-5, atol=1e-5)
