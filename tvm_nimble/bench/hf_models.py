"""Hugging Face transformers as bench models: ``hf:NAME`` (or ``hf:NAME@LENGTH`` for another sequence length),
random weights from a config built in code (no download), integer ``input_ids`` and an ``attention_mask`` as
inputs.

Encoders (BERT) return their last hidden state; decoders (GPT-2, a Llama-style decoder of Qwen2.5-0.5B's shape)
return the language-model head's logits over the whole sequence, as a prompt's prefill computes them.

The PyTorch model the peers run uses PyTorch's fused attention (``attn_implementation="sdpa"``, what
transformers picks by default); the ONNX file Nimble and ONNX Runtime build is exported from the same
weights with the eager attention, which the exporter spells as MatMul, scale, mask, Softmax and MatMul.
A model over protobuf's 2 GB limit (the 0.5B decoder in float32) is exported with its weights as external
data and loaded back into memory.

A decoder's token-by-token form, :func:`past_onnx_model`, is the same weights exported with past key/values in and
present key/values out, named as optimum and ONNX Runtime GenAI name them.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HfModel:
    """One bench model: the transformers class and config keywords, the default sequence length."""

    config: str  # transformers config class
    model: str  # transformers model class
    keywords: dict = field(default_factory=dict)
    seq: int = 128

    @property
    def decoder(self) -> bool:
        return self.model.endswith("ForCausalLM") or self.model.endswith("LMHeadModel")


#: NAME -> model: BERT-base and BERT-large as in the BERT paper, the 2-layer BERT-tiny (Turc et al.'s
#: google/bert_uncased_L-2_H-128_A-2) for quick checks; GPT-2 small (GPT2Config's defaults: 12 layers, hidden 768,
#: learned positions, GELU-tanh, the fused QKV projection split in three); ``llama-0.5b``, a Llama decoder of
#: Qwen2.5-0.5B's shape (RMSNorm, rotary embeddings, 14 query / 2 KV heads, SwiGLU MLP, tied embeddings);
#: ``gpt2-tiny`` and ``llama-tiny``, their 2-layer miniatures
MODELS = {
    "bert-tiny": HfModel("BertConfig", "BertModel", {"hidden_size": 128, "num_hidden_layers": 2,
                                                     "num_attention_heads": 2, "intermediate_size": 512}),
    "bert-base": HfModel("BertConfig", "BertModel"),
    "bert-large": HfModel("BertConfig", "BertModel", {"hidden_size": 1024, "num_hidden_layers": 24,
                                                      "num_attention_heads": 16, "intermediate_size": 4096}),
    "gpt2": HfModel("GPT2Config", "GPT2LMHeadModel"),
    "gpt2-tiny": HfModel("GPT2Config", "GPT2LMHeadModel", {"n_embd": 64, "n_layer": 2, "n_head": 4,
                                                           "vocab_size": 256, "n_positions": 512,
                                                           "bos_token_id": 0, "eos_token_id": 0}, seq=16),
    "llama-0.5b": HfModel("LlamaConfig", "LlamaForCausalLM", {
        "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 32768}),
    "llama-tiny": HfModel("LlamaConfig", "LlamaForCausalLM", {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 256, "tie_word_embeddings": True,
        "max_position_embeddings": 512}, seq=16),
}
#: the protobuf limit of one serialized ONNX model
_PROTOBUF_LIMIT = 2**31 - 1


def parse_spec(spec: str) -> tuple[str, HfModel, int]:
    """(name, model, sequence length) of ``hf:NAME`` or ``hf:NAME@LENGTH``; one line for a bad spec."""
    source, _, rest = spec.partition(":")
    name, at, length = rest.partition("@")
    if source != "hf" or name not in MODELS:
        raise ValueError(f"model {spec!r}: the Hugging Face models are {', '.join('hf:' + n for n in MODELS)} "
                         "(hf:NAME@LENGTH for another sequence length)")
    model = MODELS[name]
    if not at:
        return name, model, model.seq
    if not length.isdigit() or int(length) < 1:
        raise ValueError(f"model {spec!r}: the sequence length after '@' must be a positive integer, e.g. hf:{name}@512")
    return name, model, int(length)


def hf_builders(spec: str):
    """(label, onnx builder, torch builder) of ``hf:NAME[@LENGTH]`` (see :data:`MODELS`); each builder takes
    ``batch``."""
    import copy

    name, spec_model, seq = parse_spec(spec)
    try:
        import torch
        import transformers
    except ImportError as err:
        raise ValueError(f"model {spec!r} needs PyTorch and transformers ({err.name} is missing): "
                         "pip install torch transformers") from None

    built = []

    class Wrapped(torch.nn.Module):
        """One tensor out from (input_ids, attention_mask), which every system returns alike: an encoder's last
        hidden state, a decoder's logits (no cache: the prompt's forward pass)."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            if spec_model.decoder:
                return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def torch_model(batch=1):
        if not built:
            torch.manual_seed(0)
            config = getattr(transformers, spec_model.config)(**spec_model.keywords, attn_implementation="sdpa")
            extra = {"add_pooling_layer": False} if spec_model.model == "BertModel" else {}
            model = getattr(transformers, spec_model.model)(config, **extra)
            built.append(Wrapped(model).eval())
        return copy.deepcopy(built[0])

    def onnx_model(batch=1, dynamic=False):
        """The ONNX export at ``batch`` x the sequence length, or with ``dynamic`` both as symbolic dims ("batch",
        "sequence_length"), as optimum exports them, for buckets and ONNX Runtime's dynamic shapes."""
        # exported from a copy (the exporter's tracing changes a GPT-2 module's later outputs), with the eager
        # attention (MatMul, scale, mask, Softmax, MatMul), as ONNX exports of transformers spell it; the SDPA path
        # exports a NaN guard after the softmax besides
        model = torch_model(batch)
        model.model.config._attn_implementation = "eager"
        ids = torch.zeros(batch, seq, dtype=torch.int64)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        output = "logits" if spec_model.decoder else "last_hidden_state"
        axes = {0: "batch", 1: "sequence_length"}
        return export_onnx(model, (ids, mask), ["input_ids", "attention_mask"], [output],
                           {"input_ids": axes, "attention_mask": axes, output: axes} if dynamic else None)

    return f"hf-{name}" + (f"-s{seq}" if seq != spec_model.seq else ""), onnx_model, torch_model


def cache_keyword(model) -> str:
    """The keyword a transformers causal LM's ``forward`` takes its KV cache by: ``cache`` where the installed
    transformers has it (``past_key_values`` is deprecated there), else ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def past_names(layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) of a with-past decoder of ``layers`` layers: ``input_ids``, ``attention_mask``,
    ``position_ids``, then ``past_key_values.{i}.key`` / ``.value`` per layer; ``logits``, then
    ``present.{i}.key`` / ``.value`` per layer."""
    kv = [(i, part) for i in range(layers) for part in ("key", "value")]
    return (["input_ids", "attention_mask", "position_ids"] + [f"past_key_values.{i}.{p}" for i, p in kv],
            ["logits"] + [f"present.{i}.{p}" for i, p in kv])


def past_onnx_model(spec: str, batch: int = 1, model=None):
    """The decoder ``hf:NAME`` (the weights of :func:`hf_builders`'s torch model) exported with past key/values,
    as optimum and ONNX Runtime GenAI export decoders for token-by-token generation.

    Inputs: ``input_ids`` and ``position_ids`` ``[batch, sequence_length]``, ``attention_mask`` ``[batch,
    total_sequence_length]`` (int64), and per layer ``past_key_values.{i}.key`` / ``.value`` ``[batch,
    num_kv_heads, past_sequence_length, head_dim]`` (float32). Outputs: ``logits`` ``[batch, sequence_length,
    vocab]``, then per layer ``present.{i}.key`` / ``.value`` ``[batch, num_kv_heads, total_sequence_length,
    head_dim]``: the past with this step's keys and values appended. Every one of those dims is symbolic, under
    those names; ``batch`` is only the traced example's. Eager attention, opset 17, the TorchScript exporter
    (see :func:`export_onnx`; a model over 2 GB goes through external data). ``model``: another transformers
    decoder of ``spec``'s kind to export instead (a test's, with its weights changed), exported from a copy."""
    _, spec_model, _ = parse_spec(spec)
    if not spec_model.decoder:
        decoders = ", ".join("hf:" + n for n, m in MODELS.items() if m.decoder)
        raise ValueError(f"model {spec!r} is an encoder: only the decoders ({decoders}) export with past key/values")
    import copy

    import torch
    import transformers

    # a fresh copy of the seeded torch model (the exporter's tracing changes a GPT-2 module's later outputs)
    model = hf_builders(spec)[2](batch).model if model is None else copy.deepcopy(model)
    model.config._attn_implementation = "eager"
    config = model.config
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    keyword = cache_keyword(model)

    class WithPast(torch.nn.Module):
        """(logits, present key/values) from (input_ids, attention_mask, position_ids, past key/values): the past
        goes into a ``DynamicCache``, which the model extends in place with this step's keys and values."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = transformers.DynamicCache(config=self.model.config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, **{keyword: cache})
            return (out.logits, *(t for layer in cache.layers[:layers] for t in (layer.keys, layer.values)))

    # the traced example: distinct past and new lengths, so the exporter does not tie the two dims together
    past_len, new_len = 4, 3
    ids = torch.zeros(batch, new_len, dtype=torch.int64)
    mask = torch.ones(batch, past_len + new_len, dtype=torch.int64)
    positions = torch.arange(past_len, past_len + new_len).expand(batch, new_len)
    past = [torch.zeros(batch, kv_heads, past_len, head_dim) for _ in range(2 * layers)]
    inputs, outputs = past_names(layers)
    tokens = {0: "batch", 1: "sequence_length"}
    axes = {"input_ids": tokens, "position_ids": tokens, "logits": tokens,
            "attention_mask": {0: "batch", 1: "total_sequence_length"}}
    axes.update({n: {0: "batch", 2: "past_sequence_length"} for n in inputs[3:]})
    axes.update({n: {0: "batch", 2: "total_sequence_length"} for n in outputs[1:]})
    return export_onnx(WithPast(model).eval(), (ids, mask, positions, *past), inputs, outputs, axes)


def export_onnx(module, args, input_names, output_names, dynamic_axes=None):
    """``module`` exported with the TorchScript exporter (opset 17) and loaded as an ``onnx.ModelProto``; one over
    protobuf's 2 GB limit goes through a temporary folder with its weights as external data."""
    import io
    import os
    import tempfile

    import onnx
    import torch

    kwargs = dict(input_names=input_names, output_names=output_names, opset_version=17, dynamo=False,
                  dynamic_axes=dynamic_axes)
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    with torch.no_grad():
        if size < _PROTOBUF_LIMIT // 2:  # small enough with room for the exporter's copies of tied weights
            buf = io.BytesIO()
            torch.onnx.export(module, args, buf, **kwargs)
            return onnx.load_from_string(buf.getvalue())
        with tempfile.TemporaryDirectory(prefix="tvm-nimble-export-") as tmp:
            path = os.path.join(tmp, "model.onnx")
            torch.onnx.export(module, args, path, **kwargs)
            return onnx.load(path, load_external_data=True)
