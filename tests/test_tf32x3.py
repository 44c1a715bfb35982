"""float32 GEMMs as three TF32 products (relay_passes/providers/tf32x3.py), through the calls' numpy contract
(tests/vendor_reference.py), which reads every operand of a ``nimble.cublas.tf32x3_*`` call as a tensor core does
(its low 13 mantissa bits dropped) and adds the products exactly.

Checked against float64 and the ONNX reference evaluator: the split operands lose nothing that float32 keeps where one
TF32 product of the same operands is ~1e-3 off; a tiny GPT-2 in float32 with every Linear of 16 rows or more on it
matches the ONNX reference; and what it leaves to others. What the tensor cores' accumulation adds is the GPU's
(the GPU suite's decoder test names the provider and bounds the model against PyTorch's float32)."""
import re
import shutil
import subprocess

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvm_nimble import NimbleExecutor, build
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.relay_passes import providers
from tvm_nimble.relay_passes.providers import tf32x3
from tvm_nimble.relay_passes.vendor_offload import OffloadReport, OffloadToVendor, find_offloads

from decoder_models import EXPORT_SHAPE, tiny_gpt2_onnx

ONLY = [providers.get("tf32x3")]


def _gemm(rows: int, n: int, k: int, trans_b: int, relu: bool = False):
    """y = Gemm(x [rows, k], W, b) [-> Relu], W stored [N, K] (trans_b) or [K, N]; scaled so y is O(1)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((n, k) if trans_b else (k, n)) / np.sqrt(k)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g" if relu else "y"], transB=trans_b)]
    if relu:
        nodes.append(helper.make_node("Relu", ["g"], ["y"]))
    graph = helper.make_graph(
        nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), w


def _rel(y, ref):
    return float(np.linalg.norm(np.asarray(y, np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("trans_b, relu", [(1, False), (0, True)])
def test_three_tf32_products_give_float32_accuracy_where_one_is_1e3_off(vendor_reference, trans_b, relu):
    model, w = _gemm(64, 40, 96, trans_b, relu)
    mod = OffloadToVendor(providers=ONLY)(from_onnx(model))
    x = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32)
    out = NimbleExecutor(build(mod, "llvm", max_streams=None))(x)[0].numpy()
    wk = w.T if trans_b else w  # [K, N]
    bias = numpy_helper.to_array(model.graph.initializer[1]).astype(np.float64)
    exact = x.astype(np.float64) @ wk.astype(np.float64) + bias
    exact = np.maximum(exact, 0) if relu else exact
    float32 = _rel(ReferenceEvaluator(model).run(None, {"x": x})[0], exact)
    # one TF32 product of the same operands, as the contract reads them
    one = tf32x3.split_array(x)[0].astype(np.float64) @ tf32x3.split_array(wk)[0].astype(np.float64) + bias
    one = _rel(np.maximum(one, 0) if relu else one, exact)
    assert _rel(out, exact) < 2 * float32 + 1e-7 and one > 100 * _rel(out, exact), (_rel(out, exact), float32, one)


def test_the_weights_are_split_into_tf32_high_parts_and_exact_rests():
    w = np.random.default_rng(2).standard_normal((8, 12)).astype(np.float32) * 1e3
    hi, lo = tf32x3.split_array(w)
    assert np.array_equal(hi + lo, w) and np.all(np.abs(lo) <= np.abs(w) * 2.0 ** -11)
    assert np.array_equal(tf32x3.split_array(hi)[0], hi)  # a tensor core reads the high part whole
    assert np.all(np.abs(lo) <= np.abs(w - (w.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)))  # nearest
    for trans_b, axis in ((1, 1), (0, 0)):  # [W_hi ; W_lo ; W_hi] along K
        stacked = tf32x3.split_weight(w, trans_b)
        assert np.array_equal(stacked, np.concatenate([hi, lo, hi], axis=axis))


def _split_module(shape) -> tvm.IRModule:
    """A Relax module returning ``split_rows(x)`` of a float32 ``x`` of ``shape``."""
    bb = tvm.relax.BlockBuilder()
    x = tvm.relax.Var("x", tvm.relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(tf32x3.split_rows(x))
        bb.emit_func_output(out)
    return bb.get()


def test_the_activations_split_survives_tvms_lowering():
    """Veltkamp's split as TVM compiles it (its simplifier must not fold ``c - (c - x)`` into ``x``): the high part
    has TF32's 11 significant bits and the two parts add up to x exactly."""
    exe = tvm.compile(_split_module((4, 64)), target="llvm")
    xs = (np.random.default_rng(3).standard_normal((4, 64)) * 10).astype(np.float32)
    got = tvm.relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(xs)).numpy()
    lo, hi, hi2 = got[:, :64], got[:, 64:128], got[:, 128:]  # the small parts first along K
    assert np.array_equal(hi, hi2) and np.array_equal(hi + lo, xs)
    assert np.array_equal(tf32x3.split_array(hi)[0], hi) and np.any(lo != 0)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_split_leaves_ptxas_no_product_to_contract(tmp_path):
    """Veltkamp's split as TVM's CUDA code for sm_90, read in PTX: ``mul.f32`` and ``sub.f32`` carry no rounding mode,
    so ptxas may fuse a product and the subtraction it feeds into one FMA (``x * 8193 - x`` exactly, which is not the
    split). No product of the split may feed an addition or a subtraction."""
    from tvm_nimble.codegen import cuda_compile
    from tvm_nimble.compiler import stages
    from tvm_nimble.compiler.target import resolve_target

    target = resolve_target("cuda", "sm_90")
    lowered = stages.lower(_split_module((64, 256)), target)
    with cuda_compile.fatbin_compilation(target):
        module = tvm.compile(lowered, target=target).mod
    sources = []
    pending = [module]
    while pending:
        m = pending.pop()
        sources.append(m.inspect_source())
        pending.extend(m.imports)
    (tmp_path / "split.cu").write_text(next(s for s in sources if "__global__" in s))
    subprocess.run(["nvcc", "-ptx", "-arch=sm_90", "-o", str(tmp_path / "split.ptx"), str(tmp_path / "split.cu")],
                   check=True, capture_output=True)
    ptx = (tmp_path / "split.ptx").read_text()
    products = set(re.findall(r"\bmul(?:\.rn)?\.f32\s+(%f\d+),", ptx))
    assert products  # the split multiplies
    sums = re.findall(r"\b(?:add|sub)\.f32\s+%f\d+,\s*(%f\d+),\s*(%f\d+);", ptx)
    assert sums and not [s for s in sums if products & set(s)], "a product feeds an add/sub: ptxas may contract it"


def test_a_float32_decoder_on_it_matches_the_onnx_reference(vendor_reference):
    model = tiny_gpt2_onnx(dynamic=False)
    report = OffloadReport()
    mod = from_onnx(model)
    offloads = find_offloads(mod["main"], report=report, providers=ONLY)
    # per layer Q/K/V, the output projection, the MLP's two Linears; and the LM head: 16 rows each
    assert len(offloads) == 2 * 4 + 1 and {o.provider for o in offloads} == {"tf32x3"}
    result = build(OffloadToVendor(providers=ONLY)(mod), "llvm", max_streams=None)
    assert sum(l.kernel.startswith(tf32x3.PROVIDER.kernel_prefix) for l in result.plan.launches) == 9
    rng = np.random.default_rng(4)
    feeds = {"input_ids": rng.integers(0, 256, EXPORT_SHAPE).astype(np.int64),
             "attention_mask": np.ones(EXPORT_SHAPE, np.int64)}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = NimbleExecutor(result)(*feeds.values())[0].numpy()
    assert _rel(got, want.astype(np.float64)) < 1e-5


def test_with_tf32_in_half_precision_or_on_few_rows_it_leaves_the_linears_to_others():
    model, _ = _gemm(8, 40, 96, 1)  # 8 rows
    report = OffloadReport()
    assert find_offloads(from_onnx(model)["main"], report=report, providers=ONLY) == []
    assert ("matmul", f"three TF32 products take {tf32x3.MIN_ROWS} rows or more") in report.kept
    mod = from_onnx(_gemm(64, 40, 96, 1)[0])
    assert find_offloads(mod["main"], allow_tf32=True, providers=ONLY) == []  # TF32 on: one TF32 GEMM is asked for
    from tvm_nimble.relay_passes.precision import to_precision

    assert find_offloads(to_precision(mod, "float16")["main"], providers=ONLY) == []
    assert find_offloads(mod["main"], providers=ONLY)  # exact float32, 64 rows: taken
    assert "tf32x3" not in [p.name for p in providers.offloading("cuda")]  # only when named
