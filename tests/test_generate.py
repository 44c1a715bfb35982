"""Generation over an in-place KV cache (tvm_nimble.build_generator / Generator), on llvm, against a reference loop
that reruns the whole sequence through the ONNX reference evaluator at every step (the full-sequence export, no
cache), for the tiny GPT-2 and Llama-style decoders of tests/decoder_models.py in their with-past form."""
from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("transformers")

import tvm_nimble  # noqa: E402
from tvm_nimble.errors import NimbleError  # noqa: E402
from tvm_nimble.runtime.generator import Generator, GeneratorModule, Sampling  # noqa: E402

from decoder_models import VOCAB, tiny_gpt2_onnx, tiny_gpt2_past_onnx, tiny_llama_onnx, tiny_llama_past_onnx  # noqa: E402

MAX_LENGTH = 48
PREFILL = (8,)
NEW = 32
MODELS = {"gpt2": (tiny_gpt2_past_onnx, tiny_gpt2_onnx), "llama": (tiny_llama_past_onnx, tiny_llama_onnx)}
#: a prompt a prefill step takes, and one longer than the largest (the rest goes token by token)
PROMPTS = {"short": [5, 17, 99, 3, 200], "long": [11, 7, 250, 4, 4, 90, 31, 64, 128, 2, 19]}


@functools.cache
def generator_module(name: str) -> GeneratorModule:
    return tvm_nimble.build_generator(MODELS[name][0](), "llvm", max_length=MAX_LENGTH, prefill_lengths=PREFILL)


@functools.cache
def reference(name: str):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(MODELS[name][1](dynamic=True))


def reference_tokens(name: str, prompt: list[int], n: int, sampling: Sampling) -> list[int]:
    """The tokens of a loop that runs the whole sequence through the reference evaluator at every step."""
    ref = reference(name)
    seq, out = list(prompt), []
    rng = np.random.default_rng(sampling.seed)
    for _ in range(n):
        ids = np.array([seq], np.int64)
        logits = ref.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0, -1]
        token = int(np.argmax(logits)) if sampling.greedy else sampling.draw(logits, rng)
        out.append(token)
        seq.append(token)
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("prompt", sorted(PROMPTS))
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0, seed=7)], ids=["greedy", "sampled"])
def test_tokens_equal_a_full_rerun_reference(name, prompt, sampling):
    with Generator(generator_module(name)) as gen:
        got = gen.generate(PROMPTS[prompt], NEW, sampling)
    assert got == reference_tokens(name, PROMPTS[prompt], NEW, sampling)
    if not sampling.greedy:  # the sampled tokens are not one repeated token: the check discriminates
        assert len(set(got)) > 4


def test_sampling_is_reproducible_and_seeded():
    with Generator(generator_module("llama")) as gen:
        a = gen.generate(PROMPTS["short"], 16, Sampling(temperature=0.8, top_k=50, top_p=0.9, seed=1))
        b = gen.generate(PROMPTS["short"], 16, Sampling(temperature=0.8, top_k=50, top_p=0.9, seed=1))
        c = gen.generate(PROMPTS["short"], 16, Sampling(temperature=0.8, top_k=50, top_p=0.9, seed=2))
    assert a == b
    assert a != c


def test_kv_cache_memory_is_what_the_plan_reports():
    module = generator_module("llama")
    past = [vi for vi in MODELS["llama"][0]().graph.input if vi.name.startswith("past_key_values")]
    want = 0
    for vi in past:  # [batch, kv heads, past, head dim] -> max_length slots of float32
        dims = vi.type.tensor_type.shape.dim
        want += 1 * dims[1].dim_value * MAX_LENGTH * dims[3].dim_value * 4
    assert module.kv_cache_bytes() == want
    for step in module.steps.values():
        assert step.plan.memory["state_bytes"] == want
        assert step.plan.input_names == ["input_ids", "attention_mask", "position_ids"]


def test_artifact_reloads_and_gives_the_same_tokens(tmp_path):
    module = generator_module("gpt2")
    sampling = Sampling(temperature=1.0, seed=3)
    with Generator(module) as gen:
        want = gen.generate(PROMPTS["long"], 12, sampling)
    module.export(str(tmp_path / "gen"))
    loaded = tvm_nimble.load(str(tmp_path / "gen"))
    assert isinstance(loaded, GeneratorModule)
    assert sorted(loaded.steps) == sorted(module.steps)
    with Generator(str(tmp_path / "gen")) as gen:
        assert gen.generate(PROMPTS["long"], 12, sampling) == want
    assert tvm_nimble.generate(str(tmp_path / "gen"), PROMPTS["long"], 12, sampling=sampling) == want


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0, seed=5)], ids=["greedy", "sampled"])
def test_stop_tokens_and_streaming(sampling):
    with Generator(generator_module("gpt2")) as gen:
        full = gen.generate(PROMPTS["short"], 20, sampling)
        stop = full[6]
        seen = []
        cut = gen.generate(PROMPTS["short"], 20, sampling, stop_tokens=[stop], on_token=seen.append)
        # greedy queues a step past the stop (decode_loop): the next request must not see it
        again = gen.generate(PROMPTS["short"], 20, sampling)
    assert cut == full[:full.index(stop) + 1]
    assert seen == cut
    assert again == full


@pytest.mark.parametrize("call, message", [
    (lambda g: g.generate(list(range(40)), 10), "over the generator's max_length of 48"),
    (lambda g: g.generate([1, VOCAB], 4), f"token id {VOCAB} is outside the vocabulary"),
    (lambda g: g.generate([1, 2], 0), "max_new_tokens must be an integer >= 1"),
    (lambda g: g.generate([], 3), "non-empty list of integer token ids"),
    (lambda g: g.generate([1, 2], 3, Sampling(top_p=0)), "top_p must be in (0, 1]"),
])
def test_bad_requests_are_one_line(call, message):
    with Generator(generator_module("gpt2")) as gen:
        with pytest.raises(NimbleError) as err:
            call(gen)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_model_without_past_inputs_is_one_line():
    with pytest.raises(NimbleError) as err:
        tvm_nimble.build_generator(tiny_gpt2_onnx(dynamic=True), "llvm", max_length=16)
    assert "no past key/value inputs" in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_generate_prints_the_tokens(tmp_path):
    module = generator_module("llama")
    module.export(str(tmp_path / "gen"))
    with Generator(module) as gen:
        want = gen.generate(PROMPTS["short"], 6)
    out = subprocess.run([sys.executable, "-m", "tvm_nimble.cli.main", "generate", str(tmp_path / "gen"),
                          "--prompt-ids", ",".join(map(str, PROMPTS["short"])), "--max-new-tokens", "6"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert [int(t) for t in out.stdout.split()] == want


@functools.cache
def batched_module() -> GeneratorModule:
    return tvm_nimble.build_generator(MODELS["llama"][0](), "llvm", max_length=MAX_LENGTH, prefill_lengths=PREFILL,
                                      batch=3)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0, seed=11)], ids=["greedy", "sampled"])
def test_a_batch_of_prompts_of_different_lengths(sampling):
    prompts = [[5, 17, 99, 3, 200], [9, 1, 44], [250, 2, 3, 4, 5, 6, 7, 8]]
    with Generator(batched_module()) as gen:
        got = gen.generate_batch(prompts, 20, sampling)
        two = gen.generate_batch(prompts[:2], 20, sampling)  # fewer prompts than the batch
    for r, prompt in enumerate(prompts):  # row r samples with seed + r
        row = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed + r)
        assert got[r] == reference_tokens("llama", prompt, 20, row)
    assert two == got[:2]


def test_a_batch_longer_than_the_generator_is_one_line():
    with Generator(batched_module()) as gen:
        with pytest.raises(NimbleError) as err:
            gen.generate_batch([[1, 2]] * 4, 3)
    assert "1 to 3 prompts" in str(err.value)


def test_a_generator_runs_the_onnx_checker_once(monkeypatch):
    """One export, imported once per step with other shapes, is checked once (the checker serializes the whole
    model: for a 0.5B decoder, seconds a step), and TVM's importer does not check it again."""
    import onnx

    calls = []
    real = onnx.checker.check_model

    def counted(model, *args, **kwargs):  # the real checker, counted
        calls.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", counted)
    module = tvm_nimble.build_generator(tiny_gpt2_past_onnx(), "llvm", max_length=16, prefill_lengths=(4, 8),
                                       compile_kernels=False)
    assert len(module.steps) == 3 and len(calls) == 1


@pytest.mark.parametrize("make", [tiny_gpt2_past_onnx, tiny_llama_past_onnx])
def test_weights_parsed_once_import_the_same_step(make):
    """A generator parses the export's weights once and binds them to every step's import (weights_as_inputs):
    each step's module is structurally TVM's import of the export itself, constants included, and the steps share
    the bound tensors."""
    import tvm

    from tvm_nimble.compiler.frontend.onnx_import import weights_as_inputs
    from tvm_nimble.compiler.generate import step_shapes
    from tvm_nimble.compiler.stages import bind_lifted_weights, import_model

    model = make()
    stripped, weights = weights_as_inputs(model, min_bytes=1)  # every float initializer, to cover them all
    names = {n for n, _ in weights}
    assert names and not names & {t.name for t in stripped.graph.initializer}
    assert len(stripped.graph.input) == len([i for i in model.graph.input if i.name not in names]) + len(names)
    tensors = [tvm.runtime.tensor(w) for _, w in weights]
    for n, past in ((1, 15), (4, 1)):  # a decode and a prefill step's shapes
        shapes = step_shapes(model, 1, n, past)
        want = import_model(model, None, shapes)
        got = bind_lifted_weights(import_model(stripped, None, shapes, check=False), tensors)
        tvm.ir.assert_structural_equal(got, want, map_free_vars=True)
