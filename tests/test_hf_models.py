"""The Hugging Face bench models (``hf:NAME[@LENGTH]``, tvm_nimble/bench/hf_models.py): the decoders' ONNX exports
build with Nimble and give PyTorch's outputs (the model's own framework, run before any export), and bad names
are one line."""
import numpy as np
import pytest

from tvm_nimble.bench.hf_models import MODELS, parse_spec


@pytest.mark.parametrize("spec, message", [
    ("hf:gpt3", "hf:gpt2"),  # an unknown name lists the known ones
    ("hf:gpt2@x", "positive integer"),
    ("hf:gpt2@0", "positive integer"),
])
def test_a_bad_spec_is_one_line(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def test_a_length_after_the_name_overrides_the_default():
    assert parse_spec("hf:llama-0.5b@512")[2] == 512 and parse_spec("hf:gpt2")[2] == MODELS["gpt2"].seq
    assert MODELS["gpt2"].decoder and MODELS["llama-0.5b"].decoder and not MODELS["bert-base"].decoder


@pytest.mark.parametrize("spec", ["hf:gpt2-tiny", "hf:llama-tiny@24"])
def test_the_tiny_decoders_build_and_match_pytorch(spec):
    """GPT-2 (learned positions, GELU-tanh, fused QKV split in three) and a Llama decoder (RMSNorm, rotary
    embeddings, grouped-query attention, SwiGLU, tied embeddings), exported as the bench exports them, built on
    llvm: the logits at every position equal PyTorch's, with the bench's right-padded mask."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm_nimble import NimbleExecutor, build, zoo
    from tvm_nimble.bench.hf_models import hf_builders

    _, onnx_builder, torch_builder = hf_builders(spec)
    module = torch_builder(1)
    model = onnx_builder(1)
    feeds = zoo.random_inputs(model, seed=0)
    with torch.no_grad():
        expected = module(*[torch.from_numpy(v) for v in feeds.values()]).numpy()
    assert np.abs(expected[0, 0] - expected[0, 1]).max() > 1e-3  # the logits depend on the tokens
    got = NimbleExecutor(build(model, "llvm"))(*feeds.values())[0].numpy()
    assert got.shape == expected.shape == (1, parse_spec(spec)[2], 256)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_with_past_export_chained_gives_the_full_sequence_logits(name):
    """The with-past export (``past_onnx_model``) run token by token by ONNX's reference evaluator: a 5-token
    prompt prefilled from an empty past, then 3 single tokens each fed the previous step's presents, gives at each
    step the last position's logits of the full-sequence export run on the whole sequence so far; the presents grow
    by the step's tokens, and the named dims are symbolic."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import decoder_models
    from onnx.reference import ReferenceEvaluator

    from tvm_nimble.bench.hf_models import past_names

    with_past = getattr(decoder_models, f"tiny_{name}_past_onnx")()
    full = ReferenceEvaluator(getattr(decoder_models, f"tiny_{name}_onnx")(dynamic=True))
    inputs, outputs = past_names(2)
    assert [i.name for i in with_past.graph.input] == inputs and [o.name for o in with_past.graph.output] == outputs
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*with_past.graph.input, *with_past.graph.output]}
    assert dims["attention_mask"] == ["batch", "total_sequence_length"]
    assert dims["past_key_values.1.value"][::2] == ["batch", "past_sequence_length"]
    assert dims["present.0.key"][::2] == ["batch", "total_sequence_length"]
    step = ReferenceEvaluator(with_past)
    kv_heads, head_dim = dims["present.0.key"][1], dims["present.0.key"][3]

    sequence = list(np.random.default_rng(0).integers(0, decoder_models.VOCAB, size=8))
    past = {n: np.zeros((1, kv_heads, 0, head_dim), np.float32) for n in inputs[3:]}
    done = 0
    for end in (5, 6, 7, 8):  # the prompt's prefill, then one token a step
        got = step.run(None, {"input_ids": np.array([sequence[done:end]], np.int64),
                              "attention_mask": np.ones((1, end), np.int64),
                              "position_ids": np.arange(done, end, dtype=np.int64)[None], **past})
        ids = np.array([sequence[:end]], np.int64)
        (want,) = full.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        assert got[0].shape == (1, end - done, decoder_models.VOCAB)
        np.testing.assert_allclose(got[0][0, -1], want[0, -1], atol=1e-4, rtol=0)
        assert all(p.shape == (1, kv_heads, end, head_dim) for p in got[1:])
        past, done = dict(zip(inputs[3:], got[1:])), end


def test_an_encoder_has_no_with_past_export():
    from tvm_nimble.bench.hf_models import past_onnx_model

    with pytest.raises(ValueError, match="encoder.*hf:gpt2"):
        past_onnx_model("hf:bert-tiny")
