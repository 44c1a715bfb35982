"""``tvm_nimble.build``: model in, one :class:`BuildResult` out.

Only the policy lives here; the stages are plain functions of :mod:`.stages`, and the two choices made
by measurement are :func:`.kernel_choice.select_kernels` and :func:`.stream_choice.choose_streams`:

    options = BuildOptions.create(target, **options)       validated once
    mod = import_model(model) -> apply_precision -> apply_layout   (stages)
    selection = select_kernels(mod, options)                 which provider runs each operator
    result = build_fixed(selection.mod, options)             lower, schedule, generate
    result = choose_streams(result)                          with max_streams="auto"
    accuracy.report(fp32 model, result)                      precisions other than fp32

Every consumer of a build reuses the result instead of re-running a stage: the executor and
``export`` (plan, kernels, params), ``explain`` (assignment, program, lowered module). Where the
kernel choice's model check compiled the selected module already, ``build`` reschedules that build
instead of compiling the same kernels again. The lowered module and kernel library of a build are kept in
the compiled-kernel cache (:mod:`.kernel_cache`, beside the timing cache), so the next build of the same
module loads them instead of lowering and compiling. The seconds each phase took are in ``info["phases"]``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import traceback

from tvm_nimble.errors import NimbleError

from . import accuracy, buckets, kernel_cache, stages
from .kernel_choice import Selection, select_kernels
from .frontend.onnx_import import one_line
from .merge_choice import choose_merges
from .notes import note_once
from .options import BuildOptions
from .stages import BuildResult  # noqa: F401  (public here: ``tvm_nimble.BuildResult``)
from .stream_choice import choose_streams, rescheduled
from .timers import timer_for

#: the phases of a build, in order (``info["phases"]`` holds those a build ran, in seconds)
PHASES = ("import", "precision", "layout", "merge", "kernel choice", "lower", "schedule", "generate", "stream choice",
          "accuracy")
_phase_listeners: list = []


class Phases:
    """``with phases("lower"): ...`` adds the block's seconds to that phase; each listener of
    :func:`watch_phases` is told the phase's name as it begins (the CLI's progress line)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        for listener in list(_phase_listeners):
            listener(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def to_info(self) -> dict[str, float]:
        return {name: round(self.seconds[name], 3) for name in PHASES if name in self.seconds}


@contextlib.contextmanager
def watch_phases(listener):
    """Call ``listener(phase name)`` as each phase of the builds inside the block begins."""
    _phase_listeners.append(listener)
    try:
        yield
    finally:
        _phase_listeners.remove(listener)


def build(model, target="llvm", params: dict | None = None, *, shape_dict: dict | None = None,
          **options) -> BuildResult:
    """Build ``model`` (a Relax IRModule, an ONNX ModelProto, a path to a .onnx file, or a
    :class:`~.kernel_choice.Selection` whose kernels are chosen already) with Nimble.

    ``options`` are the fields of :class:`~.options.BuildOptions`, each checked with a one-line error:

    - ``max_streams`` caps the stream count: 1 gives the single-stream schedule, None Nimble's widest
      schedule, ``"auto"`` (default) the fastest of the caps 1, 2, 3, 4, 6, 8 and the widest, measured
      on the GPU (see :mod:`.stream_choice`; the widest without one). ``memory_budget`` (bytes) bounds the
      concurrency-safe memory pool: auto picks among the schedules that fit, and a fixed cap whose pool
      does not fit is an error.
    - ``kernels``: ``"vendor"`` runs every operator a kernel provider takes (convolutions, GEMMs and
      average pools on cuDNN / cuBLASLt; ``providers`` restricts which) on it, ``"best"`` each on the
      fastest of the providers and TVM measured on the GPU, ``"tvm"`` keeps TVM's kernels; ``"auto"``
      (default, see :func:`~.kernel_choice.resolve_kernels`) is best on a CUDA machine that can build the
      vendor extension (nvcc and the nvidia-cudnn-cu13 / nvidia-cublas wheels), vendor without a GPU
      here, else tvm. ``allow_tf32`` lets cuDNN / cuBLASLt use TF32 tensor cores for fp32 (about 1e-3
      relative error; off by default, like PyTorch's ``allow_tf32=False``).
    - ``precision``: ``"fp32"`` (default), ``"tf32"`` (``allow_tf32``), ``"fp16"`` or ``"bf16"``: convolutions
      and GEMMs compute in the reduced dtype, reductions, softmax and normalizations in float32, the rest
      follows its inputs (:mod:`tvm_nimble.relay_passes.precision`; ``keep_fp32=("matmul",)`` moves
      operators to float32). Inputs and outputs keep the model's dtypes. A build in another precision
      than fp32 measures its relative L2 error against the float32 model on seeded inputs where its
      target runs (``info["accuracy"]``); ``max_error`` fails the build above it.
    - ``tuning_db`` is a MetaSchedule database directory whose tuned kernels replace the default
      schedules. ``compile_kernels=False`` stops before code generation (what ``explain`` needs).
      ``concat_in_place`` (default on) lets the kernels feeding a concatenation write straight into their
      slice of it where the slices are contiguous, which removes the concatenation's copy kernel.
    - ``rpc_tracker`` (``HOST:PORT``) and ``rpc_key``: what ``best`` and ``auto`` measure runs on a GPU of
      an RPC server registered under that key (``tvm-nimble rpc-server``) instead of this machine's (see
      :mod:`.timers`).
    - ``batch_sizes=[1, 2, 4, 8]``: one build per batch size (the ONNX model's leading input dimension set
      to it; kernels and streams chosen per bucket) in one module with the weights once, whose executor
      takes any batch (see :mod:`.buckets` and ``tvm_nimble.runtime.buckets``).
    """
    return build_with(model, BuildOptions.create(target, **options), params, shape_dict)


def build_with(model, opts: BuildOptions, params: dict | None = None, shape_dict: dict | None = None,
               timer=None) -> BuildResult:
    """:func:`build` with its options made already (what ``explain``, the CLI and the benchmarks call).
    ``timer``: where ``best`` and ``auto`` measure (see :mod:`.timers`; default: a GPU behind the options'
    RPC tracker, else this machine's)."""
    if opts.batch_sizes:  # one build per batch size (see .buckets), put together with the weights once
        request = buckets.BucketRequest(model, opts, shape_dict)
        built = {}
        for batch, onnx_model in request.models():
            with request.building(batch):
                built[batch] = request.checked(batch, build_with(onnx_model, request.options, params))
        return request.module(built)
    timer = timer or timer_for(opts.rpc_tracker, opts.rpc_key)
    phases = Phases()
    fp32_mod, merge_record = None, None
    if isinstance(model, Selection):
        selection = model
        result = _build_selected(selection, opts.replace(kernels=selection.kernels), phases)
    else:
        with phases("import"):
            fp32_mod = stages.import_model(model, params, shape_dict)
        (selection, merge_record, result), opts = with_nchw_fallback(
            lambda o: _choose_and_build(fp32_mod, o, timer, phases), opts)
    if merge_record is not None:
        result.info["merge_choice"] = merge_record
    if selection.timings:
        result.info["kernel_choice"] = [k.to_dict() for k in selection.timings]
    if selection.operators:
        result.info["kernel_choice_operators"] = selection.operators
    if selection.check is not None:
        result.info["kernel_choice_check"] = selection.check.to_dict()
    if selection.check_skipped:
        result.info["kernel_choice_check_skipped"] = selection.check_skipped
    if selection.algorithms:
        result.info["gemm_algorithms"] = selection.algorithms
    if selection.not_taken:
        result.info["not_taken"] = selection.not_taken
    if opts.max_streams == "auto":
        with phases("stream choice"):
            result, record = choose_streams(result, memory_budget=opts.memory_budget, timer=timer)
        result.info["streams_choice"] = record
    elif opts.memory_budget is not None and result.plan.memory["pool_bytes"] > opts.memory_budget:
        raise NimbleError(f"the schedule's memory pool needs {result.plan.memory['pool_bytes']} bytes, over the "
                          f"budget of {opts.memory_budget}: use max_streams='auto' (or fewer streams) to pick one "
                          "that fits")
    if opts.precision != "fp32":
        with phases("accuracy"):
            result.info["accuracy"] = accuracy.report(fp32_mod, result, opts)
        accuracy.check(result.info["accuracy"], opts.max_error)
    result.info["phases"] = phases.to_info()
    return result


def choose_kernels(fp32_mod, opts: BuildOptions, timer=None, phases: Phases | None = None):
    """precision -> layout -> merge choice -> kernel choice: (selection, merge record) of an imported model."""
    phases = phases or Phases()
    with phases("precision"):
        mod = stages.apply_precision(fp32_mod, opts)
    with phases("layout"):
        mod = stages.apply_layout(mod, opts)
    with phases("merge"):
        mod, merge_record = choose_merges(mod, opts, timer)
    with phases("kernel choice"):
        selection = select_kernels(mod, opts, timer)
    return selection, merge_record


def _choose_and_build(fp32_mod, opts: BuildOptions, timer, phases: Phases):
    """:func:`choose_kernels`, then the build: (selection, merge record, result)."""
    selection, merge_record = choose_kernels(fp32_mod, opts, timer, phases)
    return selection, merge_record, _build_selected(selection, opts.replace(kernels=selection.kernels), phases)


def with_nchw_fallback(attempt, opts: BuildOptions):
    """(``attempt(opts)``, the options it ran with): where TVM fails (a RuntimeError) on the channels-last module
    that ``layout="auto"`` chose, ``attempt`` runs again in the model's layout (:func:`nchw_fallback`)."""
    try:
        return attempt(opts), opts
    except RuntimeError as err:  # TVM's errors are RuntimeErrors
        opts = nchw_fallback(opts, err)
        return attempt(opts), opts


def nchw_fallback(opts: BuildOptions, err: Exception) -> BuildOptions:
    """The options to build again with after TVM failed (``err``) on a channels-last module that ``layout="auto"``
    chose: the model's layout, with a note. Any other failure is raised again.

    Why: ConvertLayout and the lowering after it are TVM's, on every operator of a model; a model that TVM cannot
    lower channels-last should still build, as it did before channels-last existed, and say so."""
    if isinstance(err, NimbleError) or opts.layout != "auto" or opts.data_layout != "nhwc":
        raise err
    note_once(f"TVM failed on the channels-last (NHWC) form of this model ({type(err).__name__}: "
              f"{one_line(err, whole=True)}, raised at {raised_at(err)}); building it in its own layout (NCHW) instead. "
              "layout='nchw' skips the attempt; layout='nhwc' reports the error")
    return opts.replace(layout="nchw")


def raised_at(err: BaseException) -> str:
    """Where ``err`` was raised, as file:line (function) of its innermost Python frame: a TVM error whose message
    is only its kind (one seen on nasnetalarge's one-stream fp16 build) still says which stage raised it."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "an unknown place"
    f = frames[-1]
    return f"{os.path.relpath(f.filename) if f.filename.startswith(os.getcwd()) else f.filename}:{f.lineno} ({f.name})"


def _build_selected(selection: Selection, options: BuildOptions, phases: Phases) -> BuildResult:
    """The selection's module lowered, scheduled and generated with ``options``. Where the model check
    compiled that module one-stream already, with the same target, tuning database and memory plan, that
    build is rescheduled instead: the kernels do not depend on the schedule (as in :mod:`.stream_choice`),
    and compiling a large model's kernels again costs as much as the first time."""
    built = selection.built
    cache = kernel_cache.for_options(options)
    if built is None or not options.compile_kernels or not _same_kernels(built.options, options):
        return stages.build_fixed(selection.mod, options, note=True, timed=phases, cache=cache)
    stages.note_default_schedules(selection.mod, options)
    cap = None if options.max_streams == "auto" else options.max_streams
    with phases("schedule"):
        result = rescheduled(built, cap, options.reuse)
    info = stages.build_info(options, built.info["concats_in_place"], built.info.get("splits_as_views"))
    if cache is not None:  # kept for the next build, which finds the model check in the timing cache
        with phases("generate"):
            key = cache.key(selection.mod, options, selection.mod_hash)
            info["kernel_cache"] = "present" if cache.has(key) else (
                "stored" if cache.store(key, built.lowered, built.kernels) else "miss")
            info["kernels_key"] = cache.digest(key)
    return dataclasses.replace(result, info=info, options=options)


def _same_kernels(a: BuildOptions, b: BuildOptions) -> bool:
    """Whether builds of one module with options ``a`` and ``b`` compile the same kernels and plan memory alike."""
    return ((str(a.target), a.tuning_db, a.concat_in_place, a.reuse, a.merge != "off")
            == (str(b.target), b.tuning_db, b.concat_in_place, b.reuse, b.merge != "off"))
