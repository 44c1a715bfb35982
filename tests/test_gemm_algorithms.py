"""The cuBLASLt algorithm index the build writes into a GEMM's attrs (compiler/gemm_algorithms.py).

Choosing it needs a GPU (the candidates are timed there; scripts/experiments/gemm_algos.py); here:
the rewrite puts the index into exactly the calls chosen and the model's output does not move, and a
build without a GPU of the target's arch keeps the heuristic's first.
"""
import numpy as np
import tvm

from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.compiler.gemm_algorithms import choose_gemm_algorithms, gemm_calls, with_algorithms
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.compiler.session import BuildSession
from tvm_nimble.relay_passes.vendor_offload import MATMUL, MATMUL_ADD, OffloadToVendor

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


def _offloaded():
    model = zoo.get_model("vit")
    return model, OffloadToVendor()(from_onnx(model))


def test_the_chosen_index_goes_into_those_calls_only_and_the_output_does_not_move(vendor_reference):
    model, mod = _offloaded()
    calls = list(gemm_calls(mod))
    signatures = sorted({sig for _, _, sig in calls})
    assert len(calls) == 9 and {name for _, name, _ in calls} == {MATMUL, MATMUL_ADD}
    pick = {signatures[0]: 3}
    tuned = with_algorithms(mod, pick)
    attrs = {}
    for block in tuned["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if (isinstance(v, tvm.relax.Call) and "call_dps_packed" in str(v.op)
                    and str(v.args[0].global_symbol) in (MATMUL, MATMUL_ADD)):
                attrs.setdefault(len(v.args[1].fields[-1].values), []).append(list(map(int, v.args[1].fields[-1].values)))
    n_picked = sum(sig == signatures[0] for _, _, sig in calls)
    assert len(attrs[4]) == n_picked and all(a[3] == 3 for a in attrs[4]) and len(attrs[3]) == len(calls) - n_picked
    assert not [c for c in gemm_calls(tuned) if c[2] == signatures[0]]  # indexed calls are not listed again
    x = zoo.random_inputs(model, seed=0)
    outs = [NimbleExecutor(build(m, "llvm", max_streams=None))(*x.values())[0].numpy() for m in (mod, tuned)]
    np.testing.assert_array_equal(outs[0], outs[1])


def test_without_a_gpu_of_the_arch_the_heuristics_first_stays():
    _, mod = _offloaded()
    same, records = choose_gemm_algorithms(mod, BuildSession(BuildOptions.create(CUDA, timing_cache="off")))
    assert records == [] and same is mod


def test_explain_lists_the_gemms_that_run_another_algorithm():
    from tvm_nimble.compiler.report import GemmAlgorithm, KernelChoice

    records = (GemmAlgorithm(f"{MATMUL}(a) -> y", (27.1, 20.0, 16.6), 2),  # (an older artifact's: no provider)
               GemmAlgorithm(f"{MATMUL}(b) -> y", (10.0, 9.9), 0))
    assert KernelChoice(gemm_algorithms=records).gemm_lines() == [
        "cuBLASLt algorithms: 2 distinct GEMMs timed, 1 run a faster one than the heuristic's first",
        f"  algorithm 2: 16.6 us (first: 27.1 us)  {MATMUL}(a) -> y"]
