"""Tiny causal decoders as ONNX models, for tests that need a real transformer: the bench's ``hf:gpt2-tiny`` (a
2-layer GPT-2) and ``hf:llama-tiny`` (a 2-layer Llama decoder: grouped-query attention, rotary positions, RMSNorm,
SwiGLU, tied embeddings), exported as the bench exports them (tvm_nimble/bench/hf_models.py).

Each takes ``input_ids`` and ``attention_mask`` (int64, ``[batch, sequence_length]``) and returns ``logits``
(``[batch, sequence_length, 256]``), exported with PyTorch's eager attention (opset 17, TorchScript exporter). The
weights are seeded, so every process builds the same model; each is made once per process (exporting takes a few
seconds). ``dynamic=True`` names the batch and sequence dimensions ``batch`` and ``sequence_length`` (ONNX
dim_params); ``dynamic=False`` fixes them at the export's shape, [1, 16]. Needs torch and transformers.

``tiny_gpt2_past_onnx`` / ``tiny_llama_past_onnx`` are the same weights exported with past key/values for
token-by-token generation (``past_onnx_model``: ``position_ids`` and per layer ``past_key_values.{i}.key/.value``
in, ``present.{i}.key/.value`` out, every dimension symbolic).
"""
from __future__ import annotations

import functools

import onnx

VOCAB = 256
#: the shape the models are exported at (``dynamic=False`` keeps it)
EXPORT_SHAPE = (1, 16)


@functools.cache
def _builders(spec: str):
    from tvm_nimble.bench.hf_models import hf_builders

    return hf_builders(spec)


@functools.cache
def tiny_gpt2_onnx(dynamic: bool = True) -> onnx.ModelProto:
    """A 2-layer GPT-2 (64 wide, 4 heads, vocabulary 256) returning logits."""
    return _builders("hf:gpt2-tiny")[1](EXPORT_SHAPE[0], dynamic=dynamic)


@functools.cache
def tiny_llama_onnx(dynamic: bool = True) -> onnx.ModelProto:
    """A 2-layer Llama decoder (64 wide, 4 heads, 2 KV heads, MLP 128, vocabulary 256, tied embeddings) returning
    logits."""
    return _builders("hf:llama-tiny")[1](EXPORT_SHAPE[0], dynamic=dynamic)


@functools.cache
def tiny_gpt2_past_onnx() -> onnx.ModelProto:
    """The 2-layer GPT-2 with past key/values in and present key/values out (4 KV heads of 16)."""
    from tvm_nimble.bench.hf_models import past_onnx_model

    return past_onnx_model("hf:gpt2-tiny", EXPORT_SHAPE[0])


@functools.cache
def tiny_llama_past_onnx() -> onnx.ModelProto:
    """The 2-layer Llama decoder with past key/values in and present key/values out (2 KV heads of 16)."""
    from tvm_nimble.bench.hf_models import past_onnx_model

    return past_onnx_model("hf:llama-tiny", EXPORT_SHAPE[0])


def tiny_torch(spec: str):
    """The PyTorch module (SDPA attention) of ``hf:gpt2-tiny`` / ``hf:llama-tiny``, a fresh copy each call."""
    return _builders(spec)[2](EXPORT_SHAPE[0])
