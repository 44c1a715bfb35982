"""The generation peers (tvm_nimble/bench/generate_peers.py) on the CPU: transformers' generate and the static-cache
compiled decode loop give the greedy tokens of a plain loop without any cache (the whole sequence run again for
each token, its last position's argmax appended), on the tiny GPT-2 and Llama decoders in float32."""
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from decoder_models import tiny_torch  # noqa: E402

from tvm_nimble.bench.generate_peers import GenerationTiming, hf_eager, hf_static_compiled  # noqa: E402
from tvm_nimble.errors import NimbleError  # noqa: E402

PROMPT = [17, 3, 250, 96, 41]
NEW_TOKENS = 16


def lively(spec: str):
    """The tiny decoder with its attention and MLP weights scaled 8x: a random decoder with tied embeddings
    otherwise repeats the prompt's last token, whatever the positions and the cache hold."""
    wrapped = tiny_torch(spec)
    with torch.no_grad():
        for name, weight in wrapped.model.named_parameters():
            if weight.dim() == 2 and not any(e in name for e in ("wte", "wpe", "embed_tokens")):
                weight.mul_(8)
    return wrapped


def reference_tokens(wrapped, prompt: list[int] = PROMPT) -> list[int]:
    """Greedy tokens with no cache: the full sequence's last logits' argmax, appended one at a time."""
    model = wrapped.model
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt):].tolist()


@pytest.mark.parametrize("peer", [hf_eager, hf_static_compiled])
@pytest.mark.parametrize("spec, prompts", [("hf:gpt2-tiny", PROMPT), ("hf:llama-tiny", [PROMPT, [5, 99, 3, 200, 7]])],
                         ids=["gpt2-tiny", "llama-tiny-batch2"])
def test_a_peer_generates_the_greedy_tokens(spec, prompts, peer):
    """One prompt, or (the Llama decoder, whose rotary embedding reads the positions) a batch of two decoded
    together: each row's tokens are its own prompt's."""
    model = lively(spec)
    rows = prompts if isinstance(prompts[0], list) else [prompts]
    want = [reference_tokens(model, p) for p in rows]
    assert all(len(set(w)) > 4 for w in want) and want[0] != want[-1] or len(rows) == 1  # depend on the prompt
    got = peer(model, prompts, NEW_TOKENS, "cpu", torch.float32, repeats=2)
    assert isinstance(got, GenerationTiming) and got.system and got.note
    assert got.rows == want and got.tokens == want[0]
    assert got.ttft_ms > 0 and got.ms_per_token > 0


def test_the_end_of_sequence_token_neither_stops_nor_is_suppressed():
    """GPT-2-tiny's end-of-sequence id is 0, and 0 is the greedy token after this prompt: generation runs on past
    it, and picks it (min_new_tokens alone would suppress it)."""
    prompt = [1, 0]
    want = reference_tokens(tiny_torch("hf:gpt2-tiny"), prompt)
    assert tiny_torch("hf:gpt2-tiny").model.generation_config.eos_token_id == want[0] == 0
    assert hf_eager(tiny_torch("hf:gpt2-tiny"), prompt, NEW_TOKENS, "cpu", torch.float32, repeats=1).tokens == want


@pytest.mark.parametrize("new_tokens, repeats, prompt, message", [
    (1, 1, PROMPT, "at least 2"), (4, 0, PROMPT, "at least 1"), (4, 1, [], "prompt"),
    (4, 1, [[1, 2], [3]], "of one length")])
def test_bad_generation_settings_are_one_line(new_tokens, repeats, prompt, message):
    with pytest.raises(NimbleError, match=message):
        hf_eager(tiny_torch("hf:gpt2-tiny"), prompt, new_tokens, "cpu", torch.float32, repeats)
    with pytest.raises(NimbleError, match="causal LM"):
        hf_eager(torch.nn.Linear(2, 2), PROMPT, 4, "cpu", torch.float32, 1)


def test_the_generation_bench_on_the_cpu_checks_and_times_every_system(tmp_path):
    """``tvm-nimble bench --generate`` end to end on the CPU (TVM's kernels by default there): our generator's greedy
    tokens equal transformers' generate, and each system's row has a TTFT and a time per token."""
    import csv

    from tvm_nimble.bench import generation

    generation.main(["--models", "hf:gpt2-tiny", "--precision", "fp32", "--target", "llvm", "--prompt", "6",
                     "--new-tokens", "5", "--repeats", "1", "--skip", "hf-static-compiled,ort-genai",
                     "--batch", "1,2", "--out", str(tmp_path)])
    table = list(csv.DictReader(open(tmp_path / "generation.csv")))
    assert sorted((r["system"], r["batch"]) for r in table) == [("hf-eager", "1"), ("hf-eager", "2"),
                                                                  ("nimble", "1"), ("nimble", "2")]
    for r in table:  # a batch's rows all checked: the least matched row counts
        assert r["tokens_matched"] == r["tokens_checked"] == "5", r
        assert float(r["ttft_ms"]) > 0 and float(r["ms_per_token"]) > 0
    rows = {r["system"]: r for r in table if r["batch"] == "1"}
    assert rows["nimble"]["kernels"] == "tvm"
    builds = json.load(open(tmp_path / "generation-builds.json"))  # each step's kernel choice: none on llvm
    model = rows["nimble"]["model"]
    assert builds == {f"{model}/fp32": {"1": {}, "6": {}}, f"{model}/fp32/batch2": {"1": {}, "6": {}}}
    unchecked = tmp_path / "unchecked"  # without the reference (HF eager): the row says its tokens are not checked
    generation.main(["--models", "hf:gpt2-tiny", "--precision", "fp32", "--target", "llvm", "--prompt", "6",
                     "--new-tokens", "3", "--repeats", "1", "--skip", "hf-eager,hf-static-compiled,ort-genai",
                     "--out", str(unchecked)])
    (row,) = list(csv.DictReader(open(unchecked / "generation.csv")))
    assert row["system"] == "nimble" and row["tokens_checked"] == "" and row["note"].startswith("tokens not checked")
    with pytest.raises(NimbleError, match="--batch '0'"):
        generation.main(["--models", "hf:gpt2-tiny", "--target", "llvm", "--batch", "0", "--out", str(tmp_path)])
    with pytest.raises(NimbleError, match="kernels='vendor' .* need a CUDA target; use kernels='tvm' for llvm"):
        generation.main(["--models", "hf:gpt2-tiny", "--target", "llvm", "--kernels", "vendor",
                         "--out", str(tmp_path)])


def test_a_divergence_is_located_with_its_float32_margin_and_the_precision_error():
    """bench --generate's note where a system's tokens leave the reference's: the first differing step, the float32
    logits' margin between the two tokens there (a plain forward pass over the sequence so far is the reference),
    and whether the compared precision's own logit error covers it."""
    from tvm_nimble.bench.generate_peers import divergence

    wrapped = lively("hf:llama-tiny")
    want = reference_tokens(wrapped)
    ids = torch.tensor([PROMPT + want[:3]])
    with torch.no_grad():
        logits = wrapped.model(input_ids=ids).logits[0, -1].double()
    worst = int(logits.argmin())  # a token no rounding would pick
    tokens = want[:3] + [worst] + want[4:]
    got = divergence(wrapped, PROMPT, want, tokens, "cpu", torch.bfloat16)
    assert (got.step, got.reference_token, got.token) == (3, want[3], worst)
    assert got.margin == pytest.approx(float(logits[want[3]] - logits[worst]), rel=1e-5)
    assert got.error > 0 and not got.tie
    assert "diverges at token 3" in got.describe("bf16") and "not a tie" in got.describe("bf16")
    assert divergence(wrapped, PROMPT, want, want, "cpu", torch.bfloat16) is None
