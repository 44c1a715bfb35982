"""Hugging Face transformers as bench models: ``hf:NAME``, random weights from a config built in code
(no download), integer ``input_ids`` and an ``attention_mask`` as inputs.

The PyTorch model the peers run uses PyTorch's fused attention (``attn_implementation="sdpa"``, what
transformers picks by default); the ONNX file Nimble and ONNX Runtime build is exported from the same
weights with the eager attention, which the exporter spells as MatMul, scale, mask Add, Softmax and
MatMul.
"""
from __future__ import annotations

#: NAME -> (config keywords, sequence length): BERT-base and BERT-large as in the BERT paper, and the
#: 2-layer BERT-tiny (Turc et al.'s google/bert_uncased_L-2_H-128_A-2) for quick checks
CONFIGS = {
    "bert-tiny": ({"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "intermediate_size": 512}, 128),
    "bert-base": ({}, 128),
    "bert-large": ({"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                    "intermediate_size": 4096}, 128),
}


def hf_builders(spec: str):
    """(label, onnx builder, torch builder) of ``hf:NAME`` (see :data:`CONFIGS`); each builder takes ``batch``."""
    import copy
    import io

    source, _, name = spec.partition(":")
    if source != "hf" or name not in CONFIGS:
        raise ValueError(f"model {spec!r}: the Hugging Face models are {', '.join('hf:' + n for n in CONFIGS)}")
    try:
        import torch
        import transformers
    except ImportError as err:
        raise ValueError(f"model {spec!r} needs PyTorch and transformers ({err.name} is missing): "
                         "pip install torch transformers") from None
    import onnx

    keywords, seq = CONFIGS[name]
    built = []

    class Encoder(torch.nn.Module):
        """The encoder's last hidden state from (input_ids, attention_mask): one tensor out, which every
        system returns alike."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def torch_model(batch=1):
        if not built:
            torch.manual_seed(0)
            config = transformers.BertConfig(**keywords, attn_implementation="sdpa")
            built.append(Encoder(transformers.BertModel(config, add_pooling_layer=False)).eval())
        return copy.deepcopy(built[0])

    def onnx_model(batch=1):
        model = torch_model(batch)
        # exported with the eager attention (MatMul, Div, Add mask, Softmax, MatMul), as ONNX exports of
        # transformers spell it; the SDPA path exports a NaN guard after the softmax besides
        model.model.config._attn_implementation = "eager"
        ids = torch.zeros(batch, seq, dtype=torch.int64)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        buf = io.BytesIO()
        torch.onnx.export(model, (ids, mask), buf, input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False)
        return onnx.load_from_string(buf.getvalue())

    return f"hf-{name}", onnx_model, torch_model
