"""Our fp32 GEMM as a provider (relay_passes/providers/simt_gemm.py, codegen/vendor/gemm_simt.cu).

The kernel itself is checked against float64 on a GPU (scripts/experiments/gemm_simt_check.py: every
candidate, edge shapes, the residual in place). Here: which Linears the provider takes and with which
epilogue, that its weights are the model's in [K, N], that a ViT built with it reproduces the ONNX
reference through the calls' numpy contract (tests/vendor_reference.py) with a race-free plan, what it
leaves to others and why, and that the build bakes the fastest candidate of every call into its attrs.
"""
import numpy as np
import pytest
import tvm
from tvm.ir.expr import Constant
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.compiler.gemm_algorithms import choose_gemm_algorithms, gemm_calls
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.compiler.session import BuildSession
from tvm_nimble.contract import vendor_abi
from tvm_nimble.relay_passes import providers
from tvm_nimble.relay_passes.providers import simt_gemm
from tvm_nimble.relay_passes.vendor_offload import OffloadReport, OffloadToVendor, find_offloads
from tvm_nimble.runtime.race_check import check_races

from test_transformer import vit  # noqa: F401 (a fixture: the zoo ViT both ways of unbinding Q, K, V, its reference)

ONLY = [providers.get("simt_gemm")]


def _calls(mod):
    """(function, attrs, weight constant) of every call_dps_packed in main, in order."""
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, tvm.relax.Call) and "call_dps_packed" in str(v.op):
                fields = v.args[1].fields
                out.append((str(v.args[0].global_symbol), [int(x) for x in fields[-1].values],
                            fields[1].value.numpy() if isinstance(fields[1], Constant) else None))
    return out


def test_it_takes_the_linears_on_tokens_with_their_gelu_and_residual_and_matches_the_reference(vit, vendor_reference):
    model, inputs, ref = vit
    mod = from_onnx(model)
    report = OffloadReport()
    offloads = find_offloads(mod["main"], report=report, providers=ONLY)
    depth = 2
    # per block: QKV, the output projection (+ residual), fc1 (+ GELU), fc2 (+ residual) on 16 tokens; not the
    # classifier's single row
    assert len(offloads) == 4 * depth and {o.provider for o in offloads} == {"simt_gemm"}
    assert ("matmul", f"our fp32 GEMM takes {simt_gemm.MIN_ROWS} rows or more") in report.kept
    offloaded = OffloadToVendor(providers=ONLY)(mod)
    calls = [c for c in _calls(offloaded) if c[0].startswith(vendor_abi.GEMM.prefix)]
    assert [name for name, _, _ in calls].count(simt_gemm.MATMUL_ADD) == 2 * depth
    assert sorted(attrs[0] for _, attrs, _ in calls) == [0] * (3 * depth) + [3] * depth  # GELU after fc1 only
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for _, _, w in calls:  # [K, N], the model's own matrix (the exporter stores a Linear's weight [K, N])
        assert any(v.shape == w.shape and np.array_equal(v, w) for v in weights.values())
    result = build(offloaded, "llvm", max_streams=None)
    assert sum(l.kernel.startswith(vendor_abi.GEMM.prefix) for l in result.plan.launches) == 4 * depth
    assert not [l for l in result.plan.launches if "gelu" in l.kernel or "erf" in l.kernel]
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-4)
    assert check_races(result, inputs, ref, seeds=range(3)) == []


def _gemm(rows: int, n: int, k: int = 8):
    """y = Gemm(x [rows, k], W [n, k], b, transB=1): W stored [N, K]."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, k)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "gemm_tb",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), w


def test_transposed_weights_are_stored_k_by_n(vendor_reference):
    """A Gemm with transB = 1 (W stored [N, K]) gets Wᵀ, and its output still matches the reference."""
    model, w = _gemm(20, 12)
    offloaded = OffloadToVendor(providers=ONLY)(from_onnx(model))
    calls = [c for c in _calls(offloaded) if c[0].startswith(vendor_abi.GEMM.prefix)]
    assert len(calls) == 1 and np.array_equal(calls[0][2], w.T)
    x = {"x": np.random.default_rng(1).standard_normal((20, 8)).astype(np.float32)}
    out = NimbleExecutor(build(offloaded, "llvm", max_streams=None))(*x.values())[0].numpy()
    np.testing.assert_allclose(out, ReferenceEvaluator(model).run(None, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, n, why", [(20, 10, "our fp32 GEMM needs K and N to be multiples of 4"),
                                          (1, 12, f"our fp32 GEMM takes {simt_gemm.MIN_ROWS} rows or more")])
def test_shapes_it_does_not_take_stay_with_the_others_and_say_why(rows, n, why):
    model, _ = _gemm(rows, n)
    report = OffloadReport()
    assert find_offloads(from_onnx(model)["main"], report=report, providers=ONLY) == []
    assert ("matmul", why) in report.kept
    # a convolutional net's classifier (one row at batch 1) is not a candidate, so it costs no probe build
    assert not [o for o in find_offloads(from_onnx(zoo.get_model("inception"))["main"]) if o.provider == "simt_gemm"]


def test_with_tf32_or_in_half_precision_it_leaves_the_linears_to_others(vit):
    model, _, _ = vit
    mod = from_onnx(model)
    report = OffloadReport()
    assert find_offloads(mod["main"], allow_tf32=True, report=report, providers=ONLY) == []
    # silently: those GEMMs are cuBLASLt's, whose report gives the reason where it declines one
    assert not [why for op, why in report.kept if op == "matmul"]
    from tvm_nimble.relay_passes.precision import to_precision

    half = to_precision(mod, "float16")
    report = OffloadReport()
    assert find_offloads(half["main"], report=report, providers=ONLY) == []
    assert not [why for op, why in report.kept if op == "matmul"]
    report = OffloadReport()  # in exact fp32 it takes them
    assert find_offloads(mod["main"], report=report, providers=ONLY)


class ThirdIsFastest:
    """A timer with a GPU of the target's arch whose GEMM timings make the third candidate the fastest
    (only the fourth cuBLASLt candidate beats its first by the 3% margin)."""

    where = "the test's timer"

    def arch(self):
        return "sm_90"

    def fingerprint(self):
        return {}  # no identity: its times stay in this process

    def gemm_us(self, timings_func, call, reps):
        return [5.0, 5.5, 4.0, 6.0] if timings_func.startswith(vendor_abi.GEMM.prefix) else [5.0, 5.1, 4.9, 4.0]


def test_the_build_bakes_the_fastest_candidate_into_every_call_of_ours():
    model = zoo.get_model("vit")
    mod = OffloadToVendor(providers=ONLY + [providers.get("cublaslt")])(from_onnx(model))
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    before = list(gemm_calls(mod))
    names = (simt_gemm.MATMUL, simt_gemm.MATMUL_ADD, vendor_abi.CUBLAS_MATMUL, vendor_abi.CUBLAS_BATCHED_MATMUL)
    assert {name for _, name, _ in before} == set(names)  # the classifier (N = 10) and attention's on cuBLASLt
    chosen, records = choose_gemm_algorithms(mod, BuildSession(BuildOptions.create(target, timing_cache="off"), ThirdIsFastest()))
    assert not list(gemm_calls(chosen))  # every call carries its index now
    indices = {name: {attrs[-1] for n, attrs, _ in _calls(chosen) if n == name} for name in names}
    assert indices == dict(zip(names, [{2}, {2}, {3}, {3}]))
    assert {r.provider for r in records} == {"simt_gemm", "cublaslt"}


def test_explain_says_how_many_gemms_ran_our_kernel():
    from tvm_nimble.compiler.report import GemmAlgorithm, KernelChoice

    records = (GemmAlgorithm(f"{simt_gemm.MATMUL}(a) -> y", (9.0, 7.7), 1, "simt_gemm"),
               GemmAlgorithm(f"{vendor_abi.CUBLAS_MATMUL}(b) -> y", (10.0, 9.9), 0, "cublaslt"))
    assert KernelChoice(gemm_algorithms=records).gemm_lines() == [
        "cuBLASLt algorithms: 1 distinct GEMMs timed, 0 run a faster one than the heuristic's first",
        "our fp32 GEMM: 1 distinct GEMMs, the fastest of each one's tile / split-K candidates"]
