"""Convolutions through cuDNN's graph API as a provider (relay_passes/providers/cudnn_graph.py,
codegen/vendor/cudnn_conv_graph.cpp).

The calls themselves run on a GPU (bench and build on an H100); here, through the numpy contract of the
calls (tests/vendor_reference.py), against the ONNX reference evaluator: which convolutions it takes in a
TF32 build (the legacy provider's but grouped ones, residual adds included; none in exact fp32), that
kernels="vendor" still gives convolutions to the legacy provider, and that the kernel choice leaves it
out, with a note, on a GPU where its calls fail.
"""
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from test_timing_cache import SM90, PlanCostTimer, _need_vendor
from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.compiler.build import build_with
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.relay_passes import providers
from tvm_nimble.relay_passes.providers import cudnn, cudnn_graph
from tvm_nimble.relay_passes.vendor_offload import OffloadReport, OffloadToVendor, find_offloads

ONLY = [providers.get("cudnn_graph")]


def _reference(name):
    model = zoo.get_model(name)
    inputs = zoo.random_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, inputs)[0]
    other = ReferenceEvaluator(model).run(None, zoo.random_inputs(model, seed=1))[0]
    assert np.abs(ref - other).max() > 1e-3  # the reference depends on the input
    return model, inputs, ref


@pytest.mark.parametrize("name", ["resnet", "mobilenet"])
def test_it_takes_the_legacy_providers_convolutions_but_grouped_ones_and_matches_the_reference(name, vendor_reference):
    model, inputs, ref = _reference(name)
    mod = from_onnx(model)
    report = OffloadReport()
    ours = find_offloads(mod["main"], allow_tf32=True, report=report, providers=ONLY)
    legacy = [o for o in find_offloads(mod["main"], allow_tf32=True, providers=[providers.get("cudnn")])
              if "conv2d" in o.signature]
    grouped = [why for op, why in report.kept if op == "conv2d" and why.startswith("groups=")]
    assert ours and len(ours) + len(grouped) == len(legacy)  # every convolution but the grouped ones
    residual = sum(cudnn_graph.CONV2D_ADD + "(" in o.signature for o in ours)
    assert residual == sum(cudnn.CONV2D_ADD + "(" in o.signature for o in legacy)  # the same residual adds fused
    assert (residual > 0) == (name == "resnet") and (len(grouped) > 0) == (name == "mobilenet")
    result = build(OffloadToVendor(allow_tf32=True, providers=ONLY)(mod), "llvm", max_streams=None)
    launches = [l.kernel for l in result.plan.launches]
    assert launches.count(cudnn_graph.CONV2D) + launches.count(cudnn_graph.CONV2D_ADD) == len(ours)
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_vendor_kernels_keep_the_legacy_provider_first_and_exact_fp32_stays_off_the_graph_api():
    main = from_onnx(zoo.get_model("resnet"))["main"]
    offloads = find_offloads(main, allow_tf32=True)
    assert {o.provider for o in offloads if "conv2d" in o.signature} == {"cudnn"}
    report = OffloadReport()
    assert find_offloads(main, report=report, providers=ONLY) == []  # fp32 without TF32: FMA kernels, legacy list
    assert not report.kept  # nothing to report: where the legacy provider declines, its reason is the one shown


class GraphCallsFail(PlanCostTimer):
    """A GPU on which the graph API's calls fail (an engine cuDNN lists but cannot run, say)."""

    def launch_ms(self, result, reps):
        if any(l.kernel == cudnn_graph.CONV2D for l in result.plan.launches):
            raise RuntimeError(f"{cudnn_graph.CONV2D}: executing cuDNN's plan failed: test")
        return super().launch_ms(result, reps)


def test_a_provider_whose_calls_fail_on_the_gpu_is_left_out_with_a_note(tmp_path):
    _need_vendor()
    with pytest.warns(UserWarning, match=r"cuDNN \(graph API\): its calls failed on this GPU \(.*test\); the kernel "
                                         r"choice leaves it out"):
        result = build_with(zoo.get_model("resnet"), BuildOptions.create(SM90, kernels="best", precision="tf32",
                                                                          timing_cache=str(tmp_path)),
                            timer=GraphCallsFail())
    # built, with the convolutions on the legacy calls or TVM's kernels (whichever this timer favours)
    assert not [l for l in result.plan.launches if l.kernel == cudnn_graph.CONV2D]
    assert result.report.kernel_choice.timings
