"""``tvm_nimble.build_generator`` and ``tvm_nimble.generate``: a decoder exported with past key/values in, a
generator whose KV cache stays on the device out.

The ONNX model is the with-past form optimum and ONNX Runtime GenAI use (``input_ids``, ``attention_mask``,
``position_ids``, ``past_key_values.N.key/value`` in; ``logits``, ``present.N.key/value`` out). Each step is a whole
build (kernel choice, streams, precision) of that model imported at the step's shapes and rewritten by
``relay_passes.kv_cache.cache_step`` so that the cache is state updated in place: the decode step (one new token
over ``max_length`` slots) and one prefill step per prompt bucket (``prefill_lengths``). The weights are parsed once
and bound to every step's import (``frontend.onnx_import.weights_as_inputs``), and narrowed to a reduced precision
once (the steps' sessions share one :class:`~.session.CacheMemory`). The steps go into one
:class:`~tvm_nimble.runtime.generator.GeneratorModule` (the weights once), which
:class:`~tvm_nimble.runtime.generator.Generator` runs.
"""
from __future__ import annotations

import numpy as np
import tvm

from tvm_nimble.errors import ModelError, NimbleError
from tvm_nimble.contract.generation import STEP_INPUTS
from tvm_nimble.relay_passes.kv_cache import KvCacheError, KvCacheSpec, step_inputs
from tvm_nimble.runtime.generator import DECODE, Generator, GeneratorModule, Sampling

from .build import build_with
from .frontend.onnx_import import weights_as_inputs
from .options import BuildOptions
from .session import CacheMemory
from .stages import import_model, one_vendor_library

#: the prompt buckets a generator is built with by default
DEFAULT_PREFILL_LENGTHS = (16, 32, 64, 128)
DEFAULT_MAX_LENGTH = 256


def _onnx(model):
    import onnx

    if isinstance(model, onnx.ModelProto) or isinstance(model, str) or hasattr(model, "__fspath__"):
        from .frontend.onnx_import import load_onnx_model

        return load_onnx_model(model)
    raise ModelError(f"build_generator takes an ONNX model (a path or an onnx.ModelProto) exported with past "
                     f"key/values, not {type(model).__name__}")


def _dims(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


def step_shapes(model, batch: int, new_tokens: int, past: int) -> dict[str, list[int]]:
    """The shape of every input of the with-past ``model`` for a step of ``new_tokens`` over ``past`` cached ones;
    one line when the model is not such an export."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    pasts = step_inputs([vi.name for vi in inputs])
    shapes = {"input_ids": [batch, new_tokens], "attention_mask": [batch, past + new_tokens],
              "position_ids": [batch, new_tokens]}
    for vi in inputs:
        if vi.name in pasts:
            dims = _dims(vi)
            if len(dims) != 4 or not all(isinstance(d, int) for d in (dims[1], dims[3])):
                raise KvCacheError(f"past input {vi.name!r} has dims {dims}: expected [batch, kv heads, past length, "
                                   "head dim] with the heads and head dim fixed")
            shapes[vi.name] = [batch, dims[1], past, dims[3]]
        elif vi.name not in shapes:
            raise KvCacheError(f"the with-past model takes {vi.name!r} besides {', '.join(STEP_INPUTS)} and its past "
                               "key/values; a generation step cannot fill it")
    return shapes


def vocab_size(model) -> int:
    logits = next((o for o in model.graph.output if o.name == "logits"), model.graph.output[0])
    dims = _dims(logits)
    if not dims or not isinstance(dims[-1], int):
        raise KvCacheError(f"output {logits.name!r} has no fixed vocabulary dimension (dims {dims})")
    return dims[-1]


def build_generator(model, target="llvm", *, max_length: int = DEFAULT_MAX_LENGTH,
                    prefill_lengths=DEFAULT_PREFILL_LENGTHS, batch: int = 1, params: dict | None = None,
                    **options) -> GeneratorModule:
    """A :class:`~tvm_nimble.runtime.generator.GeneratorModule` of the with-past decoder ``model``: its decode step
    and a prefill step per length of ``prefill_lengths`` (those below ``max_length``; a prompt longer than the
    largest continues token by token), the KV cache ``max_length`` slots per sequence in the build's compute dtype;
    ``batch`` sequences at once (``Generator.generate_batch``), each at its own positions.
    ``options`` are :func:`tvm_nimble.build` 's (``kernels``, ``precision``, ``max_streams``, ...)."""
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise NimbleError(f"max_length must be an integer >= 2 (cache slots per sequence), got {max_length!r}")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise NimbleError(f"batch must be an integer >= 1 (the prompts a generator serves at once), got {batch!r}")
    if options.get("buckets") or options.get("batch_sizes"):
        raise NimbleError("build_generator makes its own prompt buckets (prefill_lengths=...); leave buckets and "
                          "batch_sizes out")
    try:
        lengths = sorted({int(n) for n in prefill_lengths or ()})
    except (TypeError, ValueError):
        lengths = None
    if lengths is None or any(n < 2 for n in lengths):
        raise NimbleError(f"prefill_lengths must be prompt lengths >= 2 (one token goes through the decode step), "
                          f"got {prefill_lengths!r}")
    lengths = [n for n in lengths if n < max_length]
    # one stream unless asked: a decoder step is a chain, and the measured stream choice has not been compared with
    # one stream on decode steps yet
    options.setdefault("max_streams", 1)
    # sibling projections merged (Q/K/V, gate/up) and splits read in place unless asked: a decode step is bound by
    # its launches, and a merged GEMM reads the same weights in one
    options.setdefault("merge", "on")
    opts = BuildOptions.create(target, **options)
    onnx_model = _onnx(model)
    vocab = vocab_size(onnx_model)
    memory = CacheMemory()  # between the steps: what was measured, and the weights narrowed once
    # the weights parsed once, and bound to every step's import (the steps' precision passes then narrow them once)
    stripped, weights = weights_as_inputs(onnx_model)
    tensors = [tvm.runtime.tensor(w) for _, w in weights]
    steps = {}
    for i, n in enumerate([DECODE, *lengths]):
        spec = KvCacheSpec("decode" if n == DECODE else "prefill", max_length, opts.compute_dtype, opts.is_cuda)
        shapes = step_shapes(onnx_model, batch, n, spec.past_length())
        mod = import_model(stripped, params, shapes, check=i == 0, weights=tensors)  # one export: one ONNX check
        steps[n] = build_with(mod, opts.replace(kv_cache=spec), cache=memory)
    steps = one_vendor_library(steps, opts.target)
    vendor = next((m.vendor_library for m in steps.values() if m.vendor_library), None)
    info = {"max_length": max_length, "prefill_lengths": lengths, "precision": opts.precision,
            "steps": {str(n): m.info for n, m in steps.items()}}
    module = GeneratorModule(steps, max_length, vocab, info, vendor)
    _check_finite(module, opts)
    return module


def _check_finite(module: GeneratorModule, opts: BuildOptions) -> None:
    """Where the target runs here, a short prompt's logits must be finite (a reduced-precision overflow is refused
    in one line, as a plain build's accuracy check refuses it)."""
    from .accuracy import unmeasurable

    if not opts.compile_kernels or unmeasurable(opts) is not None:
        return
    import tvm

    device = tvm.cuda(0) if opts.is_cuda else tvm.cpu()
    with Generator(module, device) as gen:
        rng = np.random.default_rng(0)
        # (within the largest prefill bucket: a batched generator's prompts must fit one)
        size = min(8, module.max_length - 2, max(module.prefill_lengths, default=8))
        prompt = rng.integers(0, module.vocab_size, size=size).tolist()
        logits = gen.prompt_logits(prompt)
    if not np.all(np.isfinite(logits)):
        raise NimbleError(f"the {opts.precision} generator's logits hold {int(np.sum(~np.isfinite(logits)))} NaN or "
                          "infinite values on a probe prompt (an overflow of the reduced precision): build in a "
                          "wider precision (bf16 or fp32), or keep the overflowing operators in float32 (keep_fp32)")


def generate(model, prompt_ids, max_new_tokens: int, target="llvm", *, sampling: Sampling | None = None,
             stop_tokens=(), on_token=None, device=None, **build_options) -> list[int]:
    """The new token ids the decoder ``model`` generates after ``prompt_ids``: ``model`` is a with-past ONNX export
    (built here with :func:`build_generator` 's ``build_options``: ``max_length``, ``prefill_lengths``,
    ``precision``, ...), a :class:`~tvm_nimble.runtime.generator.GeneratorModule` or a generator artifact's path."""
    from tvm_nimble.runtime.generator import is_generator_artifact

    is_path = isinstance(model, str) or hasattr(model, "__fspath__")
    if not (isinstance(model, GeneratorModule) or (is_path and is_generator_artifact(model))):
        model = build_generator(model, target, **build_options)
    elif build_options:
        raise NimbleError(f"build options ({', '.join(sorted(build_options))}) apply to an ONNX model, not to a built "
                          "generator")
    with Generator(model, device) as gen:
        return gen.generate(prompt_ids, max_new_tokens, sampling, stop_tokens, on_token)

