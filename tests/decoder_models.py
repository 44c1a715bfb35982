"""Tiny causal decoders as ONNX models, for tests that need a real transformer: a GPT-2 and a
Qwen2/Llama-style decoder (grouped-query attention, rotary positions, RMSNorm, tied embeddings).

Each takes ``input_ids`` and ``attention_mask`` (int64, ``[batch, sequence_length]``) and returns
``logits`` (``[batch, sequence_length, 256]``), exported with PyTorch's eager attention (opset 17,
TorchScript exporter). The weights are seeded, so every process builds the same model; each is made
once per process (exporting takes a few seconds). ``dynamic=True`` names the batch and sequence
dimensions ``batch`` and ``sequence_length`` (ONNX dim_params); ``dynamic=False`` fixes them at the
export's shape, [1, 16]. Needs torch and transformers.
"""
from __future__ import annotations

import functools
import io

import onnx

VOCAB = 256
#: the shape the models are exported at (``dynamic=False`` keeps it)
EXPORT_SHAPE = (1, 16)
DYNAMIC_AXES = {name: {0: "batch", 1: "sequence_length"} for name in ("input_ids", "attention_mask", "logits")}


def _gpt2():
    import transformers

    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=128, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="eager")
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    import transformers

    cfg = transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=128,
                                   tie_word_embeddings=True, attn_implementation="eager")
    return transformers.Qwen2ForCausalLM(cfg)


def _export(make, dynamic: bool) -> onnx.ModelProto:
    import torch

    class Logits(torch.nn.Module):  # the logits alone (no cache) from ids and mask
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    torch.manual_seed(0)
    model = Logits(make().eval())
    ids = torch.randint(0, VOCAB, EXPORT_SHAPE)
    mask = torch.ones(EXPORT_SHAPE, dtype=torch.int64)
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), buf, input_names=["input_ids", "attention_mask"],
                          output_names=["logits"], opset_version=17, dynamo=False,
                          dynamic_axes=DYNAMIC_AXES if dynamic else None)
    return onnx.load_from_string(buf.getvalue())


@functools.cache
def tiny_gpt2_onnx(dynamic: bool = True) -> onnx.ModelProto:
    """A 2-layer GPT-2 (64 wide, 4 heads, 128 positions, vocabulary 256) returning logits."""
    return _export(_gpt2, dynamic)


@functools.cache
def tiny_llama_onnx(dynamic: bool = True) -> onnx.ModelProto:
    """A 2-layer Qwen2/Llama-style decoder (64 wide, 4 heads, 2 KV heads, MLP 128, vocabulary 256, tied
    embeddings) returning logits."""
    return _export(_llama, dynamic)
