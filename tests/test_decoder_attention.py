"""Decoders' attention (#52): tiny GPT-2 and Qwen2 (grouped-query attention) exported as Hugging Face's eager
attention spells it, offloaded onto the fused attention call in fp32/fp16/bf16, with the K/V heads of a
``repeat_kv`` read in place (the call's last attr is the group), masks that stay finite in 16 bits, and the
kernel choice's probe of a fused QKV Split whose K/V items the model also outputs.

References are independent: the ONNX reference evaluator, and the vendor calls' numpy contract
(``vendor_reference``) where the offloaded module runs on llvm.
"""
import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from tvm import relax

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tvm_nimble import NimbleExecutor  # noqa: E402
from tvm_nimble.compiler import stages  # noqa: E402
from tvm_nimble.compiler.build import build  # noqa: E402
from tvm_nimble.compiler.kernel_choice import chain_keys, one_stream  # noqa: E402
from tvm_nimble.compiler.options import BuildOptions  # noqa: E402
from tvm_nimble.compiler.session import BuildSession  # noqa: E402
from tvm_nimble.relay_passes.kernel_probe import build_probe  # noqa: E402
from tvm_nimble.relay_passes.providers import attention  # noqa: E402
from tvm_nimble.relay_passes.vendor_offload import OffloadReport, OffloadToVendor, find_offloads  # noqa: E402

SEQ, LAYERS, HEADS, KV_HEADS = 16, 2, 4, 2
CUDA = {"kind": "cuda", "arch": "sm_90"}
LEFT_PADDED = np.array([[0, 0, 0] + [1] * (SEQ - 3)], np.int64)  # rows 0-2 see no key: fully masked


def _decoder(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_embd=64, n_layer=LAYERS, n_head=HEADS, vocab_size=256, n_positions=128,
                                      attn_implementation="eager")
        return transformers.GPT2LMHeadModel(cfg).eval()
    cfg = transformers.Qwen2Config(hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                   num_key_value_heads=KV_HEADS, intermediate_size=128, vocab_size=256,
                                   max_position_embeddings=128, tie_word_embeddings=True, attn_implementation="eager")
    return transformers.Qwen2ForCausalLM(cfg).eval()


class _Outputs(torch.nn.Module):
    """(input_ids, attention_mask) -> logits, and with ``cache`` each layer's key and value states as well."""

    def __init__(self, model, cache: bool):
        super().__init__()
        self.model, self.cache = model, cache

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=self.cache)
        if not self.cache:
            return out.logits
        return (out.logits,) + tuple(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values))


def _export(kind: str, cache: bool = False) -> onnx.ModelProto:
    buf = io.BytesIO()
    ids, mask = torch.randint(0, 256, (1, SEQ)), torch.ones(1, SEQ, dtype=torch.int64)
    torch.onnx.export(_Outputs(_decoder(kind), cache), (ids, mask), buf, input_names=["input_ids", "attention_mask"],
                      opset_version=17, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


@pytest.fixture(scope="module")
def decoders():
    return {"gpt2": _export("gpt2"), "qwen": _export("qwen")}


def _inputs(mask=LEFT_PADDED):
    ids = np.random.default_rng(0).integers(0, 256, (1, SEQ)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def _imported(model, precision: str, target=CUDA):
    options = BuildOptions.create(target, precision=precision, timing_cache="off")
    return stages.apply_layout(stages.apply_precision(stages.import_model(model), options), options), options


def _rel(out, ref, rows):
    out, ref = np.asarray(out, np.float64)[0, rows], np.asarray(ref, np.float64)[0, rows]
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


# ---- (a) the kernel choice's probe ----------------------------------------------------------------------------

def test_a_probe_reads_the_items_of_a_split_the_model_also_outputs_as_tensors():
    """GPT-2 returning its key/value states: the K and V items of the fused QKV Split have uses outside the attention,
    so the attention chain takes the Q item but not the Split. The probe that times TVM's kernels for every provider's
    chains (kernel_choice.TvmChainTimes) had the Split's tuple as a parameter, and its build failed ("tensor 'c0_0' is
    not a tensor of known shape (Tuple...)"); the item is the chain's input now, and the probe builds for CUDA."""
    mod, options = _imported(_export("gpt2", cache=True), "fp32")
    found = {p.name: find_offloads(mod["main"], providers=[p]) for p in options.offload_providers()}
    assert found["attention"], "the attention must be offloaded for the probe to hold it"
    keys = {name: chain_keys(mod, offloads) for name, offloads in found.items() if offloads}
    key_of = {id(o): keys[name][o.signature] for name, offloads in found.items() for o in offloads}
    probe = build_probe(mod, offloads=[o for offloads in found.values() for o in offloads],
                        key=lambda o: key_of[id(o)])
    assert all(isinstance(p.ty, relax.TensorType) for p in probe.mod["main"].params)
    built = stages.build_fixed(probe.mod, one_stream(options).replace(compile_kernels=False), BuildSession(options))
    assert len(built.plan.outputs) == len(probe.signatures)


# ---- (b) offloaded in every precision, finite masks ----------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("kind", ["gpt2", "qwen"])
def test_every_decoder_attention_goes_to_the_fused_call(decoders, kind, precision):
    """Each layer's causal + padding attention is one fused call (fp16/bf16 exports cast the softmax's output more
    than once before ·V; Qwen2's K/V are repeated per query head), with no attention reason left in the report: in
    fp32 ours, in 16 bits cuDNN's with the mask as its bias and its causal mask on top (ahead of ours in the
    providers' order, as the kernels="vendor" build takes it)."""
    mod, options = _imported(decoders[kind], precision)
    report = OffloadReport()
    found = find_offloads(mod["main"], report=report, providers=options.offload_providers())
    provider, name = ((attention.PROVIDER.name, attention.SDPA_BIAS) if precision == "fp32" else
                      (attention.CUDNN_BIAS_PROVIDER.name, attention.CUDNN_BIAS_CAUSAL_SDPA))
    calls = [o for o in found if o.provider == provider]
    assert len(calls) == LAYERS, [o.signature for o in found]
    assert all(str(o.value[0].args[0].global_symbol) == name for o in calls)  # the mask is the bias
    assert not [why for op, why in report.kept if op == "attention"]


def _attention_calls(mod, name: str = attention.SDPA_BIAS) -> list[list]:
    """The arguments of each fused attention call with a mask (our kernel's, or ``name``) in ``mod``'s main: offloaded
    (call_dps_packed of the vendor name) or lowered (call_packed)."""
    calls = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if not isinstance(v, relax.Call):
                continue
            if isinstance(v.op, relax.ExternFunc) and str(v.op.global_symbol) == name:
                calls.append(list(v.args))
            elif (v.args and isinstance(v.args[0], relax.ExternFunc)
                  and str(v.args[0].global_symbol) == name):
                calls.append(list(v.args[1].fields))
    return calls


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("kind", ["gpt2", "qwen"])
def test_offloaded_decoders_compute_what_the_onnx_model_does(decoders, kind, precision, vendor_reference):
    """The all-vendor module on llvm, its attention calls run as their numpy contract (query head h reads KV head
    h // group, through the attrs' strided views), against the ONNX reference evaluator on the positions a query
    can attend from (left padding: rows 0-2 see no key)."""
    model = decoders[kind]
    mod, options = _imported(model, precision)
    offloaded = stages.offload(mod, options, providers=[attention.PROVIDER])
    assert len(_attention_calls(offloaded)) == LAYERS
    feeds = _inputs()
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    out = NimbleExecutor(build(offloaded, "llvm", max_streams=1))(**feeds)[0].numpy()
    assert np.isfinite(out).all()
    assert _rel(out, ref, slice(3, None)) < (1e-5 if precision == "fp32" else 1e-2)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", ["gpt2", "qwen"])
def test_cudnn_sdpa_takes_each_decoder_attention_with_its_mask_and_kv_groups(decoders, kind, precision,
                                                                             vendor_reference):
    """cuDNN's SDPA with a mask (provider cudnn_bias_sdpa, measured against ours by kernels="best"): each layer's
    causal + padding attention is one call that reads the fp32 mask and, for Qwen2, each KV head once (its last attr
    the group); the module on llvm, the calls as their numpy contract, computes what the ONNX model does."""
    model = decoders[kind]
    mod, options = _imported(model, precision)
    found = find_offloads(mod["main"], providers=[attention.CUDNN_BIAS_PROVIDER])
    assert len(found) == LAYERS and all(o.provider == "cudnn_bias_sdpa" for o in found)
    offloaded = stages.offload(mod, options, providers=[attention.CUDNN_BIAS_PROVIDER])
    # the exports' mask is causal whatever the inputs: cuDNN's causal mask on top (its tiles above the diagonal skipped)
    calls = _attention_calls(offloaded, attention.CUDNN_BIAS_CAUSAL_SDPA)
    assert len(calls) == LAYERS
    for _q, _k, _v, mask, attrs, *_rest in calls:
        values = [int(x) for x in attrs.values]
        assert mask.ty.dtype == "float32"  # the precision policy keeps the mask in fp32
        assert values[26:] == ([HEADS // KV_HEADS] if kind == "qwen" else [])
    feeds = _inputs()
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    out = NimbleExecutor(build(offloaded, "llvm", max_streams=1))(**feeds)[0].numpy().astype(np.float32)
    assert np.isfinite(out).all()
    assert _rel(out, ref, slice(3, None)) < (1e-2 if precision == "fp16" else 3e-2)


def _padded_attention(allowed: np.ndarray) -> onnx.ModelProto:
    """softmax(q·kᵀ / sqrt(d) + where(allowed & padding, 0, finfo(float32).min)) · v over [1, 2, 8, 8] q/k/v, the
    padding from an int64 mask input, ``allowed`` a constant [1, 1, 8, 8] as a decoder's export ands them."""
    low = np.finfo(np.float32).min
    inits = [helper.make_tensor("allowed", TensorProto.BOOL, [1, 1, 8, 8], allowed.ravel().tolist()),
             helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]), helper.make_tensor("low", TensorProto.FLOAT, [], [low]),
             helper.make_tensor("scale", TensorProto.FLOAT, [], [8 ** -0.5]),
             helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2])]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["scores"]),
             helper.make_node("Cast", ["mask"], ["keep"], to=TensorProto.BOOL),
             helper.make_node("Unsqueeze", ["keep", "axes"], ["keep4"]),
             helper.make_node("And", ["allowed", "keep4"], ["both"]),
             helper.make_node("Where", ["both", "zero", "low"], ["bias"]),
             helper.make_node("Add", ["scores", "bias"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    io_ = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 8, 8]) for n in ("q", "k", "v")]
    io_.append(helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 8]))
    graph = helper.make_graph(nodes, "padded", io_, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "not-causal"])
def test_cudnn_takes_its_causal_mask_only_where_the_model_masks_later_keys(causal, vendor_reference):
    """The causal variant (cuDNN skips the tiles above the diagonal) is emitted only where the mask is provably causal:
    a constant anded with the padding that is False above its diagonal. A constant that lets a query see a later key
    keeps the plain call; either way the module (the calls as their numpy contract, the causal one masking j > i
    itself) computes what the ONNX reference does."""
    allowed = np.tril(np.ones((8, 8), bool)) if causal else np.ones((8, 8), bool)
    allowed[5, :2] = False  # not a plain triangle: any constant False above the diagonal is causal
    model = _padded_attention(allowed.reshape(1, 1, 8, 8))
    mod, options = _imported(model, "fp16")
    offloaded = stages.offload(mod, options, providers=[attention.CUDNN_BIAS_PROVIDER])
    names = [attention.CUDNN_BIAS_CAUSAL_SDPA, attention.CUDNN_BIAS_SDPA]
    found = {n: len(_attention_calls(offloaded, n)) for n in names}
    assert found == ({names[0]: 1, names[1]: 0} if causal else {names[0]: 0, names[1]: 1})
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((1, 2, 8, 8)).astype(np.float32) for n in ("q", "k", "v")}
    feeds["mask"] = np.array([[1] * 6 + [0] * 2], np.int64)
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    out = NimbleExecutor(build(offloaded, "llvm", max_streams=1))(**feeds)[0].numpy().astype(np.float32)
    np.testing.assert_allclose(out, ref, atol=1e-2)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", ["gpt2", "qwen"])
def test_a_decoders_padding_reaches_cudnn_as_one_row_of_keys(decoders, kind, precision, vendor_reference):
    """Provider cudnn_key_mask: each layer's causal call reads the padding part of the mask alone, one [1, 1, 1, S]
    row of keys computed once for all layers (mask strides 0 but along the keys), with cuDNN's causal mask part of
    the call (cudnn_key_causal_sdpa); no [S, S] plane is computed any more. The module on llvm (the calls as their
    numpy contract) computes what the ONNX model does for every query that sees a key, and the left padding's rows
    that see none stay finite."""
    model = decoders[kind]
    mod, options = _imported(model, precision)
    offloaded = stages.offload(mod, options, providers=[attention.CUDNN_BIAS_PROVIDER, attention.KEY_MASK_PROVIDER])
    assert not _attention_calls(offloaded, attention.CUDNN_BIAS_CAUSAL_SDPA)
    calls = _attention_calls(offloaded, attention.CUDNN_KEY_CAUSAL_SDPA)
    assert len(calls) == LAYERS
    for _q, _k, _v, mask, attrs, *_rest in calls:
        assert mask.same_as(calls[0][3]) and mask.ty.dtype == "float32"
        assert [int(d) for d in mask.ty.shape.values] == [1, 1, 1, SEQ]
        assert [int(x) for x in attrs.values][21:25] == [0, 0, 0, 1]
    planes = [b.var for block in offloaded["main"].body.blocks for b in block.bindings  # a mask: bool or fp32, no heads
              if isinstance(b.var.ty, relax.TensorType) and b.var.ty.shape is not None and b.var.ty.dtype in
              ("bool", "float32") and [int(d) for d in b.var.ty.shape.values][-3:] == [1, SEQ, SEQ]]
    assert not planes, planes
    feeds = _inputs()
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    out = NimbleExecutor(build(offloaded, "llvm", max_streams=1))(**feeds)[0].numpy().astype(np.float32)
    assert np.isfinite(out).all()
    assert _rel(out, ref, slice(3, None)) < (1e-2 if precision == "fp16" else 3e-2)


def test_merged_qkv_rotated_as_one_reaches_cudnn_through_the_heads_split(decoders, vendor_reference):
    """Qwen2 merged (Q/K/V one GEMM, merge_siblings) in fp16: q and k are rotated by one chain over all six heads
    (merge_heads), and the cuDNN attention reads q (heads 0-3) and k (heads 4-5) from its result in place through the
    split along the heads (q offset 0, k offset 4 heads); the module on llvm, the calls as their numpy contract,
    computes what the ONNX model does."""
    from tvm_nimble.compiler.merge_choice import merged

    model = decoders["qwen"]
    mod, options = _imported(model, "fp16")
    mod, _groups = merged(mod)
    offloaded = stages.offload(mod, options, providers=[attention.CUDNN_BIAS_PROVIDER, attention.KEY_MASK_PROVIDER])
    calls = _attention_calls(offloaded, attention.CUDNN_KEY_CAUSAL_SDPA)
    assert len(calls) == LAYERS
    for q, k, _v, _mask, attrs, *_rest in calls:
        values = [int(x) for x in attrs.values]
        assert q.same_as(k) and [int(d) for d in q.ty.shape.values] == [1, HEADS + KV_HEADS, SEQ, 16]
        assert values[6] == 0 and values[10] == HEADS * SEQ * 16  # q and k offsets in the rotated heads
    feeds = _inputs()
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    out = NimbleExecutor(build(offloaded, "llvm", max_streams=1))(**feeds)[0].numpy().astype(np.float32)
    assert np.isfinite(out).all()
    assert _rel(out, ref, slice(3, None)) < 1e-2


@pytest.mark.parametrize("mask", [LEFT_PADDED, np.zeros((1, SEQ), np.int64)], ids=["left-padded", "all-masked"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", ["gpt2", "qwen"])
def test_fully_masked_queries_stay_finite_in_16_bits(decoders, kind, precision, mask):
    """TVM's softmax path on llvm: queries whose keys are all masked give finite logits in fp16/bf16 (float32's
    finfo.min mask is added in float32), and the other positions agree with the ONNX reference."""
    model = decoders[kind]
    feeds = _inputs(mask)
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    out = NimbleExecutor(build(model, "llvm", precision=precision))(**feeds)[0].numpy().astype(np.float32)
    assert np.isfinite(out).all()
    if mask.any():
        assert _rel(out, ref, slice(3, None)) < (1e-2 if precision == "fp16" else 3e-2)


def _masked_attention(mask_from_constants: bool) -> onnx.ModelProto:
    """softmax(q·kᵀ + mask)·v with a causal mask whose first query row sees no key (every entry finfo(float32).min),
    a constant, or computed from constants (Where(cond, 0, min)) as a static export computes it."""
    s, d = 4, 8
    allowed = np.tril(np.ones((s, s), bool))
    allowed[0] = False
    low = np.finfo(np.float32).min
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"])]
    if mask_from_constants:
        inits = [helper.make_tensor("allowed", TensorProto.BOOL, [s, s], allowed.ravel().tolist()),
                 helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
                 helper.make_tensor("low", TensorProto.FLOAT, [], [low])]
        nodes.append(helper.make_node("Where", ["allowed", "zero", "low"], ["mask"]))
    else:
        inits = [helper.make_tensor("mask", TensorProto.FLOAT, [s, s], np.where(allowed, 0, low).ravel().tolist())]
    nodes += [helper.make_node("Add", ["scores", "mask"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    io_ = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, s, d]) for n in ("q", "k", "v")]
    graph = helper.make_graph(nodes, "masked", io_, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, s, d])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("from_constants", [False, True], ids=["constant", "computed"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_float32_min_mask_is_saturated_not_infinite_in_16_bits(precision, from_constants):
    """The mask added in the scores' 16-bit dtype: finfo(float32).min cast to float16 is -inf, and the row that
    sees no key was NaN (-inf - -inf) where float32 gives the mean of v. The precision pass saturates it to the
    dtype's lowest finite value: that row is finite (its weights are whatever the rounding of min + score leaves,
    as in PyTorch's fp16 with finfo(float16).min) and the other rows agree with the ONNX reference."""
    model = _masked_attention(from_constants)
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((2, 4, 8)).astype(np.float32) for n in ("q", "k", "v")}
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    out = NimbleExecutor(build(model, "llvm", precision=precision))(**feeds)[0].numpy().astype(np.float32)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[:, 1:], ref[:, 1:], atol=5e-2 if precision == "bf16" else 1e-2)


# ---- (c) grouped-query attention -------------------------------------------------------------------------------

def test_grouped_query_attention_reads_each_kv_head_once(decoders):
    """Qwen2 (4 query heads, 2 KV heads) built for CUDA with kernels="vendor": each attention call reads K and V
    as the k_proj / v_proj outputs hold them (2 heads), its last attr is the group (2 query heads per KV head), and
    no kernel repeats K or V (repeat_kv's expand_dims / broadcast_to / reshape are gone from the lowered module)."""
    model = decoders["qwen"]
    mod, options = _imported(model, "fp16")
    lowered = stages.lower(stages.offload(mod, options.replace(kernels="vendor")), options.target)
    calls = _attention_calls(lowered, attention.CUDNN_KEY_CAUSAL_SDPA)  # fp16: cuDNN's, ahead of ours
    assert len(calls) == LAYERS
    for _q, k, v, _mask, attrs, *_outputs in calls:
        values = [int(x) for x in attrs.values]
        assert len(values) == 27 and values[1] == HEADS and values[26] == HEADS // KV_HEADS
        for kv in (k, v):  # k after RoPE [1, KV_HEADS, S, 16], v_proj's output [1, S, KV_HEADS * 16]: never repeated
            assert int(np.prod([int(d) for d in kv.ty.shape.values])) == SEQ * KV_HEADS * 16
    names = [gv.name_hint for gv in lowered.functions]
    assert not [n for n in names if "expand_dims" in n], names
