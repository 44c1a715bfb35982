"""Channels-last builds (``layout="nhwc"``, relay_passes/layout.py): TVM's ConvertLayout, the cuDNN providers'
NHWC / OHWI calls and their numpy contract (tests/vendor_reference.py), against the ONNX reference evaluator.

The calls themselves run on a GPU (the bench on an H100); here: that an NHWC build computes what the model does,
with TVM's kernels and with every convolution and average pool on the providers' calls; that the layout changes
only where the graph enters and leaves the convolutions (no transpose per operator); that ``auto`` picks NHWC for
half-precision CUDA builds only; and that a bad value is one line.
"""
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from test_cudnn_graph import _reference  # the zoo model, seeded inputs, the ONNX reference's (input-dependent) output
from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.compiler import stages
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.contract import vendor_abi
from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes import providers
from tvm_nimble.relay_passes.providers import cudnn, cudnn_graph
from tvm_nimble.relay_passes.vendor_offload import OffloadReport, OffloadToVendor

SM90 = {"kind": "cuda", "arch": "sm_90"}


def _nhwc(model, **options):
    opts = BuildOptions.create("llvm", layout="nhwc", timing_cache="off", **options)
    return stages.apply_layout(stages.apply_precision(stages.import_model(model), opts), opts)


def _calls(mod, name):
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == name:
            found.append(e)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


@pytest.mark.parametrize("name", ["resnet", "inception", "nasnet"])
def test_an_nhwc_build_on_tvms_kernels_matches_the_reference(name):
    model, inputs, ref = _reference(name)
    result = build(model, "llvm", layout="nhwc", max_streams=None, timing_cache="off")
    assert result.report.options.layout == "nhwc"
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["resnet", "inception", "nasnet", "mobilenet", "densenet"])
def test_every_convolution_and_average_pool_goes_to_cudnn_channels_last(name, vendor_reference):
    model, inputs, ref = _reference(name)
    mod = _nhwc(model)
    convs = _calls(mod, "relax.nn.conv2d")
    assert convs and all(c.attrs.data_layout == "NHWC" and c.attrs.kernel_layout == "OHWI" for c in convs)
    # the layout changes where the graph enters the convolutions and where it leaves them, not per operator
    assert len(_calls(mod, "relax.permute_dims")) <= 2
    report = OffloadReport()
    offloaded = OffloadToVendor(providers=[providers.get("cudnn")], report=report)(mod)
    assert not [why for op, why in report.kept if op in ("conv2d", "avg_pool2d")]
    calls = [c for c in _calls(offloaded, "relax.call_dps_packed") if c.args[0].global_symbol.startswith("nimble.")]
    conv_calls = [c for c in calls if c.args[0].global_symbol in (cudnn.CONV2D, cudnn.CONV2D_ADD)]
    assert len(conv_calls) >= len(convs) and not _calls(offloaded, "relax.nn.conv2d")
    assert all(int(c.args[1].fields[-1].values[10]) == 1 for c in conv_calls)  # attrs say NHWC
    result = build(offloaded, "llvm", max_streams=None, timing_cache="off")
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_in_a_tf32_build_dense_convolutions_use_tf32_and_pools_and_depthwise_ones_stay_exact_fp32():
    """An average pool on cuDNN is a depthwise convolution of constant weights; PyTorch's pools and fp32 depthwise
    convolutions are exact fp32 (no TF32), so ours ask cuDNN for no TF32 (attrs[9]) while dense convolutions do."""
    model, _, _ = _reference("nasnet")
    mod = _nhwc(model, precision="tf32")
    pools = len(_calls(mod, "relax.nn.avg_pool2d"))
    depthwise = [c for c in _calls(mod, "relax.nn.conv2d") if int(c.attrs.groups) > 1]
    offloaded = OffloadToVendor(allow_tf32=True, providers=[providers.get("cudnn")])(mod)
    calls = [c for c in _calls(offloaded, "relax.call_dps_packed")
             if c.args[0].global_symbol in (cudnn.CONV2D, cudnn.CONV2D_ADD)]
    tf32 = {}
    for c in calls:  # a pool's call has all-equal constant weights of 1/(kh*kw), a convolution's are the model's
        w, attrs = c.args[1].fields[1], c.args[1].fields[-1].values
        is_pool = isinstance(w, Constant) and np.ptp(w.value.numpy()) == 0
        kind = "pool" if is_pool else "depthwise" if int(attrs[6]) > 1 else "conv"
        tf32.setdefault(kind, set()).add(int(attrs[9]))
    assert pools and depthwise and tf32 == {"pool": {0}, "depthwise": {0}, "conv": {1}}


def test_the_graph_api_takes_nhwc_convolutions_with_their_residual_adds(vendor_reference):
    model, inputs, ref = _reference("resnet")
    report = OffloadReport()
    offloaded = OffloadToVendor(allow_tf32=True, providers=[providers.get("cudnn_graph")],
                                report=report)(_nhwc(model, precision="tf32"))
    names = [c.args[0].global_symbol for c in _calls(offloaded, "relax.call_dps_packed")]
    assert cudnn_graph.CONV2D in names and cudnn_graph.CONV2D_ADD in names
    result = build(offloaded, "llvm", max_streams=None, timing_cache="off")
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_auto_is_channels_last_for_tensor_core_cuda_builds_only():
    def layout(target, **kw):
        return BuildOptions.create(target, timing_cache="off", **kw).data_layout

    assert layout(SM90, precision="fp16") == "nhwc" and layout(SM90, precision="bf16") == "nhwc"
    assert layout(SM90, precision="tf32") == "nhwc" and layout(SM90, allow_tf32=True) == "nhwc"
    assert layout(SM90) == "nchw"  # exact fp32: FMA kernels, slower channels-last
    assert layout(SM90, precision="fp16", kernels="tvm") == "nchw"  # TVM's own kernels gain nothing from it
    assert layout("llvm", precision="fp16") == "nchw"
    assert layout(SM90, precision="fp32", layout="nhwc") == "nhwc"  # asked for: given
    # a model without convolutions is left as it is
    mod = stages.import_model(zoo.bert())
    assert stages.apply_layout(mod, BuildOptions.create("llvm", layout="nhwc", timing_cache="off")) is mod


def test_a_bad_layout_is_one_line():
    with pytest.raises(NimbleError, match=r"^layout must be one of \('auto', 'nchw', 'nhwc'\), got 'NHCW'$"):
        BuildOptions.create("llvm", layout="NHCW")


def test_a_tvm_failure_on_the_channels_last_form_falls_back_to_the_models_layout_only_where_auto_chose_it():
    from tvm_nimble.compiler.build import nchw_fallback
    from tvm_nimble.compiler.notes import Notes

    note = Notes()
    err = RuntimeError("InternalError: Check failed: Inconsistent buffers T_transpose and A")
    auto = BuildOptions.create(SM90, precision="fp16", timing_cache="off")
    with pytest.warns(UserWarning, match=r"TVM failed on the channels-last \(NHWC\) form .* building it in its own "
                                         r"layout \(NCHW\) instead"):
        assert nchw_fallback(auto, err, note).data_layout == "nchw"
    for opts, error in ((auto.replace(layout="nhwc"), err), (BuildOptions.create(SM90, timing_cache="off"), err),
                        (auto, NimbleError("max_error exceeded"))):
        with pytest.raises(type(error)):
            nchw_fallback(opts, error, note)


def test_explain_names_the_layout_of_a_channels_last_build():
    from tvm_nimble.compiler.explain import explain_model

    text = explain_model(zoo.get_model("resnet"), "llvm", layout="nhwc", timing_cache="off")
    assert "layout: NHWC inside the build" in text
    assert "layout: NHWC" not in explain_model(zoo.get_model("resnet"), "llvm", timing_cache="off")


def test_relu6_is_imported_as_a_clip_and_fuses_into_the_convolution(vendor_reference):
    """TVM's importer writes ONNX Clip with bound inputs (torch's ReLU6) as two opaque TE calls; imported as one
    relax.clip it goes into the convolution's call as activation 2 (relu6), in either layout."""
    model, inputs, ref = _reference("mobilenet")
    mod = stages.import_model(model)
    clips = _calls(mod, "relax.clip")
    assert clips and not _calls(mod, "relax.call_tir")
    assert all((float(c.args[1].value), float(c.args[2].value)) == (0.0, 6.0) for c in clips)
    for layout in ("nchw", "nhwc"):
        m = _nhwc(model) if layout == "nhwc" else mod
        offloaded = OffloadToVendor(providers=[providers.get("cudnn")])(m)
        acts = [int(c.args[1].fields[-1].values[7]) for c in _calls(offloaded, "relax.call_dps_packed")
                if c.args[0].global_symbol in (cudnn.CONV2D, cudnn.CONV2D_ADD)]
        assert acts.count(2) == len(clips) and not _calls(offloaded, "relax.clip")
        out = NimbleExecutor(build(offloaded, "llvm", max_streams=None, timing_cache="off"))(*inputs.values())
        np.testing.assert_allclose(out[0].numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["nasnet", "inception"])
def test_cublaslt_takes_channels_last_1x1_convolutions_as_gemms(name, vendor_reference):
    model, inputs, ref = _reference(name)
    mod = _nhwc(model, precision="tf32")
    pointwise = [c for c in _calls(mod, "relax.nn.conv2d")
                 if [int(d) for d in c.args[1].ty.shape.values][1:3] == [1, 1] and int(c.attrs.groups) == 1
                 and [int(v) for v in c.attrs.strides] == [1, 1] and not any(int(p) for p in c.attrs.padding)]
    assert pointwise
    cublaslt = providers.get("cublaslt")
    offloaded = OffloadToVendor(allow_tf32=True, providers=[cublaslt])(mod)
    gemms = [c for c in _calls(offloaded, "relax.call_dps_packed") if str(c.args[0].global_symbol).startswith(
        vendor_abi.CUBLAS_MATMUL) and len(c.args[1].fields[0].ty.shape.values) == 4]  # not the classifier
    assert len(gemms) == len(pointwise)
    result = build(offloaded, "llvm", max_streams=None, timing_cache="off")
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    # exact fp32 keeps its convolutions on cuDNN's FMA kernels: no GEMM offers
    exact = OffloadToVendor(providers=[cublaslt])(_nhwc(model))
    assert not [c for c in _calls(exact, "relax.call_dps_packed") if len(c.args[1].fields[0].ty.shape.values) == 4]


def test_the_fallback_note_says_where_a_message_less_tvm_error_was_raised():
    from tvm_nimble.compiler.build import nchw_fallback
    from tvm_nimble.compiler.notes import Notes

    def lower_the_channels_last_module():
        raise RuntimeError()  # what a TVM error with only its kind looks like

    try:
        lower_the_channels_last_module()
    except RuntimeError as raised:
        err = raised
    auto = BuildOptions.create(SM90, precision="fp16", timing_cache="off")
    with pytest.warns(UserWarning, match=r"\(RuntimeError: RuntimeError, raised at tests/test_channels_last\.py:\d+ "
                                         r"\(lower_the_channels_last_module\)\)"):
        nchw_fallback(auto, err, Notes())
