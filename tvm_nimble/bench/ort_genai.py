"""ONNX Runtime GenAI as a generation peer (``tvm-nimble bench --generate``, system ``ort-genai``): its generator
loop (``og.Generator``: the prompt appended, then one ``generate_next_token`` per token, greedy on the device)
over the same with-past ONNX export Nimble builds (:func:`tvm_nimble.bench.hf_models.past_onnx_model`).

Two layers: a model folder ORT GenAI loads (``model.onnx`` and ``genai_config.json``), written by
:func:`builder_model_dir` for the decoders ORT GenAI's own model builder takes (:data:`BUILDER_ARCHITECTURES`: the
Llama family, as its users deploy them: GroupQueryAttention over one max-length cache shared by past and present,
the decode step a CUDA graph on the CUDA provider) and by :func:`genai_model_dir` from the with-past export for the
others (GPT-2); :func:`ort_genai` times greedy generation from it as a
:class:`~tvm_nimble.bench.generate_peers.GenerationTiming`.

The export's names are ORT GenAI's own (``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.%d.key`` / ``.value`` in; ``logits``, ``present.%d.key`` / ``.value`` out); the config names
them anyway, from the graph, so a differently named export fails here in one line rather than inside ORT GenAI.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

from tvm_nimble.bench.generate_peers import GenerationTiming, check_settings, prompt_rows
from tvm_nimble.bench.hf_models import past_names
from tvm_nimble.errors import NimbleError

#: the execution providers this peer runs on (ORT GenAI's names)
PROVIDERS = ("cpu", "cuda")
#: the precisions the model folder can be written in (bf16: no converter, as for the ORT peers)
GENAI_PRECISIONS = ("fp32", "fp16")
#: protobuf's limit on one serialized model: a larger one is written with its weights as external data
_PROTOBUF_LIMIT = 2**31 - 1
#: the transformers architectures this peer hands to ORT GenAI's model builder (which takes them and many more)
BUILDER_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
#: the precisions the builder writes a model in (it converts the weights itself)
BUILDER_PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class GenAiModel:
    """A model folder for ORT GenAI and what it was written with.

    ``stop_token``: the id the config names as end-of-sequence and padding. ORT GenAI needs both to be ids in the
    vocabulary, stops at the first, and treats the second at a prompt's end as padding (its logits are then read
    from an earlier position), while greedy decoding here runs the full length with no id special. So the logits
    get one more column, always -inf, and that column's id is the one no prompt holds and no step picks.

    ``shared_buffers`` / ``cuda_graph``: whether past and present key/values share one max-length buffer and the
    decode step is captured as a CUDA graph. Both off for this export: its attention concatenates the past with
    the step's keys and values, so each present is a new, longer tensor; ORT GenAI shares buffers (and, only
    then, captures graphs) for a model whose attention writes into a max-length cache in place
    (GroupQueryAttention, as ORT GenAI's own model builder emits)."""

    directory: str
    provider: str
    precision: str
    vocab_size: int
    stop_token: int
    shared_buffers: bool = False
    cuda_graph: bool = False
    built_by_genai: bool = False  # the folder is ORT GenAI's model builder's (builder_model_dir)

    @property
    def note(self) -> str:
        if self.built_by_genai:
            return (f"ONNX Runtime GenAI og.Generator, greedy, {self.provider} provider, the model written by its "
                    f"own builder (onnxruntime_genai.models.builder -p {self.precision}: GroupQueryAttention, past "
                    f"and present {'sharing one buffer' if self.shared_buffers else 'separate'}, CUDA graph "
                    f"{'on' if self.cuda_graph else 'off'}), logits padded by one -inf column (its id the "
                    "end-of-sequence and padding id)")
        return (f"ONNX Runtime GenAI og.Generator, greedy, {self.provider} provider, the with-past export in "
                f"{self.precision}, logits padded by one -inf column (its id the end-of-sequence and padding id "
                "ORT GenAI requires); past/present buffers not shared and no CUDA graph: the export's attention "
                "concatenates the past (ORT GenAI shares them only for GroupQueryAttention models)")


def genai_model_dir(onnx_model, torch_model_or_config, out_dir: str, precision: str = "fp32",
                    provider: str = "cpu") -> GenAiModel:
    """Write ``out_dir``/``model.onnx`` (its weights in ``model.onnx.data`` when over 2 GB) and
    ``genai_config.json`` for ORT GenAI from the with-past export ``onnx_model`` of the transformers decoder
    ``torch_model_or_config`` (its config gives the heads, sizes and context length).

    fp16 converts the whole model, past and present included (ORT GenAI keeps its cache in the model's input
    dtype), with the converter the ORT peers use (:func:`.onnxruntime_peer.fp16_model`) but without keeping
    float32 inputs and outputs."""
    import onnx

    from tvm_nimble.compiler.frontend.onnx_import import fits_in_memory_checks

    if provider not in PROVIDERS:
        raise NimbleError(f"ORT GenAI provider {provider!r}: use one of {', '.join(PROVIDERS)}")
    if precision not in GENAI_PRECISIONS:
        raise NimbleError(f"ORT GenAI in {precision}: the model folder is written in {', '.join(GENAI_PRECISIONS)} "
                          "only (no converter to bfloat16, as for the ONNX Runtime peers)")
    config = _hf_config(torch_model_or_config)
    layers = config.num_hidden_layers
    inputs, outputs = past_names(layers)
    have = ([i.name for i in onnx_model.graph.input], [o.name for o in onnx_model.graph.output])
    if have != (inputs, outputs):
        raise NimbleError(f"ORT GenAI needs a with-past decoder export of {layers} layers (inputs {inputs[:4]}..., "
                          f"outputs {outputs[:2]}...), got inputs {have[0][:4]}..., outputs {have[1][:2]}...: "
                          "pass tvm_nimble.bench.hf_models.past_onnx_model(spec)")
    model = onnx.ModelProto()
    model.CopyFrom(onnx_model)
    if precision == "fp16":
        from tvm_nimble.bench.onnxruntime_peer import fp16_model

        model = fp16_model(model, keep_io_types=False)  # without the converter: one line, how to install it
    vocab_size = _pad_logits(model)
    heads = config.num_attention_heads
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.onnx")
    if fits_in_memory_checks(model, limit=_PROTOBUF_LIMIT):
        onnx.save(model, path)
    else:
        onnx.save(model, path, save_as_external_data=True, location="model.onnx.data")
    genai = GenAiModel(out_dir, provider, precision, vocab_size, stop_token=vocab_size)
    context = getattr(config, "max_position_embeddings", None) or config.n_positions
    search = {"do_sample": False, "num_beams": 1, "top_k": 1, "min_length": 0, "max_length": context,
              "early_stopping": True, "past_present_share_buffer": genai.shared_buffers}
    decoder = {
        "filename": "model.onnx",
        "session_options": {"log_id": "tvm-nimble",
                            "provider_options": [] if provider == "cpu" else [
                                {provider: {"enable_cuda_graph": "1" if genai.cuda_graph else "0"}}]},
        "head_size": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "hidden_size": config.hidden_size, "num_attention_heads": heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or heads, "num_hidden_layers": layers,
        "inputs": {"input_ids": inputs[0], "attention_mask": inputs[1], "position_ids": inputs[2],
                   "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
        "outputs": {"logits": outputs[0], "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"},
    }
    # "decoder": ORT GenAI's generic decoder-only model (its "gpt2" type expects one combined past per layer)
    document = {"model": {"type": "decoder", "context_length": context, "vocab_size": vocab_size + 1,
                          "eos_token_id": genai.stop_token, "pad_token_id": genai.stop_token, "decoder": decoder},
                "search": search}
    with open(os.path.join(out_dir, "genai_config.json"), "w") as f:
        json.dump(document, f, indent=1)
    return genai


def builder_model_dir(torch_model, out_dir: str, precision: str = "fp32", provider: str = "cpu") -> GenAiModel:
    """Write ``out_dir`` with ORT GenAI's own model builder from the transformers decoder ``torch_model`` (the
    bench's wrapper of one, or the module), as a user of ORT GenAI would: the checkpoint saved with a word-level
    tokenizer over its vocabulary (the builder saves one; the ids are all that is generated), then
    ``python -m onnxruntime_genai.models.builder`` in ``precision`` for ``provider`` (CUDA graphs on for CUDA),
    then the logits padded by the never-picked stop id (see :class:`GenAiModel`)."""
    import subprocess
    import sys

    import onnx
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    if provider not in PROVIDERS:
        raise NimbleError(f"ORT GenAI provider {provider!r}: use one of {', '.join(PROVIDERS)}")
    if precision not in BUILDER_PRECISIONS:
        raise NimbleError(f"ORT GenAI's model builder in {precision}: use one of {', '.join(BUILDER_PRECISIONS)}")
    module = next((m for m in (torch_model, getattr(torch_model, "model", None))
                   if isinstance(m, transformers.PreTrainedModel)), None)
    if module is None or type(module).__name__ not in BUILDER_ARCHITECTURES:
        raise NimbleError(f"ORT GenAI's model builder is used here for {', '.join(BUILDER_ARCHITECTURES)}; "
                          f"got {type(torch_model).__name__}: use genai_model_dir with the with-past export")
    checkpoint, onnx_dir = os.path.join(out_dir, "checkpoint"), os.path.join(out_dir, "model")
    module.save_pretrained(checkpoint)
    vocab = module.config.vocab_size
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0").save_pretrained(checkpoint)
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", checkpoint, "-o", onnx_dir,
               "-p", precision, "-e", provider, "-c", os.path.join(out_dir, "cache")]
    if provider == "cuda":
        command += ["--extra_options", "enable_cuda_graph=1"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise NimbleError(f"ORT GenAI's model builder failed: {last[0][:300]}")
    path = os.path.join(onnx_dir, "model.onnx")
    model = onnx.load(path)
    vocab_size = _pad_logits(model)
    for f in os.listdir(onnx_dir):
        if f.startswith("model.onnx"):
            os.remove(os.path.join(onnx_dir, f))
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data")
    config_path = os.path.join(onnx_dir, "genai_config.json")
    with open(config_path) as f:
        document = json.load(f)
    document["model"].update(vocab_size=vocab_size + 1, eos_token_id=vocab_size, pad_token_id=vocab_size)
    decoder = document["model"]["decoder"]
    options = [o.get(provider, {}) for o in decoder.get("session_options", {}).get("provider_options", [])]
    with open(config_path, "w") as f:
        json.dump(document, f, indent=1)
    return GenAiModel(onnx_dir, provider, precision, vocab_size, stop_token=vocab_size,
                      shared_buffers=bool(document.get("search", {}).get("past_present_share_buffer")),
                      cuda_graph=any(str(o.get("enable_cuda_graph")) == "1" for o in options), built_by_genai=True)


def ort_genai(onnx_model, torch_model_or_config, prompt_ids, new_tokens: int, provider: str,
              precision: str, repeats: int) -> GenerationTiming:
    """ORT GenAI's greedy generation of exactly ``new_tokens`` tokens after ``prompt_ids`` (one prompt, or a batch
    of one length: :func:`~.generate_peers.prompt_rows`; no stop, no id suppressed: see :class:`GenAiModel`), from
    a model folder written to a temporary directory.

    One request makes its ``og.Generator`` (the cache's allocation is per request), appends the prompt (the
    prefill) and generates the first token: that, up to the token on the host, is the time to the first token;
    the ``new_tokens - 1`` further ``generate_next_token`` calls, up to the sequence on the host, over
    ``new_tokens - 1`` are the milliseconds per token. Medians of ``repeats`` requests after a warm-up.

    The folder is ORT GenAI's model builder's (:func:`builder_model_dir`) for the architectures it takes
    (:data:`BUILDER_ARCHITECTURES`), else written from the with-past export ``onnx_model``; also in fp16 on the CPU
    provider, where the builder's model (no GroupQueryAttention there) fails in ONNX Runtime 1.31 ("Shape mismatch
    attempting to re-use buffer" in a cast of its repeated KV heads)."""
    import numpy as np

    rows = prompt_rows(prompt_ids)
    check_settings(rows[0], new_tokens, repeats)
    length = len(rows[0])
    og = _import_genai()
    with tempfile.TemporaryDirectory(prefix="tvm-nimble-ort-genai-") as tmp:
        if _architecture(torch_model_or_config) in BUILDER_ARCHITECTURES and (provider, precision) != ("cpu", "fp16"):
            genai = builder_model_dir(torch_model_or_config, tmp, precision, provider)
        else:
            genai = genai_model_dir(onnx_model, torch_model_or_config, tmp, precision, provider)
        model = og.Model(genai.directory)  # the session holds the weights: the folder can go
    prompt = np.asarray(rows, dtype=np.int32)

    def request(n: int = new_tokens) -> tuple[list[list[int]], float, float]:
        """(each row's tokens, TTFT ms, ms of the further tokens) of one request of ``n`` new tokens."""
        start = time.perf_counter()
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, top_k=1, max_length=length + n, min_length=0,
                                  batch_size=len(rows))
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        generator.generate_next_token()
        generator.get_next_tokens()  # waits for the first token
        first = time.perf_counter()
        for _ in range(n - 1):
            generator.generate_next_token()
        tokens = [generator.get_sequence(r)[length:].tolist() for r in range(len(rows))]
        end = time.perf_counter()
        return tokens, (first - start) * 1e3, (end - first) * 1e3

    request()  # the warm-up
    runs = [request() for _ in range(repeats)]
    return GenerationTiming("ort-genai", runs[-1][0], statistics.median(r[1] for r in runs),
                            statistics.median(r[2] for r in runs) / (new_tokens - 1), genai.note, request)


def _import_genai():
    """``onnxruntime_genai``, or one line saying it is not installed (the bench's row for the system says it)."""
    try:
        import onnxruntime_genai as og
    except ImportError as err:
        raise NimbleError(f"ONNX Runtime GenAI not installed ({err}): pip install onnxruntime-genai "
                          "(onnxruntime-genai-cuda on a GPU)") from None
    return og


def _architecture(torch_model_or_config) -> str | None:
    """The transformers architecture (``LlamaForCausalLM``) of a decoder given as :func:`_hf_config` takes it."""
    try:
        config = _hf_config(torch_model_or_config)
    except NimbleError:
        return None
    return (config.architectures or [type(getattr(torch_model_or_config, "model", torch_model_or_config)).__name__])[0]


def _hf_config(torch_model_or_config):
    """The transformers config of a causal LM, the bench's wrapper of one (``.model``), or a config itself."""
    import transformers

    for candidate in (torch_model_or_config, getattr(torch_model_or_config, "model", None)):
        if isinstance(candidate, transformers.PretrainedConfig):
            return candidate
        if isinstance(getattr(candidate, "config", None), transformers.PretrainedConfig):
            return candidate.config
    raise NimbleError(f"{type(torch_model_or_config).__name__} has no transformers config: pass the decoder "
                      "(hf_builders(spec)'s torch model) or its config")


def _pad_logits(model) -> int:
    """Append one -inf column to ``model``'s ``logits`` (a Pad on the last axis, in the logits' dtype), in place;
    the vocabulary size before it. See :attr:`GenAiModel.stop_token` for why."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    logits = next(o for o in graph.output if o.name == "logits")
    dims = logits.type.tensor_type.shape.dim
    vocab_size = dims[2].dim_value
    if not vocab_size:
        raise NimbleError("the export's logits have no static vocabulary dimension: ORT GenAI needs one")
    inner = "logits_before_stop_token"
    for node in graph.node:
        node.output[:] = [inner if o == "logits" else o for o in node.output]
        node.input[:] = [inner if i == "logits" else i for i in node.input]
    dtype = helper.tensor_dtype_to_np_dtype(logits.type.tensor_type.elem_type)
    graph.initializer.extend([
        numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 1], dtype=np.int64), "stop_token_pads"),
        numpy_helper.from_array(np.array(-np.inf, dtype=dtype), "stop_token_logit")])
    graph.node.append(helper.make_node("Pad", [inner, "stop_token_pads", "stop_token_logit"], ["logits"],
                                       name="stop_token_column", mode="constant"))
    dims[2].dim_value = vocab_size + 1
    return vocab_size
