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
from tvm_nimble.contract import vendor_abi
from tvm_nimble.relay_passes import providers
from tvm_nimble.relay_passes.providers.attention import (CUDNN_SDPA, SDPA, SDPA_BIAS, SPLIT_SDPA, SPLIT_SDPA_BIAS,
                                                          TILE_SDPA, TILE_SDPA_BIAS, CLUSTER_SDPA,
                                                          CLUSTER_SDPA_BIAS)
from tvm_nimble.relay_passes.providers.norm import LAYER_NORM
from tvm_nimble.relay_passes.vendor_offload import (BATCHED_MATMUL, MATMUL, MATMUL_ADD, OffloadReport, OffloadToVendor,
                                                    find_offloads)
from tvm_nimble.runtime.race_check import check_races


@pytest.fixture(scope="module", params=["gather", "split"])
def vit(request):
    model = zoo.get_model("vit", unbind=request.param)
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


def _run_offloaded(mod, inputs, ref, **offload):
    result = build(OffloadToVendor(**offload)(mod), "llvm", max_streams=None)
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-4)
    assert check_races(result, inputs, ref, seeds=range(5)) == []
    return result


def test_attention_is_one_fused_call_reading_the_qkv_linear_in_place(vit, vendor_reference):
    """Per block: the head split (reshape, permute, three Gathers), Q·Kᵀ, the scale, the softmax, ·V and
    the head merge become one call that reads the QKV Linear's output [1, 16, 96] through strided views;
    the Linears on [1, 16, C] and the classifier go to cuBLASLt. The numpy contract of the call
    (tests/vendor_reference.py) reproduces the ONNX reference, so the strides and the scale are right."""
    model, inputs, ref = vit
    mod = from_onnx(model)
    report = OffloadReport()
    offloads = find_offloads(mod["main"], report=report)
    depth = 2
    fused = [o for o in offloads if o.provider == "attention"]
    gemms = [o for o in offloads if MATMUL + "(" in o.signature or MATMUL_ADD + "(" in o.signature]
    # the output projection and the second MLP Linear take their block's residual add along
    assert sum(o.signature.startswith("matmul+add+add -> " + MATMUL_ADD + "(") for o in gemms) == 2 * depth
    assert len(fused) == depth and all(f"{SDPA}(1x16x96:float32, 1x16x96:float32, 1x16x96:float32, " in o.signature
                                       for o in fused)
    # the head split is read in place: three Gathers, or a Split and its three items and Squeezes
    assert all(o.signature.split(" -> ")[0].count("take") == 3 or o.signature.count("squeeze") == 3 for o in fused)
    assert len(gemms) == 4 * depth + 1 and not [o for o in offloads if BATCHED_MATMUL in o.signature]
    assert not report.kept
    result = _run_offloaded(mod, inputs, ref)
    assert sum(l.kernel == SDPA for l in result.plan.launches) == depth
    assert sum(l.kernel == MATMUL_ADD for l in result.plan.launches) == 2 * depth
    assert not [l for l in result.plan.launches if "softmax" in l.kernel or l.kernel == "fused_add"]
    assert sum("transpose" in l.kernel for l in result.plan.launches) == 1  # the patch embedding's, no head's


def test_without_fused_attention_the_attention_matmuls_go_to_cublaslt(vit, vendor_reference):
    """With the providers restricted to cuBLASLt: per block the QKV, output projection and two MLP
    Linears on [1, 16, C], plus the classifier; Q·Kᵀ (the transpose of K folded into the call) and ·V
    as strided-batched GEMMs."""
    model, inputs, ref = vit
    mod = from_onnx(model)
    report = OffloadReport()
    only = [providers.get("cublaslt")]
    offloads = find_offloads(mod["main"], report=report, providers=only)
    gemms = [o for o in offloads if MATMUL + "(" in o.signature or MATMUL_ADD + "(" in o.signature]
    batched = [o for o in offloads if BATCHED_MATMUL in o.signature]
    depth = 2
    assert sum("1x16x" in o.signature for o in gemms) == 4 * depth and len(gemms) == 4 * depth + 1
    assert len(batched) == 2 * depth and {o.provider for o in gemms + batched} == {"cublaslt"}
    folded = sum(o.signature.startswith("permute_dims+matmul") and o.signature.endswith("[1,0])") for o in batched)
    assert folded == (depth if "Gather" in {n.op_type for n in model.graph.node} else 0)  # split: Kᵀ is scaled first
    assert not [why for op, why in report.kept if op == "matmul"]
    result = _run_offloaded(mod, inputs, ref, providers=only)
    assert sum(l.kernel in (MATMUL, MATMUL_ADD) for l in result.plan.launches) == len(gemms)
    assert sum(l.kernel == BATCHED_MATMUL for l in result.plan.launches) == len(batched)


def test_on_cuda_the_built_plan_runs_vits_linears_on_cublaslt():
    from tvm_nimble.codegen.vendor_build import vendor_available

    ok, why = vendor_available()
    if not ok:
        pytest.skip(why)
    result = build(zoo.get_model("vit"), {"kind": "cuda", "arch": "sm_90"}, kernels="vendor", compile_kernels=False)
    matmuls = [l for l in result.plan.launches if l.kernel in (MATMUL, MATMUL_ADD)]
    shapes = [result.plan.tensors[l.args[0]].shape for l in matmuls]
    assert len(matmuls) == 9 and sum(len(s) == 3 for s in shapes) == 8
    assert sum(l.kernel == SDPA for l in result.plan.launches) == 2


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


def _head(rows: int, n: int, transposed: bool, bias: bool, k: int = 256) -> "onnx.ModelProto":
    """x [1, rows, k] @ W (+ b): a language model's head, W [k, n] or the transpose of an initializer [n, k]."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((n, k) if transposed else (k, n)) / np.sqrt(k)).astype(np.float32)
    nodes = ([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0])] if transposed else [])
    nodes.append(helper.make_node("MatMul", ["x", "wt" if transposed else "w"], ["h" if bias else "y"]))
    init = [numpy_helper.from_array(w, "w")]
    if bias:
        nodes.append(helper.make_node("Add", ["h", "b"], ["y"]))
        init.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, n])], initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("transposed, bias", [(False, False), (True, True)])
@pytest.mark.parametrize("rows, n, dtype, padded", [(64, 1025, "float32", 1028), (64, 1025, "float16", 1032),
                                                    (64, 1030, "float16", 1032), (64, 1028, "float32", None),
                                                    (64, 1032, "float16", None), (8, 8195, "float32", None),
                                                    (16, 37, "float32", None), (1, 1025, "float16", None)])
def test_a_gemm_whose_output_rows_are_unaligned_computes_padded_columns(rows, n, dtype, padded, transposed, bias,
                                                                        vendor_reference):
    """cuBLASLt runs its align-1 kernels where a row of the output is not a multiple of 16 bytes (GPT-2's 50,257-word
    head: 5x slower): from 16 rows and 2^24 multiply-adds on, the call computes N rounded up to 16 bytes of columns
    of zero-padded weights and the chain's value is its first N (a slice TVM fuses with what follows: the cast to the
    float32 output in a 16-bit build). Fewer rows (a decode step's, the GEMV's), a small GEMM (a classifier's few
    classes, where the slice's launch would cost what alignment gains) and aligned rows keep N. A 16-bit GEMM whose
    float32 rows are aligned, or that has one row, writes the float32 output itself (no kernel after it); a head
    without a bias passes cuBLASLt none. Against the ONNX reference."""
    from tvm_nimble.relay_passes.precision import to_precision
    from tvm_nimble.relay_passes.providers.chains import Columns

    model = _head(rows, n, transposed, bias)
    x = np.random.default_rng(8).standard_normal((1, rows, 256)).astype(np.float32)
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    mod = to_precision(from_onnx(model), dtype)
    (offload,) = find_offloads(mod["main"])
    call = offload.value[0]
    symbol = call.args[0].global_symbol  # a 16-bit row of a decode step: our GEMV's (the offload's order)
    assert symbol == (vendor_abi.GEMV_MATMUL if rows == 1 and dtype != "float32" else MATMUL)
    assert ("add" in offload.signature) == bias
    if symbol == MATMUL:  # cuBLASLt's call: a Linear without a bias passes none (no bias epilogue, no bias kernel)
        bias_arg = call.args[1].fields[2]
        assert int(bias_arg.value.numpy().size) == ((padded or n) if bias else 0)
    assert offload.value[1] == (Columns(n) if padded else None)
    assert int(call.ty_args[0].fields[0].shape[-1]) == (padded or n)
    writes_float32 = dtype == "float32" or n % 4 == 0 or rows == 1
    assert str(call.ty_args[0].fields[0].dtype) == ("float32" if writes_float32 else dtype)
    result = build(OffloadToVendor()(mod), "llvm")
    kernels = [l.kernel for l in result.plan.launches]
    after = kernels[kernels.index(symbol) + 1:]  # one kernel slices and casts (fp16) the padded output
    assert kernels.count(symbol) == 1 and len(after) == (0 if writes_float32 and not padded else 1)
    assert all(("strided_slice" in k) == bool(padded) for k in after)
    out = NimbleExecutor(result)(x)[0].numpy()
    assert out.shape == ref.shape and out.dtype == np.float32
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_a_16_bit_gemm_keeps_its_dtype_where_its_cast_up_feeds_more_work(vendor_reference):
    """The float32 cast of a 16-bit GEMM's result that feeds more work (the softmax a 16-bit build computes in
    float32) is not the call's: TVM fuses the cast into that kernel's reads, half the bytes a float32 result would
    take. Against the ONNX reference."""
    from tvm_nimble.relay_passes.precision import to_precision

    head = _head(64, 1032, False, False)
    g = head.graph
    g.node[0].output[0] = "h"
    g.node.append(helper.make_node("Softmax", ["h"], ["y"], axis=-1))
    x = np.random.default_rng(8).standard_normal((1, 64, 256)).astype(np.float32)
    ref = ReferenceEvaluator(head).run(None, {"x": x})[0]
    mod = to_precision(from_onnx(head), "float16")
    (offload,) = find_offloads(mod["main"])
    assert str(offload.value[0].ty_args[0].fields[0].dtype) == "float16"
    out = NimbleExecutor(build(OffloadToVendor()(mod), "llvm"))(x)[0].numpy()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2)


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
    assert report.kept == [("matmul", "a batched matmul needs two static fp32/fp16/bf16 tensors of one rank >= 3 with the "
                                      "same batch dimensions")]
    a, b = rng.standard_normal((2, 3, 4, 5)).astype(np.float32), rng.standard_normal((1, 3, 5, 6)).astype(np.float32)
    out = NimbleExecutor(build(OffloadToVendor()(from_onnx(model)), "llvm"))(a, b)[0].numpy()
    np.testing.assert_allclose(out, np.maximum(a, 0) @ np.maximum(b, 0), rtol=1e-5, atol=1e-5)


def test_fp16_attention_is_fused_through_the_casts_mixed_precision_leaves(vit, vendor_reference):
    """ToMixedPrecision keeps the head split's take and the softmax in fp32 (casts around them); the call
    reads the fp16 QKV tensor (those casts round-trip exactly) and computes the softmax in fp32 itself.
    Both fused kernels take it: cuDNN's SDPA first (fp16, no mask, 8-element aligned views), ours too; the fp32-only
    key-split kernel does not."""
    from tvm_nimble.relay_passes.precision import to_precision

    model, inputs, ref = vit
    mod = to_precision(from_onnx(model), "float16")
    report = OffloadReport()
    fused = [o for o in find_offloads(mod["main"], report=report) if o.provider == "cudnn_sdpa"]
    assert len(fused) == 2 and all(f"{CUDNN_SDPA}(1x16x96:float16, " in o.signature for o in fused)
    ours = [o for o in find_offloads(mod["main"], providers=[providers.get("attention")]) if o.provider == "attention"]
    assert len(ours) == 2 and all(f"{SDPA}(1x16x96:float16, " in o.signature for o in ours)  # the other candidate
    # the key-split cluster kernel is fp32 only: it takes the fp32 module's chains, not these
    assert not find_offloads(mod["main"], providers=[providers.get("attention_cluster")])
    assert len(find_offloads(from_onnx(model)["main"], providers=[providers.get("attention_cluster")])) == 2
    assert not [why for op, why in report.kept if op == "attention"]
    result = build(OffloadToVendor()(mod), "llvm", max_streams=None)
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    assert np.linalg.norm(out - ref[0]) / np.linalg.norm(ref[0]) < 1e-2


@pytest.fixture(scope="module", params=["additive", "where"])
def bert(request):
    model = zoo.bert(mask=request.param)
    inputs = zoo.bert_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, inputs)
    other = ReferenceEvaluator(model).run(None, zoo.bert_inputs(model, seed=1))[0]
    assert np.linalg.norm(other - ref[0]) > 0.1 * np.linalg.norm(ref[0])  # the reference depends on the input
    return request.param, model, inputs, ref


def test_bert_matches_the_reference_with_integer_inputs_and_its_plan_is_race_free(bert):
    _, model, inputs, ref = bert
    result = build(model, "llvm", max_streams=None)
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-4)
    assert check_races(result, inputs, ref, seeds=range(5)) == []


def test_berts_padding_mask_goes_into_the_fused_call_and_a_where_mask_stays_with_a_reason(bert, vendor_reference):
    """The additive mask (1 - mask) * -10000, [1, 1, 1, 16], becomes the call's bias, broadcast by zero
    strides; Q, Kᵀ (transposed straight from the Linear by perm [0, 2, 3, 1]) and V are read from their
    Linears' outputs. Masking with Where is not a form the kernel takes: those attentions stay on
    cuBLASLt's batched GEMMs and TVM's softmax, and the report says why."""
    form, model, inputs, ref = bert
    mod = from_onnx(model)
    report = OffloadReport()
    offloads = find_offloads(mod["main"], report=report)
    fused = [o for o in offloads if o.provider == "attention"]
    reasons = [why for op, why in report.kept if op == "attention"]
    if form == "additive":
        assert len(fused) == 2 and not reasons
        assert all(f"{SDPA_BIAS}(1x16x32:float32, 1x16x32:float32, 1x16x32:float32, 1x1x1x16:float32, " in o.signature
                   for o in fused)
    else:
        assert not fused and reasons == ["where before the softmax is not a scale or one additive mask"] * 2
        assert sum(BATCHED_MATMUL in o.signature for o in offloads) == 4
    result = _run_offloaded(mod, inputs, ref)
    assert sum(l.kernel == SDPA_BIAS for l in result.plan.launches) == (2 if form == "additive" else 0)


@pytest.mark.parametrize("name, call, call_bias", [("attention_split", SPLIT_SDPA, SPLIT_SDPA_BIAS),
                                                     ("attention_tile", TILE_SDPA, TILE_SDPA_BIAS),
                                                     ("attention_cluster", CLUSTER_SDPA, CLUSTER_SDPA_BIAS)])
def test_our_other_attention_kernels_are_default_candidates_and_take_the_same_chains(name, call, call_bias, vit, bert,
                                                                                     vendor_reference):
    """The split-key, the tile and the key-split cluster attention kernels are among the default providers, after ours (so
    kernels="vendor", which measures nothing, keeps ours); alone, each takes the same chains as our row-per-warp
    kernel, with the same attrs, and the plan it gives reproduces the ONNX reference."""
    names = [p.name for p in providers.offloading("cuda")]
    assert names.index("attention") < names.index(name)
    provider = providers.get(name)
    cases = [(vit, call)] + ([(bert[1:], call_bias)] if bert[0] == "additive" else [])
    for (model, inputs, ref), kernel in cases:
        mod = from_onnx(model)
        ours = [o.signature for o in find_offloads(mod["main"]) if o.provider == "attention"]
        named = [o.signature for o in find_offloads(mod["main"], providers=[provider])]
        assert len(named) == len(ours) == 2
        assert named == [s.replace(SDPA, call) for s in ours]
        result = _run_offloaded(mod, inputs, ref, providers=[provider])
        assert sum(l.kernel == kernel for l in result.plan.launches) == 2
        assert {providers.provider_of(l.kernel).name for l in result.plan.launches if "attention" in l.kernel} == {name}


def test_a_head_split_the_model_also_uses_elsewhere_stays_and_the_call_reads_it(vendor_reference):
    """The permuted QKV tensor feeds the Split and also another output: it stays in the graph, the Split
    and its items go, and the call reads that tensor through the items' offsets (not the dropped items)."""
    shape = lambda name, vals: numpy_helper.from_array(np.asarray(vals, dtype=np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Reshape", ["x", "s5"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]),
        helper.make_node("Split", ["t"], ["p0", "p1", "p2"], axis=0),
        *[helper.make_node("Squeeze", [f"p{i}", "ax"], [n]) for i, n in enumerate("qkv")],
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
        helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "s3"], ["y"]),
        helper.make_node("ReduceSum", ["t", "axr"], ["other"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "shared_split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32]),
         helper.make_tensor_value_info("other", TensorProto.FLOAT, [3, 1, 2, 16])],
        initializer=[shape("s5", [1, 16, 3, 2, 16]), shape("s3", [1, 16, 32]), shape("ax", [0]), shape("axr", [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.random.default_rng(0).standard_normal((1, 16, 96)).astype(np.float32)
    ref = ReferenceEvaluator(model).run(None, {"x": x})
    mod = from_onnx(model)
    (fused,) = [o for o in find_offloads(mod["main"]) if o.provider == "attention"]
    assert fused.signature.startswith("split+") and f"{SDPA}(3x1x2x16x16:float32, " in fused.signature
    outs = NimbleExecutor(build(OffloadToVendor()(mod), "llvm"))(x)
    for out, r in zip(outs, ref):
        np.testing.assert_allclose(out.numpy(), r, rtol=1e-5, atol=1e-5)


def test_explain_says_which_attention_no_provider_takes_and_why():
    """What the offload report keeps reaches explain through the build's info (a user sees why their
    attention is not fused without reading the offload pass)."""
    from tvm_nimble.compiler.explain import explain_model

    text = explain_model(zoo.bert(mask="where"), {"kind": "cuda", "arch": "sm_90"}, kernels="vendor", max_streams=1)
    lines = text.splitlines()
    at = lines.index("not taken by any provider (on TVM's kernels):")
    assert lines[at + 1].split() == ["2", "x", "attention:", "where", "before", "the", "softmax", "is", "not", "a",
                                     "scale", "or", "one", "additive", "mask"]
    assert "not taken by any provider" not in explain_model(zoo.bert(), {"kind": "cuda", "arch": "sm_90"},
                                                            kernels="vendor", max_streams=1)


def _linear_gelu(spelling: str):
    """x [1, 6, 8] -> Linear(8, 12) -> GELU spelled as ``spelling``: ``torch`` (x * (1 + erf(x / sqrt 2))) * 0.5,
    ``hf`` (x * 0.5) * (1 + erf(x / sqrt 2)), ``shared`` (the hf form, the Linear's output also added to the
    result) or ``tanh`` (the tanh approximation)."""
    rng = np.random.default_rng(3)
    init = [numpy_helper.from_array(rng.standard_normal((8, 12)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(12).astype(np.float32), "b")]
    for name, value in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5), ("k", 0.7978845608), ("c", 0.044715),
                        ("three", 3.0)):
        init.append(numpy_helper.from_array(np.array(value, np.float32), name))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["h"])]
    node = lambda op, ins, out: nodes.append(helper.make_node(op, ins, [out]))  # noqa: E731
    if spelling == "tanh":
        node("Pow", ["h", "three"], "cube"), node("Mul", ["cube", "c"], "cc"), node("Add", ["h", "cc"], "inner")
        node("Mul", ["inner", "k"], "arg"), node("Tanh", ["arg"], "t"), node("Add", ["t", "one"], "onep")
        node("Mul", ["h", "half"], "hh"), node("Mul", ["hh", "onep"], "y")
    else:
        node("Div", ["h", "sqrt2"], "d"), node("Erf", ["d"], "e"), node("Add", ["e", "one"], "onep")
        if spelling == "torch":
            node("Mul", ["h", "onep"], "p"), node("Mul", ["p", "half"], "y")
        else:
            node("Mul", ["h", "half"], "hh"), node("Mul", ["hh", "onep"], "g" if spelling == "shared" else "y")
            if spelling == "shared":
                node("Add", ["g", "h"], "y")
    graph = helper.make_graph(nodes, "linear_gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 12])], initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("spelling", ["torch", "hf", "shared", "tanh"])
def test_a_gelu_after_a_linear_goes_into_its_call_and_nothing_else_does(spelling, vendor_reference):
    """The erf GELU, in either order ONNX exporters write it, becomes the call's activation 3 (computed in the
    extension's bias kernel), the tanh approximation activation 4 (cuBLASLt's GELU epilogue); a GELU whose input is
    also used elsewhere stays on TVM's kernels. Checked against the ONNX reference evaluator."""
    model = _linear_gelu(spelling)
    x = np.random.default_rng(4).standard_normal((1, 6, 8)).astype(np.float32)
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    (offload,) = [o for o in find_offloads(from_onnx(model)["main"]) if MATMUL in o.signature]
    folded = spelling != "shared"
    chain = offload.signature.split(" -> ")[0]
    assert ("erf" in chain or "tanh" in chain) == folded
    act = 4 if spelling == "tanh" else 3 if folded else 0
    assert offload.signature.split(" -> ")[1].endswith(f", [0,{act},0])")
    result = build(OffloadToVendor()(from_onnx(model)), "llvm")
    assert any("erf" in l.kernel or "tanh" in l.kernel for l in result.plan.launches) != folded
    out = NimbleExecutor(result)(x)[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def _layer_norm_model(axis: int = -1, constant_gamma: bool = True):
    """x [1, 6, 8] -> Add 1 -> LayerNormalization(axis) -> y; gamma an initializer or a second input."""
    rng = np.random.default_rng(5)
    init = [numpy_helper.from_array(np.float32(1.0).reshape(()), "one"),
            numpy_helper.from_array(rng.standard_normal(8 if axis == -1 else 6 * 8).astype(np.float32).reshape(
                (8,) if axis == -1 else (6, 8)), "beta")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 8])]
    gshape = (8,) if axis == -1 else (6, 8)
    if constant_gamma:
        init.append(numpy_helper.from_array(rng.standard_normal(gshape).astype(np.float32), "gamma"))
    else:
        inputs.append(helper.make_tensor_value_info("gamma", TensorProto.FLOAT, list(gshape)))
    nodes = [helper.make_node("Add", ["x", "one"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["y"], axis=axis, epsilon=1e-5)]
    graph = helper.make_graph(nodes, "ln", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8])],
                              initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("case", ["last_axis", "two_axes", "gamma_input"])
def test_a_layer_norm_over_the_last_axis_with_constant_parameters_is_one_call(case, vendor_reference):
    """Named (it is not a default provider), the LayerNorm the transformers have becomes one
    nimble.norm.layer_norm call (its numpy contract reproduces the ONNX reference); over two axes, or with
    parameters the model computes, it stays on TVM's kernels with the reason in the offload report. Not
    named, no LayerNorm is taken."""
    model = _layer_norm_model(axis=-2 if case == "two_axes" else -1, constant_gamma=case != "gamma_input")
    feeds = {"x": np.random.default_rng(6).standard_normal((1, 6, 8)).astype(np.float32)}
    if case == "gamma_input":
        feeds["gamma"] = np.random.default_rng(7).standard_normal(8).astype(np.float32)
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    report = OffloadReport()
    mod = OffloadToVendor(report=report, providers=providers.offloading("cuda", ("layer_norm",)))(from_onnx(model))
    taken = report.offloaded.get(LAYER_NORM, 0)
    assert taken == (1 if case == "last_axis" else 0)
    if not taken:
        assert [op for op, _ in report.kept] == ["layer_norm"]
    default = OffloadReport()
    OffloadToVendor(report=default)(from_onnx(model))
    assert LAYER_NORM not in default.offloaded and not default.kept
    out = NimbleExecutor(build(mod, "llvm"))(*feeds.values())[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_a_bf16_layer_norm_takes_the_16_bit_tensor_and_float32_parameters(vit, vendor_reference):
    """In a bf16 build the policy computes LayerNorm in float32 between two casts; the call folds both: it
    reads and writes bf16 (no float32 tensor between kernels) with float32 gamma and beta."""
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.compiler.stages import apply_precision

    model, inputs, ref = vit
    opts = BuildOptions.create({"kind": "cuda", "arch": "sm_90"}, precision="bf16")
    offloads = [o for o in find_offloads(apply_precision(from_onnx(model), opts)["main"],
                                         providers=providers.offloading("cuda", ("layer_norm",)))
                if LAYER_NORM in o.signature]
    assert len(offloads) == 5  # two per block and the final one
    assert all(o.signature.startswith("astype+layer_norm+astype -> ") for o in offloads)
    assert all("(1x16x32:bfloat16, 32:float32, 32:float32, " in o.signature for o in offloads)


def _attention_with_mask(mask_shape):
    """softmax(Q·Kᵀ·scale + mask)·V on inputs q, k, v [1, 2, 4, 8] and mask ``mask_shape``."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Add", ["ss", "mask"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["out"])]
    qkv = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 4, 8]) for n in ("q", "k", "v")]
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, list(mask_shape))
    out_batch = max(1, mask_shape[0]) if len(mask_shape) == 4 else 1
    graph = helper.make_graph(nodes, "masked_attention", qkv + [mask],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [out_batch, 2, 4, 8])],
                              [numpy_helper.from_array(np.array(8 ** -0.5, dtype=np.float32), "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mask_shape, fused", [([1, 1, 4, 4], True), ([4], True), ([3, 1, 4, 4], False)])
def test_a_mask_that_does_not_broadcast_to_the_scores_stays_unfused(mask_shape, fused, vendor_reference):
    """A mask [3, 1, 4, 4] on scores [1, 2, 4, 4] makes the output [3, 2, 4, 8]: fused as one attention of batch 1,
    two of its three batches would be lost. It stays on the GEMMs and the softmax, with the reason; masks that do
    broadcast to the scores are the call's bias. Both give the ONNX reference's output."""
    model = _attention_with_mask(mask_shape)
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal([1, 2, 4, 8]).astype("float32") for n in ("q", "k", "v")}
    inputs["mask"] = rng.standard_normal(mask_shape).astype("float32")
    ref = ReferenceEvaluator(model).run(None, inputs)
    mod = from_onnx(model)
    report = OffloadReport()
    taken = [o for o in find_offloads(mod["main"], report=report) if o.provider == "attention"]
    reasons = [why for op, why in report.kept if op == "attention"]
    if fused:
        assert len(taken) == 1 and not reasons
    else:
        assert not taken and reasons == [f"a mask of shape {mask_shape} does not broadcast to [1, 2, 4, 4]"]
    _run_offloaded(mod, inputs, ref)
