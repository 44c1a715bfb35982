"""OffloadToVendor on CPU: which chains it replaces, and that the rewritten module computes the same.

The vendor functions themselves need a GPU (scripts/experiments/vendor_check.py checks them against
PyTorch there). Here the contract of each function -- argument order, the attrs layout, bias,
residual and activation -- is implemented once in numpy and registered under the vendor names, so
the rewritten module runs through the real Relax VM and the Nimble executor on llvm and is compared
with the ONNX reference evaluator. A wrong stride, padding, group count, activation or argument
order in the pass shows up as a wrong output.
"""
import numpy as np
import pytest
import tvm

from tvm_nimble import NimbleExecutor, zoo
from tvm_nimble.codegen.checker import check_plan
from tvm_nimble.compiler.build import build
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.compiler.stock import StockVM, build_stock_vm
from tvm_nimble.compiler.target import resolve_target
from tvm_nimble.contract import vendor_abi
from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes.vendor_offload import CONV2D, CONV2D_ADD, MATMUL, OffloadReport, OffloadToVendor


@pytest.mark.parametrize("name", ["inception", "nasnet", "resnet"])
def test_offloaded_module_computes_the_reference(name, vendor_reference):
    model = zoo.get_model(name)
    inputs = zoo.random_inputs(model, seed=0)
    from onnx.reference import ReferenceEvaluator

    ref = ReferenceEvaluator(model).run(None, inputs)[0]
    report = OffloadReport()
    mod = OffloadToVendor(report=report)(from_onnx(model))
    assert report.offloaded.get(CONV2D, 0) > 0 and report.offloaded.get(MATMUL, 0) == 1
    if name != "inception":  # residual blocks fuse their add into the convolution
        assert report.offloaded.get(CONV2D_ADD, 0) > 0
    x = list(inputs.values())
    vm = StockVM(build_stock_vm(mod, resolve_target("llvm")), tvm.cpu(), x).outputs()[0]
    np.testing.assert_allclose(vm, ref, rtol=1e-4, atol=1e-4)
    nimble = build(mod, "llvm")
    vendor = [l for l in nimble.plan.launches if l.kernel.startswith("nimble.")]
    assert vendor and all(l.literals for l in vendor)
    out = NimbleExecutor(nimble)(*x)[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    assert np.abs(ref).max() > 1e-3


def test_cuda_plan_gives_each_concurrent_call_its_own_workspace():
    """On a CUDA target (no GPU needed to plan) vendor calls are stream nodes; the race checker accepts the
    plan, so no two calls that may run at once share a workspace."""
    mod = OffloadToVendor()(from_onnx(zoo.get_model("inception")))
    result = build(mod, {"kind": "cuda", "arch": "sm_90"}, compile_kernels=False)
    plan = result.plan
    vendor = [l for l in plan.launches if l.kernel.startswith(vendor_abi.CUDNN.prefix)]
    assert len(vendor) > 10 and plan.num_streams > 1
    assert len({l.stream for l in vendor}) > 1
    assert check_plan(plan) == []
    workspaces = {plan.tensors[l.args[-1]].storage for l in vendor}
    concurrent_width = max(len({l.stream for l in vendor}), 2)
    assert len(workspaces) >= concurrent_width  # at least one workspace per concurrently running stream


def test_llvm_builds_stay_on_tvm_kernels():
    model = zoo.get_model("inception")
    assert not any(l.kernel.startswith("nimble.") for l in build(model, "llvm").plan.launches)
    with pytest.raises(NimbleError, match="need a CUDA target"):
        build(model, "llvm", kernels="vendor")


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_asymmetric_padding_stays_on_tvm(allow_tf32):
    """cuDNN pads symmetrically: a conv with pads (0, 0, 1, 1) keeps TVM's kernel, and the report says why, once
    (with TF32 both cuDNN providers decline it, for that one reason)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype("float32"), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[0, 0, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 7, 7])], [w])
    report = OffloadReport()
    OffloadToVendor(allow_tf32=allow_tf32, report=report)(
        from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    assert not report.offloaded and report.kept == [("conv2d", "asymmetric padding [0, 0, 1, 1]")]
