"""The ONNX Runtime GenAI peer (tvm_nimble/bench/ort_genai.py) on the CPU: ORT GenAI's generator over the with-past
export gives HF eager's greedy tokens (the existing ``hf_eager`` peer), on the tiny GPT-2 and Llama decoders, and
runs past the end-of-sequence token without suppressing it. The generation tests are skipped where
``onnxruntime_genai`` does not import (CI does not install it); the model folder needs only ONNX."""
import importlib.util
import json
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from decoder_models import tiny_gpt2_onnx, tiny_torch  # noqa: E402
from test_generate_peers import NEW_TOKENS, PROMPT, lively  # noqa: E402

from tvm_nimble.bench.generate_peers import GenerationTiming, hf_eager  # noqa: E402
from tvm_nimble.bench.hf_models import past_onnx_model  # noqa: E402
from tvm_nimble.bench.ort_genai import builder_model_dir, genai_model_dir, ort_genai  # noqa: E402
from tvm_nimble.errors import NimbleError  # noqa: E402

needs_genai = pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is None,
                                 reason="ONNX Runtime GenAI not installed (pip install onnxruntime-genai)")
#: ORT GenAI's model builder also needs onnx_ir
needs_builder = pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is None
                                   or importlib.util.find_spec("onnx_ir") is None,
                                   reason="ORT GenAI's model builder needs onnxruntime-genai and onnx-ir")
has_converter = importlib.util.find_spec("onnxconverter_common") is not None


@needs_genai
@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), pytest.param("fp16", torch.float16, marks=[
    pytest.mark.skipif(not has_converter, reason="onnxconverter-common not installed (pip install onnxconverter-common)")])])
@pytest.mark.parametrize("spec", ["hf:gpt2-tiny", "hf:llama-tiny"])
def test_ort_genai_generates_hf_eagers_greedy_tokens(spec, precision, dtype):
    model = lively(spec)
    want = hf_eager(model, PROMPT, NEW_TOKENS, "cpu", dtype, repeats=1).tokens
    assert len(set(want)) > 4  # the tokens depend on the sequence so far
    got = ort_genai(past_onnx_model(spec, model=model.model), model, PROMPT, NEW_TOKENS, "cpu", precision, repeats=2)
    assert isinstance(got, GenerationTiming) and got.system == "ort-genai" and "cpu provider" in got.note
    assert got.tokens == want
    assert got.ttft_ms > 0 and got.ms_per_token > 0
    assert got.run(3)[0] == want[:3]  # the profile's request


@needs_genai
def test_the_end_of_sequence_token_neither_stops_nor_is_suppressed():
    """GPT-2-tiny's end-of-sequence id is 0, and 0 is the greedy token after this prompt, which itself ends in 0
    (ORT GenAI would take a trailing padding id for padding): every token is generated, each one 0."""
    prompt = [1, 0]
    model = tiny_torch("hf:gpt2-tiny")
    want = hf_eager(model, prompt, NEW_TOKENS, "cpu", torch.float32, repeats=1).tokens
    assert model.model.generation_config.eos_token_id == want[0] == 0
    got = ort_genai(past_onnx_model("hf:gpt2-tiny"), model, prompt, NEW_TOKENS, "cpu", "fp32", repeats=1)
    assert got.tokens == want


@pytest.mark.parametrize("precision", [
    "fp32", pytest.param("fp16", marks=pytest.mark.skipif(not has_converter, reason="onnxconverter-common not "
                                                          "installed (pip install onnxconverter-common)"))])
def test_the_model_folder(tmp_path, precision):
    """genai_config.json names the export's inputs and outputs, one vocabulary id more than the model's (the
    never-picked stop id), the model's heads; past and present stay separate buffers for this export; fp16 makes
    the cache and logits fp16 too (ORT GenAI's cache is in the model's dtype)."""
    import onnx

    model = tiny_torch("hf:llama-tiny")
    genai = genai_model_dir(past_onnx_model("hf:llama-tiny"), model, str(tmp_path), precision, "cuda")
    config = json.loads((tmp_path / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"], decoder["head_size"]) == (4, 2, 16)
    assert config["model"]["vocab_size"] == 257 and config["model"]["eos_token_id"] == genai.stop_token == 256
    assert config["search"]["past_present_share_buffer"] is False and not genai.cuda_graph
    assert decoder["session_options"]["provider_options"] == [{"cuda": {"enable_cuda_graph": "0"}}]
    onnx_model = onnx.load(str(tmp_path / "model.onnx"))
    types = {v.name: v.type.tensor_type.elem_type for v in [*onnx_model.graph.input, *onnx_model.graph.output]}
    want = onnx.TensorProto.FLOAT16 if precision == "fp16" else onnx.TensorProto.FLOAT
    assert types["past_key_values.0.key"] == types["present.1.value"] == types["logits"] == want


@pytest.mark.skipif(has_converter, reason="onnxconverter-common is installed")
def test_fp16_without_the_converter_is_one_line(tmp_path):
    with pytest.raises(NimbleError, match="onnxconverter-common"):
        genai_model_dir(past_onnx_model("hf:llama-tiny"), tiny_torch("hf:llama-tiny"), str(tmp_path), "fp16", "cuda")


@pytest.mark.parametrize("onnx_model, precision, provider, message", [
    (lambda: tiny_gpt2_onnx(), "fp32", "cpu", "with-past"), (lambda: None, "bf16", "cpu", "bf16"),
    (lambda: None, "fp32", "rocm", "provider")])
def test_bad_settings_are_one_line(tmp_path, onnx_model, precision, provider, message):
    with pytest.raises(NimbleError, match=message):
        genai_model_dir(onnx_model(), tiny_torch("hf:gpt2-tiny"), str(tmp_path), precision, provider)


def test_a_model_without_a_transformers_config_is_one_line(tmp_path):
    with pytest.raises(NimbleError, match="config"):
        genai_model_dir(tiny_gpt2_onnx(), torch.nn.Linear(2, 2), str(tmp_path))


def test_without_onnxruntime_genai_the_peer_says_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)  # what `import` then raises: ImportError
    with pytest.raises(NimbleError, match="not installed"):
        ort_genai(tiny_gpt2_onnx(), tiny_torch("hf:gpt2-tiny"), PROMPT, NEW_TOKENS, "cpu", "fp32", repeats=1)


@needs_builder
def test_the_builders_folder_for_the_cuda_provider(tmp_path):
    """A Llama-family decoder goes through ORT GenAI's own builder as its users run it on a GPU: GroupQueryAttention,
    past and present in one shared buffer, the CUDA graph on; the logits get the never-picked stop id's column
    (eos = pad = the vocabulary's size). Written without a GPU (the builder only writes the model)."""
    import onnx

    genai = builder_model_dir(tiny_torch("hf:llama-tiny"), str(tmp_path), "fp16", "cuda")
    assert genai.built_by_genai and genai.shared_buffers and genai.cuda_graph and "own builder" in genai.note
    config = json.loads((tmp_path / "model" / "genai_config.json").read_text())
    assert config["model"]["vocab_size"] == 257 and config["model"]["eos_token_id"] == genai.stop_token == 256
    assert config["model"]["pad_token_id"] == 256
    graph = onnx.load(str(tmp_path / "model" / "model.onnx"), load_external_data=False).graph
    assert sum(n.op_type == "GroupQueryAttention" for n in graph.node) == 2  # one a layer
    (logits,) = [o for o in graph.output if o.name == "logits"]
    assert logits.type.tensor_type.shape.dim[2].dim_value == 257


@needs_builder
def test_the_builder_takes_only_the_llama_family(tmp_path):
    with pytest.raises(NimbleError, match="genai_model_dir"):
        builder_model_dir(tiny_torch("hf:gpt2-tiny"), str(tmp_path), "fp16", "cuda")
    with pytest.raises(NimbleError, match="int4"):
        builder_model_dir(tiny_torch("hf:llama-tiny"), str(tmp_path), "int4", "cuda")
