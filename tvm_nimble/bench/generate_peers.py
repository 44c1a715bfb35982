"""PyTorch peers for token-by-token generation (``tvm-nimble bench --generate``): a decoder generates greedily from a
prompt, timed as the time to the first token (TTFT, the prompt's prefill) and the milliseconds per further token.

- :func:`hf_eager`: transformers' ``generate`` (greedy, SDPA attention, its dynamic KV cache), the everyday
  baseline;
- :func:`hf_static_compiled`: a static KV cache with the one-token decode step under
  ``torch.compile(mode="reduce-overhead")`` (CUDA graphs on a GPU), gpt-fast's recipe, PyTorch's fastest decode.

Both decode greedily for exactly ``new_tokens`` tokens (the end-of-sequence token neither stops nor is
suppressed), so every system's tokens can be compared one for one. A request is one prompt (a list of ids) or a batch
of prompts of one length (:func:`prompt_rows`), decoded together. ONNX Runtime GenAI is in :mod:`.ort_genai`.
"""
from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tvm_nimble.bench.hf_models import cache_keyword
from tvm_nimble.errors import NimbleError


@dataclass(frozen=True)
class GenerationTiming:
    """One peer's greedy generation: the new tokens' ids (``rows``: each prompt's of a batch; ``tokens``: the
    first's), the median time to the first token (the prompt's prefill and its token), the median milliseconds per
    further token (a step of the whole batch), and how the peer got there."""

    system: str
    rows: list[list[int]]
    ttft_ms: float
    ms_per_token: float
    note: str = ""
    #: ``run(n)`` generates ``n`` tokens from the prompt again (for a kernel profile after the timing)
    run: Callable[[int], object] | None = field(default=None, repr=False, compare=False)

    @property
    def tokens(self) -> list[int]:
        return self.rows[0]


def prompt_rows(prompt_ids) -> list[list[int]]:
    """A request's prompts as rows of ids: one prompt (a list of ints) is a batch of one; a batch (a list of lists)
    must be of one length (the bench's prompts; prompts of different lengths need padding, which every system does
    its own way)."""
    if len(prompt_ids) and isinstance(prompt_ids[0], (list, tuple)):
        rows = [[int(t) for t in p] for p in prompt_ids]
    else:
        rows = [[int(t) for t in prompt_ids]]
    if len({len(r) for r in rows}) > 1:
        raise NimbleError(f"a batch's prompts must be of one length here, got lengths {sorted({len(r) for r in rows})}")
    return rows


def hf_eager(torch_model, prompt_ids, new_tokens: int, device: str, dtype, repeats: int) -> GenerationTiming:
    """transformers' ``generate``, greedy, SDPA attention. Each timed request stamps the moment every new token is
    chosen (a stopping criterion that waits for the device and never stops): TTFT is the first stamp, ms/token the
    time from the first stamp to the last / (``new_tokens`` - 1), both medians over ``repeats`` requests."""
    import torch
    import transformers

    rows = prompt_rows(prompt_ids)
    check_settings(rows[0], new_tokens, repeats)
    model = _causal_lm(torch_model, device, dtype)
    ids = torch.tensor(rows, dtype=torch.int64, device=device)
    sync = _synchronizer(device)

    class Stamps(transformers.StoppingCriteria):
        """Called once a step, after the step's token is chosen: the time it is on hand."""

        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            sync()
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def generate(n: int) -> tuple[list[list[int]], list[float]]:
        """(each row's new tokens, seconds from the call to each step's tokens) of one request for ``n`` tokens."""
        stamps = Stamps()
        with torch.no_grad():
            sync()
            start = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 min_new_tokens=n, max_new_tokens=n,
                                 stopping_criteria=transformers.StoppingCriteriaList([stamps]))
        return out[:, ids.shape[1]:].tolist(), [t - start for t in stamps.times]

    tokens = generate(new_tokens)[0]  # the warm-up gives the tokens
    ttft, per_token = per_token_times([generate(new_tokens)[1] for _ in range(repeats)])
    return GenerationTiming("hf-eager", tokens, ttft, per_token,
                            "transformers generate, greedy, SDPA attention, dynamic KV cache", generate)


def per_token_times(requests: list[list[float]]) -> tuple[float, float]:
    """(TTFT ms, ms per further token), medians over timed requests, each given as the seconds from its start to
    each new token: the first token's time, and the time from the first token to the last over the tokens
    between. Both are differences of one request's own clock readings, so neither can be negative."""
    if not requests or any(len(r) < 2 for r in requests):
        raise NimbleError("per-token times need requests of at least 2 new tokens each")
    return (statistics.median(r[0] * 1e3 for r in requests),
            statistics.median((r[-1] - r[0]) * 1e3 / (len(r) - 1) for r in requests))


def hf_static_compiled(torch_model, prompt_ids, new_tokens: int, device: str, dtype,
                       repeats: int) -> GenerationTiming:
    """A static KV cache (``transformers.StaticCache``), the prompt's prefill eager, and the one-token decode step
    under ``torch.compile(mode="reduce-overhead", fullgraph=True)``; greedy argmax on the device.

    The loop is written here, not ``generate(cache_implementation="static")`` with a compiled forward: that
    recipe read a CUDA graph's output after the next replay had overwritten it. Here each decode call begins with
    ``torch.compiler.cudagraph_mark_step_begin()`` and its token is cloned out of the graph's buffer before the
    next call. TTFT is the median prefill (and its token); ms/token the median decode loop / (``new_tokens`` - 1)."""
    import torch
    import transformers

    rows = prompt_rows(prompt_ids)
    check_settings(rows[0], new_tokens, repeats)
    length = len(rows[0])
    model = _causal_lm(torch_model, device, dtype)
    cache = transformers.StaticCache(config=model.config, max_cache_len=length + new_tokens)
    keyword = cache_keyword(model)

    def step(ids, positions):
        """The greedy next token of each row ([rows, 1]) after ``ids`` at ``positions``; the cache, which keeps its
        own length on the device, extended in place."""
        logits = model(input_ids=ids, position_ids=positions, use_cache=True, **{keyword: cache}).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    decode = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    prompt = torch.tensor(rows, dtype=torch.int64, device=device)
    positions = torch.arange(length + new_tokens, dtype=torch.int64, device=device)[None].repeat(len(rows), 1)
    sync = _synchronizer(device)

    def generate(n: int = new_tokens) -> tuple[list[list[int]], float, float]:
        """(each row's tokens, prefill ms, decode ms) of one generation of ``n`` tokens from an empty cache."""
        cache.reset()
        with torch.no_grad():
            sync()
            start = time.perf_counter()
            token = step(prompt, positions[:, :length])
            sync()
            prefilled = time.perf_counter()
            tokens = [token]
            for at in range(length, length + n - 1):
                torch.compiler.cudagraph_mark_step_begin()
                token = decode(token, positions[:, at:at + 1]).clone()
                tokens.append(token)
            sync()
            end = time.perf_counter()
        return torch.cat(tokens, dim=1).tolist(), (prefilled - start) * 1e3, (end - prefilled) * 1e3

    generate()  # the warm-up: compiles the decode step and records its CUDA graph
    runs = [generate() for _ in range(repeats)]
    graphs = "CUDA graphs" if torch.device(device).type == "cuda" else f"no CUDA graphs on {device}"
    return GenerationTiming(
        "hf-static-compiled", runs[-1][0], statistics.median(r[1] for r in runs),
        statistics.median(r[2] for r in runs) / (new_tokens - 1),
        f"StaticCache({length + new_tokens} slots), eager prefill, own decode loop: the decode step "
        f"under torch.compile(mode='reduce-overhead', fullgraph=True) ({graphs}), cudagraph_mark_step_begin() "
        "before each call and its token cloned (transformers' static-cache generate read overwritten CUDA-graph "
        "outputs)", generate)


def check_settings(prompt_ids: list[int], new_tokens: int, repeats: int) -> None:
    """One line for a generation request no peer can time: no prompt, fewer than 2 new tokens, no repeat."""
    if not prompt_ids:
        raise NimbleError("generation needs a prompt of at least one token id")
    if new_tokens < 2:
        raise NimbleError(f"generation of {new_tokens} new tokens: ms per token needs at least 2 (e.g. 32)")
    if repeats < 1:
        raise NimbleError(f"generation timed {repeats} times: repeats must be at least 1")


@dataclass(frozen=True)
class Divergence:
    """Where a system's greedy tokens first leave the reference's, and whether that step is a tie: ``step`` (0-based)
    with the reference's ``reference_token`` and the system's ``token``; on the sequence so far, the float32 model's
    logit ``margin`` between the two, and ``error``, the largest difference between the model's logits in the
    compared precision and in float32 at that step. Each of the two logits can be off by up to ``error`` in that
    precision, so a margin of at most twice it is a tie: either token is the precision's argmax within its own
    rounding."""

    step: int
    reference_token: int
    token: int
    margin: float
    error: float

    @property
    def tie(self) -> bool:
        return abs(self.margin) <= 2 * self.error

    def describe(self, precision: str) -> str:
        return (f"diverges at token {self.step} ({self.token} for {self.reference_token}): float32 margin "
                f"{abs(self.margin):.3g} against the {precision} logits' error {self.error:.3g}: "
                f"{'a tie' if self.tie else 'not a tie'}")


def divergence(torch_model, prompt_ids: list[int], reference: list[int], tokens: list[int], device: str,
               dtype) -> Divergence | None:
    """The first step where ``tokens`` leave the greedy ``reference`` tokens (None where they agree over their common
    length), with the margin of the decoder ``torch_model`` in float32 and its logits' error in ``dtype`` there (see
    :class:`Divergence`), each from one forward pass over the prompt and the reference's tokens before that step."""
    import torch

    step = next((i for i, (a, b) in enumerate(zip(reference, tokens)) if a != b), None)
    if step is None:
        return None
    ids = torch.tensor([list(prompt_ids) + list(reference[:step])], device=device)

    def last_logits(dt):
        model = _causal_lm(torch_model, device, dt)
        with torch.no_grad():
            return model(input_ids=ids).logits[0, -1].double().cpu()

    exact = last_logits(torch.float32)
    compared = exact if dtype == torch.float32 else last_logits(dtype)  # float32 compared with itself: no error
    a, b = int(reference[step]), int(tokens[step])
    return Divergence(step, a, b, float(exact[a] - exact[b]), float((compared - exact).abs().max()))


def _causal_lm(torch_model, device: str, dtype):
    """A copy of the transformers causal LM in ``torch_model`` (itself, or the bench's wrapper of it, see
    :func:`tvm_nimble.bench.hf_models.hf_builders`) on ``device`` in ``dtype``, SDPA attention, in eval mode, its
    end-of-sequence token dropped from the generation config (greedy decoding runs the full length, never
    suppressing that token either)."""
    import transformers

    model = torch_model
    if not isinstance(model, transformers.PreTrainedModel):
        model = getattr(torch_model, "model", None)
    if not isinstance(model, transformers.GenerationMixin):
        raise NimbleError(f"{type(torch_model).__name__} is not a transformers causal LM (nor the bench's wrapper "
                          "of one): pass hf_builders(spec)'s torch model of a decoder")
    model = copy.deepcopy(model).to(device=device, dtype=dtype).eval()
    model.set_attn_implementation("sdpa")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _synchronizer(device: str) -> Callable[[], None]:
    """What waits for the device's queued work: ``torch.cuda.synchronize`` on CUDA, nothing on the CPU."""
    import torch

    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
