"""Token-by-token generation over plans that keep a decoder's KV cache on the device.

A :class:`GeneratorModule` holds one plan per *step*, keyed by the number of new tokens the step takes: ``1`` is
the decode step (one token at the position its ``position_ids`` input names, attending over the whole cache of
``max_length`` slots), larger keys are prefill steps (a prompt of up to that many tokens, right-padded, its keys and
values written into the cache). Every step reads and writes the same state tensors (``kv_cache_N_key`` /
``_value``, see ``relay_passes.kv_cache``) and returns ``(next_ids, logits)``. The steps share their weights (each
distinct constant stored once) and, on the device, the state and one allocation for their inputs, outputs and
memory pools (one step runs at a time).

A :class:`Generator` runs a module: the prompt through the smallest prefill step that holds it (a prompt longer
than the largest goes on token by token through the decode step), then one decode step per new token, each a
replay of the step's plan (one CUDA graph on a GPU). Greedy: each decode step's token ids, position and mask are
made on the device from the step before, which is queued before the host reads that step's tokens
(:mod:`.decode_loop`); sampling: the host writes them and reads back the logits. Slot ``j`` of the cache holds the
token at position ``j``; the mask marks the slots written so far.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import numpy as np

from tvm_nimble.contract.generation import STEP_INPUTS
from tvm_nimble.contract.plan import Plan
from tvm_nimble.errors import NimbleError

from . import decode_loop
from .artifact import ArtifactError, load_bucketed_files, read_manifest, save_bucketed_artifact
from .buckets import BucketDim, BucketSpace, SharedBuffers, dedupe_weights
from .device import device_for
from .executor import Executor
from .module import NimbleModule, load_plans, load_runtime_libraries

#: the manifest's name for the dimension the steps are keyed by
STEP_DIM = "new_tokens"
DECODE = 1


class GenerationError(NimbleError):
    """A generation request the generator cannot serve (one line naming the limit)."""


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn from the logits: ``temperature`` 0 is greedy (the argmax, computed on the
    device); otherwise the logits divided by ``temperature``, cut to the ``top_k`` most likely (0: all) and then to
    the smallest set whose probability reaches ``top_p`` (1.0: all), sampled with a generator seeded by ``seed``."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise GenerationError(f"temperature must be a number >= 0 (0: greedy), got {self.temperature!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise GenerationError(f"top_k must be an integer >= 0 (0: no cut), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def draw(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        """One token drawn from ``logits`` (a vector over the vocabulary)."""
        z = np.asarray(logits, np.float64) / self.temperature
        order = np.argsort(-z, kind="stable")
        if self.top_k:
            order = order[:self.top_k]
        p = np.exp(z[order] - z[order[0]])
        p /= p.sum()
        if self.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(order[rng.choice(len(order), p=p)])


@dataclass
class GeneratorModule:
    """The steps of one decoder (new tokens per step -> module; 1 is the decode step), the cache's ``max_length``
    and the vocabulary's size. ``export`` writes one artifact (the weights once); :func:`load_generator` reads it
    back with the TVM runtime only."""

    steps: dict[int, NimbleModule]
    max_length: int
    vocab_size: int
    info: dict = field(default_factory=dict)
    vendor_library: str | None = None
    weight_names: dict | None = field(default=None, repr=False)
    weights: dict | None = field(default=None, repr=False)

    def __post_init__(self):
        if DECODE not in self.steps:
            raise ArtifactError("a generator needs its decode step (one new token); rebuild it")
        for n, m in self.steps.items():
            names = m.plan.input_names
            if tuple(names) != STEP_INPUTS:
                raise ArtifactError(f"step {n} takes {names}, not {list(STEP_INPUTS)}; rebuild the generator")
            if not m.plan.states:
                raise ArtifactError(f"step {n} keeps no KV cache; rebuild the generator")

    @property
    def plan(self) -> Plan:
        """The decode step's plan."""
        return self.steps[DECODE].plan

    @property
    def target(self) -> dict:
        return self.plan.target

    @property
    def prefill_lengths(self) -> list[int]:
        return sorted(n for n in self.steps if n != DECODE)

    @property
    def batch(self) -> int:
        return self.plan.tensors[self.plan.inputs[0]].shape[0]

    def kv_cache_bytes(self) -> int:
        """Device bytes of the KV cache (every state tensor once)."""
        return sum(self.plan.tensors[t].nbytes for t in self.plan.states)

    def shared_weights(self) -> tuple[dict, dict[str, np.ndarray]]:
        if self.weight_names is None or self.weights is None:
            self.weight_names, self.weights = dedupe_weights({(n,): m for n, m in self.steps.items()})
            self.weight_names = {k[0]: v for k, v in self.weight_names.items()}
        return self.weight_names, self.weights

    def export(self, path: str, overwrite: bool = False) -> str:
        """Write one artifact directory: a plan and kernel library per step, the weights once."""
        names, weights = self.shared_weights()
        space = BucketSpace((BucketDim(STEP_DIM, tuple(sorted(self.steps))),), (), ())
        generator = {"max_length": self.max_length, "vocab_size": self.vocab_size}
        return save_bucketed_artifact(path, [((n,), m.plan, m.kernels, names[n]) for n, m in sorted(self.steps.items())],
                                      weights, space.to_json(), extra={"info": self.info, "generator": generator},
                                      vendor_library=self.vendor_library, overwrite=overwrite)


def is_generator_artifact(path) -> bool:
    """Whether ``path`` is a generator's artifact directory (a file, e.g. an ONNX model, is not)."""
    return os.path.isdir(path) and isinstance(read_manifest(os.fspath(path)).get("generator"), dict)


def load_generator(path: str) -> GeneratorModule:
    """A generator artifact loaded with the TVM runtime only."""
    manifest, space, specs, weights = load_bucketed_files(path)
    meta = manifest.get("generator")
    if not isinstance(meta, dict) or space.names != [STEP_DIM]:
        raise ArtifactError(f"{path} is not a generator artifact; build one with tvm_nimble.build_generator")
    vendor = load_runtime_libraries(path, manifest)
    modules, names = load_plans(specs, weights, vendor)
    steps = {key[0]: m for key, m in modules.items()}
    try:
        return GeneratorModule(steps, int(meta["max_length"]), int(meta["vocab_size"]),
                               dict(manifest.get("info", {})), vendor, {key[0]: n for key, n in names.items()}, weights)
    except (KeyError, TypeError, ValueError) as err:
        raise ArtifactError(f"{path}/manifest.json has a malformed generator entry ({err}); rebuild it") from None


class Generator:
    """Runs a :class:`GeneratorModule` (or its artifact's path) on ``device``: ``gen.generate(prompt_ids,
    max_new_tokens)`` returns the new token ids. One request at a time (a lock serializes callers); ``mode`` is the
    executors' (``cuda-graph`` by default on a GPU)."""

    def __init__(self, module, device=None, mode: str | None = None):
        if isinstance(module, str) or hasattr(module, "__fspath__"):
            module = load_generator(str(module))
        if not isinstance(module, GeneratorModule):
            raise TypeError(f"Generator runs a GeneratorModule (tvm_nimble.build_generator) or its artifact's path, "
                            f"not {type(module).__name__}")
        self.module = module
        self.device = device_for(module.target, device)
        self._lock = threading.Lock()
        self._shared = SharedBuffers(self.device)
        self._steps: dict[int, Executor] = {}
        self._feed = None
        try:
            names, weights = module.shared_weights()
            workspaces = self._shared.workspaces({n: m.plan for n, m in module.steps.items()}, names, weights)
            for n, m in sorted(module.steps.items()):
                self._steps[n] = Executor(m, self.device, mode, workspace=workspaces[n])
            self._feed = decode_loop.feed_for(self._steps[DECODE])
        except BaseException:
            self.close()
            raise
        self.max_length = module.max_length
        self.vocab_size = module.vocab_size

    # ---- one step --------------------------------------------------------------------------------------------
    def _run(self, step: int, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, want_logits: bool):
        ex = self._steps[step]
        views = ex.input_views()
        for view, value in zip(views, (ids, mask, positions)):
            view.copyfrom(np.ascontiguousarray(value, dtype=str(view.dtype)))
        ex.replay()
        out = ex.output_views()
        return out[0].numpy(), (out[1].numpy() if want_logits else None)

    def _prefill(self, prompts: list[np.ndarray], want_logits: bool):
        """Write every row's prompt into the cache (a row per sequence of the batch; rows past the prompts get one
        token, unused); (next token id per row, logits per row or None) at each prompt's last position."""
        rows, lengths = self.module.batch, [len(p) for p in prompts]
        n = max(lengths)
        fits = [b for b in self.module.prefill_lengths if b >= n]
        if not fits and rows == 1:  # the largest prefill step takes the first part, the decode step the rest
            prompt, done, result = prompts[0], 0, None
            if self.module.prefill_lengths:
                done = self.module.prefill_lengths[-1]
                self._prefill([prompt[:done]], False)
            for p in range(done, n):
                result = self._decode([int(prompt[p])], [p], want_logits)
            return result
        b = fits[0]
        ids = np.zeros((rows, b), np.int64)
        mask = np.zeros((rows, b + 1), np.int64)  # slot 0: the step's zero past, masked
        for r, prompt in enumerate(prompts):
            ids[r, :len(prompt)] = prompt
            mask[r, 1:len(prompt) + 1] = 1
        for r in range(len(prompts), rows):
            mask[r, 1] = 1
        nxt, logits = self._run(b, ids, mask, np.tile(np.arange(b, dtype=np.int64), (rows, 1)), want_logits)
        last = [m - 1 for m in lengths]
        return ([int(nxt[r, i]) for r, i in enumerate(last)],
                [logits[r, i] for r, i in enumerate(last)] if want_logits else None)

    def _decode(self, tokens: list[int], positions: list[int], want_logits: bool):
        """One token per row at its position; (next token id per row, logits per row or None)."""
        rows = self.module.batch
        ids, mask, pos = decode_loop.decode_inputs(rows, self.max_length, tokens, positions)
        nxt, logits = self._run(DECODE, ids, mask, pos, want_logits)
        return [int(x) for x in nxt[:, 0]], ([logits[r, 0] for r in range(rows)] if want_logits else None)

    def prompt_logits(self, prompt_ids) -> np.ndarray:
        """The logits after ``prompt_ids`` (its last position's), from the prefill; the cache holds the prompt after."""
        prompt = self._check(prompt_ids, 1)
        with self._lock:
            self._check_open()
            return self._prefill([prompt], True)[1][0]

    # ---- requests --------------------------------------------------------------------------------------------
    def generate(self, prompt_ids, max_new_tokens: int, sampling: Sampling | None = None, stop_tokens=(),
                 on_token=None) -> list[int]:
        """The new token ids after ``prompt_ids`` (a list of ints): up to ``max_new_tokens``, ending early after a
        token of ``stop_tokens`` (which is returned). ``sampling``: greedy when None. ``on_token(token_id)`` is called
        with each new token as it is made (streaming)."""
        stream = None if on_token is None else (lambda row, token: on_token(token))
        return self.generate_batch([prompt_ids], max_new_tokens, sampling, stop_tokens, stream)[0]

    def generate_batch(self, prompts, max_new_tokens: int, sampling: Sampling | None = None, stop_tokens=(),
                       on_token=None) -> list[list[int]]:
        """:meth:`generate` for up to the generator's batch of prompts of any lengths at once (each a row of every
        step, at its own positions): the new ids of each, in order. A row that ends early (a stop token) waits for
        the others; ``on_token(row, token_id)`` streams. Sampling draws row ``r`` with a generator seeded ``seed +
        r`` (row 0 draws what :meth:`generate` draws)."""
        sampling = sampling or Sampling()
        if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__") or not 1 <= len(prompts) <= \
                self.module.batch:
            raise GenerationError(f"generate_batch takes a list of 1 to {self.module.batch} prompts (the batch the "
                                  "generator was built for)")
        checked = [self._check(p, max_new_tokens) for p in prompts]
        if len(checked) > 1 and max(map(len, checked)) > max(self.module.prefill_lengths, default=0):
            raise GenerationError(f"a batch's prompts must fit the largest prefill bucket "
                                  f"({max(self.module.prefill_lengths, default=0)} tokens); a longer prompt goes alone "
                                  "(generate), or build with larger prefill_lengths")
        stops = {int(t) for t in stop_tokens}
        rngs = [np.random.default_rng(sampling.seed + r) for r in range(len(checked))]
        want = not sampling.greedy
        outs: list[list[int]] = [[] for _ in checked]
        done = [False] * len(checked)

        def deliver(tokens, logits=None) -> bool:
            """Each generating row's next token (drawn from ``logits`` when sampling); whether any row goes on."""
            for r in range(len(checked)):
                if done[r]:
                    continue
                token = sampling.draw(logits[r], rngs[r]) if want else tokens[r]
                tokens[r] = token
                outs[r].append(token)
                if on_token is not None:
                    on_token(r, token)
                done[r] = token in stops or len(outs[r]) == max_new_tokens
            return not all(done)

        with self._lock:
            self._check_open()
            tokens, logits = self._prefill(checked, want)
            positions = [len(p) for p in checked]
            if not want:  # the device one step ahead of the host (decode_loop)
                if deliver(tokens):
                    decode_loop.greedy(self._feed, tokens[:len(checked)], positions, max_new_tokens - 1, deliver)
                return outs
            while deliver(tokens, logits):
                tokens, logits = self._decode(tokens[:len(checked)], positions, want)
                positions = [p + 1 for p in positions]
            return outs

    def _check(self, prompt_ids, max_new_tokens) -> np.ndarray:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        try:
            prompt = np.asarray(list(prompt_ids))
        except TypeError:
            raise GenerationError(f"prompt_ids must be a list of token ids, got {type(prompt_ids).__name__}") from None
        if prompt.ndim != 1 or prompt.size == 0 or not np.issubdtype(prompt.dtype, np.integer):
            raise GenerationError("prompt_ids must be a non-empty list of integer token ids")
        bad = prompt[(prompt < 0) | (prompt >= self.vocab_size)]
        if bad.size:
            raise GenerationError(f"token id {int(bad[0])} is outside the vocabulary (0..{self.vocab_size - 1})")
        if prompt.size + max_new_tokens > self.max_length:
            raise GenerationError(f"a prompt of {prompt.size} tokens plus {max_new_tokens} new ones is over the "
                                  f"generator's max_length of {self.max_length}: shorten them, or build with a larger "
                                  "max_length")
        return prompt.astype(np.int64)

    # ---- lifetime --------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._steps is None:
            raise NimbleError("this Generator is closed; create a new one")

    def close(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        for ex in (self._steps or {}).values():
            ex.close()
        self._steps = None
        self._shared.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
