"""Sibling operators merged into one (relay_passes/merge_siblings.py, merge="on"|"auto"): outputs equal the
ONNX reference evaluator's and the unmerged build's, merged plans pass the race simulator, zero-padded
kernels equal a brute-force convolution, siblings that differ in stride or epilogue stay apart, and on
CUDA a merged group is one provider call (BERT's Q/K/V one GEMM that the fused attention still reads)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.codegen.checker import check_plan
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.compiler.merge_choice import merged
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes.providers.attention import SDPA_BIAS, reshape_strides
from tvm_nimble.relay_passes.vendor_offload import MATMUL, OffloadToVendor
from tvm_nimble.runtime.race_check import check_races
from tvm_nimble.runtime.timing import ReplayTimes

CUDA = {"kind": "cuda", "arch": "sm_90"}


def _run(module, inputs: dict) -> np.ndarray:
    with NimbleExecutor(module) as ex:
        return ex(*inputs.values())[0].numpy()


def _ops(mod, name: str) -> int:
    return mod["main"].script().count(name + "(")


@pytest.mark.parametrize("name", ["inception", "nasnet"])
def test_merged_zoo_nets_match_the_reference_and_the_unmerged_build_and_are_race_free(name):
    model = zoo.get_model(name)
    inputs = zoo.random_inputs(model, seed=0)
    reference = [np.asarray(r) for r in ReferenceEvaluator(model).run(None, inputs)]
    plain = build(model, "llvm", max_streams=None)
    module = build(model, "llvm", max_streams=None, merge="on")
    groups = module.report.merge_choice.groups
    assert sum(g.merged for g in groups) >= 1
    if name == "inception":  # per block, the 1x1 writing its slice of the concatenation in place stays apart
        assert module.report.concats_in_place == plain.report.concats_in_place == 3
        assert sum("goes into a concatenation" in g.why for g in groups) == 3
    # fewer convolutions launched, and every merged split is read in place (batch 1: channel slices)
    assert len(module.plan.launches) < len(plain.plan.launches)
    assert module.report.splits_as_views == sum(g.merged for g in groups)
    assert not [l for l in module.plan.launches if "split" in l.kernel]
    out = _run(module, inputs)
    np.testing.assert_allclose(out, reference[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, _run(plain, inputs), rtol=1e-5, atol=1e-5)
    assert module.plan.num_streams > 1 and check_plan(module.plan) == []
    assert check_races(module, inputs, reference, seeds=range(10)) == []


def test_nasnets_depthwise_siblings_stay_apart_with_the_reason():
    groups = build(zoo.get_model("nasnet"), "llvm", merge="on", compile_kernels=False).report.merge_choice.groups
    grouped = [g for g in groups if "grouped convolutions" in g.why]
    assert grouped and not any(g.merged for g in grouped)
    assert any(g.merged and "1x1" in g.group for g in groups)


def _conv(x, w, b, pads, stride=1):
    """Brute force: NCHW / OIHW, padding (top, left, bottom, right), no library."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), x.dtype)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    oh, ow = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    y = np.zeros((n, o, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            y[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return (y + b[None, :, None, None]).astype(np.float32)


#: (kernel, pads): 1x1, 3x3, 5x5, 1x3 and 3x1 siblings that keep 8x8 -> 8x8, centered alike
_KERNELS = [((1, 1), [0, 0, 0, 0]), ((3, 3), [1, 1, 1, 1]), ((5, 5), [2, 2, 2, 2]), ((1, 3), [0, 1, 0, 1]),
            ((3, 1), [1, 0, 1, 0])]


def _siblings_model(specs, cin=4, hw=8):
    """x -> one Conv (+ bias) [+ Relu] per spec (kernel, pads, stride, relu) -> each flattened, concatenated."""
    rng = np.random.default_rng(7)
    inits, nodes, outs, weights, total = [], [], [], [], 0
    for i, (k, pads, stride, relu) in enumerate(specs):
        total += (4 + i) * (hw // stride) ** 2
        w = rng.standard_normal((4 + i, cin, *k)).astype(np.float32)
        b = rng.standard_normal(4 + i).astype(np.float32)
        weights.append((w, b, pads, stride, relu))
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", ["x", f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=list(k), pads=pads,
                                      strides=[stride, stride]))
        y = f"c{i}"
        if relu:
            nodes.append(helper.make_node("Relu", [y], [f"r{i}"]))
            y = f"r{i}"
        nodes.append(helper.make_node("Flatten", [y], [f"f{i}"], axis=1))
        outs.append(f"f{i}")
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
    graph = helper.make_graph(nodes, "siblings", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, total])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), weights


def test_zero_padded_kernels_match_a_brute_force_convolution():
    """1x1, 3x3, 5x5, 1x3 and 3x1 siblings become one 5x5 convolution (smaller kernels zero-padded,
    centered, padding grown to match); every part equals numpy's convolution of its own kernel."""
    model, weights = _siblings_model([(k, p, 1, True) for k, p in _KERNELS])
    mod, groups = merged(from_onnx(model))
    assert [len(g.members) for g in groups if g.merged] == [5]
    script = mod["main"].script()
    assert script.count("R.nn.conv2d(") == 1 and "padding=[2, 2, 2, 2]" in script
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = np.concatenate([np.maximum(_conv(x, w, b, pads), 0).reshape(1, -1) for w, b, pads, _, _ in weights], 1)
    module = build(mod, "llvm", merge="on")
    np.testing.assert_allclose(_run(module, {"x": x}), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ReferenceEvaluator(model).run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def _fire_model(concat: list[str], extra_output: str | None = None, cin=8, sq=4, e=6, hw=8):
    """A SqueezeNet fire module: squeeze 1x1 + ReLU, then expand 1x1 + ReLU ("e1") and expand 3x3 + ReLU ("e3"),
    the tensors named in ``concat`` concatenated on the channels ("s": the squeezed input itself);
    ``extra_output``: one of them is also a model output."""
    rng = np.random.default_rng(3)
    inits = []

    def w(name, shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name))
        return name

    channels = {"s": sq, "e1": e, "e3": e + 2}
    nodes = [helper.make_node("Conv", ["x", w("ws", [sq, cin, 1, 1]), w("bs", [sq])], ["s0"]),
             helper.make_node("Relu", ["s0"], ["s"]),
             helper.make_node("Conv", ["s", w("w1", [e, sq, 1, 1]), w("b1", [e])], ["e1_0"]),
             helper.make_node("Relu", ["e1_0"], ["e1"]),
             helper.make_node("Conv", ["s", w("w3", [e + 2, sq, 3, 3]), w("b3", [e + 2])], ["e3_0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["e3_0"], ["e3"]),
             helper.make_node("Concat", concat, ["y"], axis=1)]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, sum(channels[c] for c in concat), hw, hw])]
    if extra_output:
        outs.append(helper.make_tensor_value_info(extra_output, TensorProto.FLOAT, [1, channels[extra_output], hw, hw]))
    graph = helper.make_graph(nodes, "fire", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])],
                              outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("concat,launches", [(["e1", "e3"], 2), (["e3", "e1"], 2), (["s", "e1", "e3"], 2)])
def test_a_fire_modules_expands_merge_into_their_concatenation(concat, launches):
    """SqueezeNet's expand 1x1 and 3x3 (IOS's example): a consecutive run of one concatenation, in either order,
    merges into one 3x3 convolution whose output is that run (no split; the concatenation disappears, or keeps
    its other fields and takes the merged output in place)."""
    model = _fire_model(concat)
    x = np.random.default_rng(4).standard_normal((1, 8, 8, 8)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    module = build(model, "llvm", merge="on", max_streams=None)
    group, = [g for g in module.report.merge_choice.groups if g.merged]
    assert "into its concatenation" in group.why and "1x1/3x3" in group.group
    assert len(module.plan.launches) == launches and not [l for l in module.plan.launches if "split" in l.kernel]
    np.testing.assert_allclose(_run(module, {"x": x}), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_run(module, {"x": x}), _run(build(model, "llvm", max_streams=None), {"x": x}),
                               rtol=1e-5, atol=1e-5)


def test_two_runs_of_one_concatenation_each_merge_into_it():
    """Inception-v3's InceptionE block: one concatenation takes two sibling pairs (1x3/3x1 of two inputs); both
    runs merge into it (on the H200 the second run's members were dropped and left the concatenation reading a
    var no binding defined)."""
    model = _fire_model(["e1", "e3"])
    g = model.graph
    for name, src, k, pads in (("f1", "s", [1, 3], [0, 1, 0, 1]), ("f3", "s", [3, 1], [1, 0, 1, 0])):
        g.initializer.append(numpy_helper.from_array(
            np.random.default_rng(len(name) + k[0]).standard_normal([5, 4, *k]).astype(np.float32) * 0.5, "w" + name))
        g.node.insert(len(g.node) - 1, helper.make_node("Conv", [src, "w" + name], [name], kernel_shape=k, pads=pads))
    concat = g.node[-1]
    del concat.input[:]
    concat.input.extend(["s", "e1", "e3", "f1", "f3"])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4 + 14 + 10, 8, 8]))
    x = np.random.default_rng(5).standard_normal((1, 8, 8, 8)).astype(np.float32)
    module = build(model, "llvm", merge="on", max_streams=None)
    assert sum(g.merged for g in module.report.merge_choice.groups) == 2
    np.testing.assert_allclose(_run(module, {"x": x}), ReferenceEvaluator(model).run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)


def test_expands_that_are_not_a_private_run_of_the_concatenation_stay_apart():
    """An expand that is also a model output, or a run split by another field, keeps writing its own slice."""
    for model in (_fire_model(["e1", "e3"], extra_output="e1"), _fire_model(["e1", "s", "e3"])):
        groups = build(model, "llvm", merge="on", compile_kernels=False).report.merge_choice.groups
        assert not any(g.merged for g in groups)
        assert sum("goes into a concatenation" in g.why for g in groups) == 2


def test_siblings_that_differ_in_stride_or_epilogue_are_not_merged():
    """Of four 1x1 siblings, the two alike merge; the one with stride 2 and the one without a ReLU stay
    convolutions of their own, and the record names what differs."""
    specs = [((1, 1), [0, 0, 0, 0], 1, True), ((1, 1), [0, 0, 0, 0], 1, True),
             ((1, 1), [0, 0, 0, 0], 2, True), ((1, 1), [0, 0, 0, 0], 1, False)]
    model, _ = _siblings_model(specs)
    before = from_onnx(model)
    mod, groups = merged(before)
    assert _ops(before, "R.nn.conv2d") == 4 and _ops(mod, "R.nn.conv2d") == 3
    kept = {g.why for g in groups if not g.merged}
    assert any("strides (2, 2) vs (1, 1)" in w for w in kept) and any("epilogue none vs relu" in w for w in kept)
    merged_convs = [g for g in groups if g.merged]
    assert len(merged_convs) == 1 and [m.channels for m in merged_convs[0].members] == [4, 5]
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(build(model, "llvm", merge="on"), {"x": x}),
                               ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_merged_bert_matches_the_reference_and_the_unmerged_build():
    model = zoo.bert()
    inputs = zoo.bert_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, inputs)
    module = build(model, "llvm", max_streams=None, merge="on")
    merged_groups = [g.group for g in module.report.merge_choice.groups if g.merged]
    assert len(merged_groups) == 2 and all(g.startswith("matmul x3 of ") and g.endswith(": K=32 (32+32+32 outputs)")
                                           for g in merged_groups)  # Q, K and V of each layer
    out = _run(module, inputs)
    np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, _run(build(model, "llvm", max_streams=None), inputs), rtol=1e-5, atol=1e-5)
    assert check_races(module, inputs, ref, seeds=range(5)) == []


def test_berts_merged_qkv_gemm_still_ends_in_the_fused_attention_call(vendor_reference):
    """Q, K and V of a layer are one GEMM [16, 32] x [32, 96]; the attention call reads its three parts
    in place (strided along the last axis, the heads split by a reshape of that strided view), and the
    numpy contract of the calls reproduces the ONNX reference."""
    model = zoo.bert()
    inputs = zoo.bert_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, inputs)
    mod, _ = merged(from_onnx(model))
    result = build(OffloadToVendor()(mod), "llvm", max_streams=None)
    launches = [l.kernel for l in result.plan.launches]
    assert launches.count(SDPA_BIAS) == 2
    qkv = [l for l in result.plan.launches if l.kernel == MATMUL and result.plan.tensors[l.writes[0]].shape[-1] == 96]
    assert len(qkv) == 2
    sdpa = [l for l in result.plan.launches if l.kernel == SDPA_BIAS]
    assert all(result.plan.root(l.args[i]) == result.plan.root(q.writes[0]) for l, q in zip(sdpa, qkv) for i in range(3))
    assert not [k for k in launches if "split" in k or "transpose" in k]
    np.testing.assert_allclose(_run(result, inputs), ref[0], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def vendor_ok():
    from tvm_nimble.codegen.vendor_build import vendor_available

    ok, why = vendor_available()
    if not ok:
        pytest.skip(why)


def test_on_cuda_a_merged_group_is_one_provider_call(vendor_ok):
    """Inception's 1x1 siblings per block that feed 3x3 convolutions: two cuDNN calls separate, one merged,
    whose output the consumers read through slice views of it (no split kernel); the concatenation is
    still built in place."""
    from tvm_nimble.relay_passes.vendor_offload import CONV2D

    model = zoo.get_model("inception")
    plain = build(model, CUDA, kernels="vendor", compile_kernels=False, max_streams=None)
    module = build(model, CUDA, kernels="vendor", compile_kernels=False, max_streams=None, merge="on")
    blocks = 3
    count = lambda r: sum(l.kernel == CONV2D for l in r.plan.launches)  # noqa: E731
    # per block, the 1x1 siblings that feed convolutions merge; the one writing into the concat stays apart
    assert count(plain) - count(module) == blocks
    script = module.annotated_mod["main"].script()
    assert module.report.splits_as_views == blocks and module.report.concats_in_place == blocks
    assert not [l for l in module.plan.launches if "concatenate" in l.kernel]
    assert not [l for l in module.plan.launches if "split" in l.kernel]
    assert check_plan(module.plan) == []


def test_on_cuda_berts_merged_qkv_is_one_cublaslt_call_and_attention_stays_fused(vendor_ok):
    model = zoo.bert()
    plain = build(model, CUDA, kernels="vendor", compile_kernels=False, max_streams=1)
    module = build(model, CUDA, kernels="vendor", compile_kernels=False, max_streams=1, merge="on")
    gemms = lambda r: [l for l in r.plan.launches if l.kernel == MATMUL]  # noqa: E731
    assert len(gemms(plain)) - len(gemms(module)) == 2 * 2
    assert sorted(module.plan.tensors[l.writes[0]].shape[-1] for l in gemms(module)).count(96) == 2
    assert sum(l.kernel == SDPA_BIAS for l in module.plan.launches) == 2


def test_a_decoders_merged_qkv_parts_are_read_by_the_kernels_that_use_them(vendor_ok):
    """A Llama layer's Q, K and V (16 rows) merge into one GEMM whose parts are strided along the last axis: q and k,
    adjacent parts with the same rotary embedding per head, are rotated by one kernel over all their heads
    (``merge_heads``) that reads them through a strided slice fused into it, and split along the heads again; v is
    read by the attention call in place (CUDA) or by TVM's kernels (llvm): no split kernel copying any part, and a
    layer on CUDA has three GEMMs and four launches fewer than unmerged (the rotary kernels two before). Against the
    ONNX reference and the unmerged build."""
    from decoder_models import tiny_llama_onnx

    model = tiny_llama_onnx(dynamic=False)
    ids = np.random.default_rng(0).integers(0, 256, (1, 16)).astype(np.int64)
    inputs = {"input_ids": ids, "attention_mask": np.ones((1, 16), np.int64)}
    ref = ReferenceEvaluator(model).run(None, inputs)[0]
    layers = 2
    module = build(model, "llvm", merge="on")
    # (the heads' split of the rotated q and k, and gate/up's split too: its parts are read by the SiLU's kernel)
    assert module.report.splits_as_views == 3 * layers and not [l for l in module.plan.launches if "split" in l.kernel]
    out = _run(module, inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, _run(build(model, "llvm"), inputs), rtol=1e-5, atol=1e-5)
    plain = build(model, CUDA, kernels="vendor", precision="fp16", compile_kernels=False)
    merged_qkv = build(model, CUDA, kernels="vendor", precision="fp16", compile_kernels=False, merge="on")
    gemms = lambda r: sum(l.kernel == MATMUL for l in r.plan.launches)  # noqa: E731
    assert gemms(plain) - gemms(merged_qkv) == 3 * layers  # Q/K/V as one, gate/up as one
    assert merged_qkv.report.splits_as_views == 2 * layers
    assert not [l for l in merged_qkv.plan.launches if l.kernel.startswith("split")]
    assert len(plain.plan.launches) - len(merged_qkv.plan.launches) == 4 * layers


def test_merge_option_values_and_auto_without_a_gpu():
    with pytest.raises(NimbleError, match=r"^merge must be one of \('off', 'on', 'auto'\), got 'yes'$"):
        BuildOptions.create("llvm", merge="yes")
    model = zoo.get_model("inception", blocks=1)
    with pytest.warns(UserWarning, match="merge='auto' measures merged against separate"):
        result = build(model, "llvm", merge="auto", compile_kernels=False)
    groups = result.report.merge_choice.groups
    assert not any(g.merged for g in groups)
    assert [g.why for g in groups if " x2 " in g.group] == ["auto: nothing to measure on, kept separate"]
    assert result.report.splits_as_views == 0
    assert build(model, "llvm", compile_kernels=False).report.merge_choice is None  # off: nothing found, nothing recorded


def test_reshape_strides_agrees_with_numpys_no_copy_reshape():
    """Brute force against NumPy: for random strided views (slices, transposes) and random target shapes,
    the strides exist exactly when NumPy can reshape without a copy, and they read the same elements."""
    rng = np.random.default_rng(0)
    base = np.arange(2 * 3 * 12 * 4, dtype=np.int64).reshape(2, 3, 12, 4)
    tried = found = 0
    for _ in range(1500):
        view = base[tuple(slice(int(rng.integers(0, 2)), None) if rng.random() < 0.3 else slice(None) for _ in range(4))]
        if rng.random() < 0.5:
            view = view.transpose(rng.permutation(4))
        n = view.size
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        a = int(rng.choice(divisors))
        b = int(rng.choice([d for d in divisors if (n // a) % d == 0]))
        out = (a, b, n // a // b)
        got = reshape_strides(view.shape, [s // 8 for s in view.strides], out)
        try:
            no_copy = view.view()
            no_copy.shape = out
        except AttributeError:
            no_copy = None
        assert (got is None) == (no_copy is None), (view.shape, view.strides, out)
        tried += 1
        if got is not None:
            found += 1
            read = np.lib.stride_tricks.as_strided(view, shape=out, strides=[s * 8 for s in got])
            np.testing.assert_array_equal(read, view.reshape(out))
    assert 0 < found < tried


class LaunchCountTimer:
    """The build's timer interface (compiler/timers.py) with times that are a function of the plans given:
    a replay costs ``per_launch`` per launch plus ``fixed``, whatever its streams. ``per_launch`` > 0 favors
    the merged model (fewer launches), < 0 the separate one; every call is counted."""

    where = "the test's timer"

    def __init__(self, per_launch: float, fixed: float = 10.0):
        self.per_launch, self.fixed, self.replays = per_launch, fixed, 0

    def arch(self):
        return "sm_90"

    def fingerprint(self):
        return {"name": "Test GPU", "arch": "sm_90"}

    def replay_ms(self, results):
        self.replays += 1
        return ReplayTimes([[self.fixed + self.per_launch * len(r.plan.launches) for r in results]])


@pytest.mark.parametrize("per_launch, kept", [(1.0, "merged"), (-1.0, "separate")])
def test_auto_keeps_whichever_measured_faster_and_measures_it_once(vendor_ok, per_launch, kept):
    """merge='auto' on a GPU (the test's timer): the merged and the separate model, each one-stream and
    widest, replayed side by side; the faster side is built, the numbers are recorded, and a second build
    reads them from the timing cache instead of replaying again."""
    from tvm_nimble.compiler.build import build_with
    from tvm_nimble.compiler.session import CacheMemory
    from tvm_nimble.relay_passes.vendor_offload import CONV2D

    memory = CacheMemory()  # what the first build measured, passed on to the second
    model = zoo.get_model("inception", blocks=1)
    options = BuildOptions.create(CUDA, kernels="vendor", merge="auto", max_streams=1, compile_kernels=False,
                                  timing_cache=None)
    timer = LaunchCountTimer(per_launch)
    result = build_with(model, options, timer=timer, cache=memory)
    record = result.report.merge_choice
    assert timer.replays == 1 and record.measured.kept == kept
    separate, merged_ms = record.measured.separate_ms, record.measured.merged_ms
    assert (min(merged_ms) < min(separate)) == (kept == "merged")
    assert [g.merged for g in record.groups if " x2 " in g.group] == [kept == "merged"]
    convs = sum(l.kernel == CONV2D for l in result.plan.launches)
    assert convs == (7 if kept == "merged" else 8)  # the two 1x1s feeding 3x3s merged, or apart
    again = LaunchCountTimer(per_launch)
    assert build_with(model, options, timer=again, cache=memory).report.merge_choice == record and again.replays == 0


def test_the_cli_merges_on_compile_and_explain_shows_each_group(tmp_path):
    model = zoo.get_model("inception", blocks=1)
    path = zoo.save(model, str(tmp_path / "incept.onnx"))
    x = zoo.random_inputs(model)["input"]
    np.save(tmp_path / "x.npy", x)

    from cli_runner import run_cli

    def cli(*args):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        return r.stdout

    text = cli("explain", path, "--merge", "on")
    assert "merge (on): 2 sibling groups found, 1 merged" in text
    assert "  merged: conv2d x2 of " in text and "separate: conv2d x1 of " in text and "concatenation" in text
    assert "merge (" not in cli("explain", path)
    cli("compile", path, "-o", str(tmp_path / "art"), "--target", "llvm", "--merge", "on")
    cli("run", str(tmp_path / "art"), "--input", f"input={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out"))
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output0.npy"),
                               ReferenceEvaluator(model).run(None, {"input": x})[0], rtol=1e-4, atol=1e-4)
    bad = run_cli("explain", path, "--merge", "yes")
    assert bad.returncode == 2 and "--merge" in bad.stderr
