"""TVM's kernels begin by waiting for the kernels before them on sm_90+ (codegen/dependent_launch.py), and the plan
says so, so that the runtime's CUDA graph may launch them as programmatic dependents (tests/gpu runs that)."""
import shutil

import numpy as np
import onnx
import pytest
import tvm_ffi
from onnx import TensorProto, helper

import tvm_nimble
from tvm_nimble.codegen import dependent_launch
from tvm_nimble.contract.plan import Plan

WAIT = "griddepcontrol.wait;"


def test_every_kernel_definition_begins_with_the_wait_and_nothing_else_changes():
    head_a = 'extern "C" __global__ void __launch_bounds__(128) a_kernel(float* __restrict__ A) {'
    head_b = 'extern "C" __global__ void __launch_bounds__(64) b_kernel_1(half* __restrict__ B, int n) {'
    declaration = 'extern "C" __global__ void __launch_bounds__(128) a_kernel(float* __restrict__ A);'
    body_a, body_b = "\n  A[threadIdx.x] = 0;\n}\n", "\n  if (n) { B[0] = B[1]; }\n}\n"
    helper_fn = "__device__ void helper(float* x) { x[0] = 1; }\n"
    code = declaration + "\n" + head_a + body_a + helper_fn + head_b + body_b
    want = (declaration + "\n" + head_a + dependent_launch.PROLOGUE + body_a + helper_fn + head_b
            + dependent_launch.PROLOGUE + body_b)
    assert dependent_launch.waiting_first(code) == want
    assert dependent_launch.PROLOGUE.index(WAIT) < dependent_launch.PROLOGUE.index("launch_dependents")


@pytest.mark.parametrize("target, want", [({"kind": "cuda", "arch": "sm_90"}, True),
                                          ({"kind": "cuda", "arch": "sm_100a"}, True),
                                          ({"kind": "cuda", "arch": "sm_80"}, False),
                                          ({"kind": "llvm"}, False)])
def test_supported_from_sm_90(target, want):
    assert dependent_launch.supported(target) is want


def _model():
    """y = relu(x + c) * 2 over [1, 256]: a few TVM kernels."""
    c = helper.make_tensor("c", TensorProto.FLOAT, [1, 256], np.linspace(-1, 1, 256, dtype=np.float32).tolist())
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
         helper.make_node("Mul", ["r", "two"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], [c, two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_the_built_kernels_wait_first_and_the_plan_says_so(arch):
    built = tvm_nimble.build(_model(), {"kind": "cuda", "arch": arch}, kernels="tvm", timing_cache=None)
    source = built.kernels.imports[0].inspect_source("cuda")
    definitions = [l for l in source.split("\n") if l.startswith('extern "C" __global__') and l.endswith("{")]
    assert definitions
    if arch == "sm_90":
        assert source.count(WAIT) == len(definitions)
        for d in definitions:  # the wait is the body's first statement
            assert source.split(d, 1)[1].startswith(dependent_launch.PROLOGUE)
        assert built.plan.dependent_launch
        assert built.plan.dependent_launches == {l.idx for l in built.plan.launches}  # no vendor call here
        assert Plan.from_json(built.plan.to_json()).dependent_launch
        # another stream cap of the same kernels (the stream choice's candidates) keeps the promise
        from tvm_nimble.compiler.stream_choice import rescheduled

        assert rescheduled(built, 1).plan.dependent_launch
    else:
        assert WAIT not in source and not built.plan.dependent_launch and not built.plan.dependent_launches
        assert "dependent_launch" not in built.plan.to_dict()  # the JSON of a plan without it is as before
    # the hook is TVM's global for the build only
    assert tvm_ffi.get_global_func("tvm_callback_cuda_postproc", allow_missing=True) is None


def test_a_plan_whose_kernels_tvm_compiles_makes_no_promise():
    """compile_kernels=False (TVM's own pipeline, explain): no library of ours, no dependent launch."""
    built = tvm_nimble.build(_model(), {"kind": "cuda", "arch": "sm_90"}, kernels="tvm", timing_cache=None,
                             compile_kernels=False)
    assert not built.plan.dependent_launch and not built.plan.dependent_launches
