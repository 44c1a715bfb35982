"""A decode step's KV cache write inside its attention call (relay_passes/cache_in_attention.py): on the tiny GPT-2
and Llama-style decoders' decode steps, each layer's ``kv_write`` kernel and fused attention become one
``nimble.attention.append_sdpa_bias`` call that the plan keeps the caches as state for (with ``attention_rope``, the
Llama-style decoder's rotary embedding of q and the new key goes into it too: ``append_rope_sdpa_bias``); and a
generator whose decode step runs those calls (their numpy contract, ``vendor_reference``, on llvm) generates the
tokens of a loop that reruns the whole sequence through the ONNX reference evaluator."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("transformers")

from tvm_nimble.compiler import stages  # noqa: E402
from tvm_nimble.compiler.build import build  # noqa: E402
from tvm_nimble.compiler.generate import step_shapes  # noqa: E402
from tvm_nimble.compiler.options import BuildOptions  # noqa: E402
from tvm_nimble.compiler.session import BuildSession  # noqa: E402
from tvm_nimble.contract import vendor_abi  # noqa: E402
from tvm_nimble.relay_passes.kv_cache import KvCacheSpec, cache_step  # noqa: E402
from tvm_nimble.relay_passes.providers import attention  # noqa: E402
from tvm_nimble.runtime.generator import DECODE, Generator, GeneratorModule, Sampling  # noqa: E402

from decoder_models import VOCAB  # noqa: E402
from test_generate import MAX_LENGTH, MODELS, PROMPTS, generator_module, reference_tokens  # noqa: E402

CUDA = {"kind": "cuda", "arch": "sm_90"}
LAYERS = 2
DTYPES = {"fp32": None, "fp16": "float16", "bf16": "bfloat16"}


def _decode_step(name: str, precision: str, providers) -> tuple:
    """The decode step of ``name``'s with-past export (cache_step over MAX_LENGTH slots), offloaded for an H100 with
    ``providers``; and the options."""
    model = MODELS[name][0]()
    options = BuildOptions.create(CUDA, precision=precision, timing_cache="off", max_streams=1,
                                  kv_cache=KvCacheSpec("decode", MAX_LENGTH, DTYPES[precision], gpu=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = stages.import_model(model, None, step_shapes(model, 1, 1, MAX_LENGTH - 1))
    mod = cache_step(stages.apply_precision(mod, options), options.kv_cache)
    return stages.offload(stages.apply_layout(mod, options), options, providers=providers), options


def _calls(mod) -> dict[str, int]:
    """How many calls of each vendor function and TIR kernel ``mod``'s main makes."""
    counts: dict[str, int] = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if hasattr(v, "op") and getattr(v.op, "name", "") in ("relax.call_dps_packed", "relax.call_tir_inplace"):
                callee = v.args[0]
                name = str(callee.global_symbol) if hasattr(callee, "global_symbol") else callee.name_hint
                counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_layers_cache_write_goes_into_its_attention(name, precision):
    fused, options = _decode_step(name, precision, [attention.PROVIDER, attention.APPEND_PROVIDER])
    calls = _calls(fused)
    assert calls.get(vendor_abi.ATTENTION_APPEND_SDPA_BIAS) == LAYERS, calls
    assert not any(n.startswith("kv_write") for n in calls), calls
    assert vendor_abi.ATTENTION_SDPA_BIAS not in calls and vendor_abi.ATTENTION_SPLIT_SDPA_BIAS not in calls
    # the plan: the caches are state (written in place by the append calls), no input or output
    built = stages.build_fixed(fused, options.replace(compile_kernels=False), BuildSession(options))
    plan = built.plan
    state_names = sorted(plan.tensors[t].name for t in plan.states)
    assert state_names == sorted(f"kv_cache_{i}_{kind}" for i in range(LAYERS) for kind in ("key", "value"))
    appends = [l for l in plan.launches if l.kernel == vendor_abi.ATTENTION_APPEND_SDPA_BIAS]
    written = {w for l in appends for w in l.writes}
    assert written >= set(plan.states)
    # without the provider, each layer keeps its write kernel before the attention
    plain = _calls(_decode_step(name, precision, [attention.PROVIDER])[0])
    assert sum(n for k, n in plain.items() if k.startswith("kv_write")) == LAYERS
    assert vendor_abi.ATTENTION_APPEND_SDPA_BIAS not in plain


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_the_rotary_embedding_goes_into_the_append_call(precision):
    """Llama-style: with attention_rope each layer's append call reads q and the new key before their rotary
    embedding (no TVM kernel computes it: no negative left), the cos/sin tables as arguments; GPT-2 (learned
    positions) keeps its append calls."""
    providers = [attention.PROVIDER, attention.APPEND_PROVIDER, attention.ROPE_PROVIDER]
    llama, options = _decode_step("llama", precision, providers)
    calls = _calls(llama)
    assert calls.get(vendor_abi.ATTENTION_APPEND_ROPE_SDPA_BIAS) == LAYERS, calls
    assert vendor_abi.ATTENTION_APPEND_SDPA_BIAS not in calls
    ops = {b.value.op.name for block in llama["main"].body.blocks for b in block.bindings
           if hasattr(b.value, "op") and hasattr(b.value.op, "name")}
    assert "relax.negative" not in ops
    plan = stages.build_fixed(llama, options.replace(compile_kernels=False), BuildSession(options)).plan
    assert len(plan.states) == 2 * LAYERS
    gpt2 = _calls(_decode_step("gpt2", precision, providers)[0])
    assert gpt2.get(vendor_abi.ATTENTION_APPEND_SDPA_BIAS) == LAYERS and vendor_abi.ATTENTION_APPEND_ROPE_SDPA_BIAS \
        not in gpt2


def test_a_merged_decode_step_keeps_its_rotary_embedding_in_the_append_call():
    """A generator merges Q/K/V by default: a decode step's q and new key (one row a head) stay two parts, so the
    append call still rotates them itself (merge_heads leaves one-row chains apart); no TVM kernel rotates them."""
    from tvm_nimble.compiler.merge_choice import merged

    providers = [attention.PROVIDER, attention.APPEND_PROVIDER, attention.ROPE_PROVIDER]
    model = MODELS["llama"][0]()
    options = BuildOptions.create(CUDA, precision="fp16", timing_cache="off", max_streams=1,
                                  kv_cache=KvCacheSpec("decode", MAX_LENGTH, "float16", gpu=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = stages.import_model(model, None, step_shapes(model, 1, 1, MAX_LENGTH - 1))
    mod, groups = merged(cache_step(stages.apply_precision(mod, options), options.kv_cache))
    assert any(g.merged for g in groups)
    calls = _calls(stages.offload(stages.apply_layout(mod, options), options, providers=providers))
    assert calls.get(vendor_abi.ATTENTION_APPEND_ROPE_SDPA_BIAS) == LAYERS, calls


@pytest.mark.parametrize("name,rope", [("gpt2", False), ("llama", False), ("llama", True)])
def test_a_generator_with_the_append_calls_gives_the_reference_tokens(name, rope, vendor_reference):
    """The decode step with the append calls (run as their numpy contract on llvm) in place of the generator's own,
    the prefill step kept: greedy tokens over 32 new ones, a prompt past the prefill bucket (the rest token by
    token), equal those of the full-rerun reference."""
    providers = [attention.PROVIDER, attention.APPEND_PROVIDER] + ([attention.ROPE_PROVIDER] if rope else [])
    fused, _ = _decode_step(name, "fp32", providers)
    want = vendor_abi.ATTENTION_APPEND_ROPE_SDPA_BIAS if rope else vendor_abi.ATTENTION_APPEND_SDPA_BIAS
    assert want in _calls(fused)
    decode = build(fused, "llvm", max_streams=1)
    plain = generator_module(name)
    module = GeneratorModule({**plain.steps, DECODE: decode}, MAX_LENGTH, VOCAB)
    for prompt in PROMPTS.values():
        with Generator(module) as gen:
            assert gen.generate(prompt, 32) == reference_tokens(name, prompt, 32, Sampling())
    # the logits of the decode steps after a prompt past the prefill bucket, against the generator built from TVM's
    # kernels alone (a tiny decoder's greedy tokens can stay the same when the attention is wrong)
    with Generator(plain) as gen:
        want = gen.prompt_logits(PROMPTS["long"])
        other = gen.prompt_logits(PROMPTS["short"])
    assert np.abs(want - other).max() > 1e-3  # the logits depend on the prompt
    with Generator(module) as gen:
        np.testing.assert_allclose(gen.prompt_logits(PROMPTS["long"]), want, rtol=1e-4, atol=1e-4)
