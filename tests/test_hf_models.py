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
