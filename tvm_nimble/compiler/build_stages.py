"""The stages of a build (:data:`STAGES`), as the build session (:mod:`.session`) runs them on a model.

    import -> precision -> layout -> merge -> kernels -> build -> streams -> accuracy

Each stage is a function of the session (options, timer, cache, notes, phases) and the build's state (what the
earlier stages made); a stage that chooses or measures something makes its section of the build's
:class:`~.report.BuildReport`, and the result's report is put together from them. Where TVM fails on the
channels-last module that ``layout="auto"`` chose, the stages from precision to build run again in the model's
layout (:func:`nchw_fallback`). A :class:`~.kernel_choice.Selection` (kernels chosen already) starts at build.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import traceback
from dataclasses import dataclass

from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes import schedule_pool
from tvm_nimble.relay_passes.kv_cache import cache_step

from . import accuracy, buckets, reference_build, stages
from .frontend.onnx_import import one_line
from .kernel_choice import Selection, select_kernels
from .merge_choice import choose_merges
from .options import BuildOptions
from .report import BuildReport, MergeChoice
from .stages import BuildResult
from .stream_choice import choose_streams, rescheduled

#: the stages a build runs, in order
STAGES = ("import", "precision", "layout", "merge", "kernels", "build", "streams", "accuracy")


@dataclass
class _State:
    """What the stages of one build have made so far."""

    model: object
    params: dict | None
    shape_dict: dict | None
    fp32_mod: object = None  # the imported model (None: the build started from a Selection)
    mod: object = None  # the module the next stage takes
    merge_record: MergeChoice | None = None
    selection: Selection | None = None
    result: BuildResult | None = None
    reference: object = None  # the accuracy report's float32 reference, compiling in a child process (or None)


def _import(session, state: _State) -> None:
    if session.target.kind.name == "cuda" and (pool := schedule_pool.process_pool()) is not None:
        pool.warm()  # the workers that will schedule the kernels start while the model is imported
    with session.phases("import"):
        state.fp32_mod = state.mod = stages.import_model(state.model, state.params, state.shape_dict)
        if not state.params and state.reference is None:  # (a child imports the model file again: bound
            # parameters would not be there; a bucket's build is given the child its bucketed build started)
            state.reference = accuracy.start_reference(state.model, state.shape_dict, state.fp32_mod, session)


def _precision(session, state: _State) -> None:
    with session.phases("precision"):
        state.mod = stages.apply_precision(state.fp32_mod, session.options, session.memory.narrowed)
        if session.options.kv_cache is not None:  # a generation step: its cache as state, in the compute dtype
            state.mod = cache_step(state.mod, session.options.kv_cache)


def _layout(session, state: _State) -> None:
    with session.phases("layout"):
        state.mod = stages.apply_layout(state.mod, session.options)


def _merge(session, state: _State) -> None:
    with session.phases("merge"):
        state.mod, state.merge_record = choose_merges(state.mod, session)


def _kernels(session, state: _State) -> None:
    with session.phases("kernel choice"):
        state.selection = select_kernels(state.mod, session)


def _build(session, state: _State) -> None:
    state.result = _build_selected(state.selection, session.with_options(
        session.options.replace(kernels=state.selection.kernels)))


def _streams(session, state: _State) -> None:
    opts, result = session.options, state.result
    if opts.max_streams == "auto":
        with session.phases("stream choice"):
            chosen, record = choose_streams(result, session, memory_budget=opts.memory_budget)
        state.result = dataclasses.replace(chosen, report=chosen.report.replace(stream_choice=record))
    elif opts.memory_budget is not None and result.plan.memory["pool_bytes"] > opts.memory_budget:
        raise NimbleError(f"the schedule's memory pool needs {result.plan.memory['pool_bytes']} bytes, over the "
                          f"budget of {opts.memory_budget}: use max_streams='auto' (or fewer streams) to pick one "
                          "that fits")


def _accuracy(session, state: _State) -> None:
    if session.options.precision != "fp32":
        with session.phases("accuracy"):
            report = accuracy.report(state.fp32_mod, state.result, session, state.reference)
        state.result = dataclasses.replace(state.result, report=state.result.report.replace(accuracy=report))
        accuracy.check(report, session.options.max_error)


#: each stage of :data:`STAGES`, as it runs on the session and the build's state
_STAGES = {"import": _import, "precision": _precision, "layout": _layout, "merge": _merge, "kernels": _kernels,
           "build": _build, "streams": _streams, "accuracy": _accuracy}
assert tuple(_STAGES) == STAGES
#: the stages that run again in the model's layout where TVM fails on the channels-last module (:func:`nchw_fallback`)
_LAYOUT_DEPENDENT = ("precision", "layout", "merge", "kernels", "build")


def _run(session, state: _State, names) -> _State:
    for name in names:
        _STAGES[name](session, state)
    return state


def run_stages(session, model, params: dict | None = None, shape_dict: dict | None = None,
               reference=None) -> BuildResult:
    """The stages of :data:`STAGES` on ``model`` in ``session``: one build per bucket (``buckets``, ``batch_sizes``), or
    import -> [precision -> layout -> merge -> kernels -> build, again in NCHW where TVM fails on NHWC] -> streams
    -> accuracy (a :class:`~.kernel_choice.Selection` starts at build). ``reference``: the accuracy stage's float32
    reference already compiling in a child (:func:`.accuracy.start_reference`: a bucket's)."""
    opts = session.options
    if opts.batch_sizes or opts.buckets:  # one build per bucket (see .buckets), put together with the weights once
        return _bucketed(session, model, params, shape_dict)
    state = _State(model, params, shape_dict, reference=reference)
    if isinstance(model, Selection):
        state.selection = model
        _run(session, state, ("build",))
    else:
        _run(session, state, ("import",))
        state, session = with_nchw_fallback(lambda s: _run(s, dataclasses.replace(state), _LAYOUT_DEPENDENT), session)
    _run(session, state, ("streams", "accuracy"))
    result = state.result
    return dataclasses.replace(result, report=result.report.replace(
        merge_choice=state.merge_record, kernel_choice=state.selection.choice, phases=session.phases.rounded()))


def _bucketed(session, model, params: dict | None, shape_dict: dict | None):
    """One build per bucket (see :mod:`.buckets`), put together with the weights once. Each bucket's float32
    reference compiles in a child from that bucket's import on, as a single build's does (from one copy of the
    model's file for all the children)."""
    request = buckets.BucketRequest(model, session.options, shape_dict)
    # the weights parsed once and bound to every bucket's import (its precision pass then narrows them once)
    lifted = reference_build.BucketImport.lifted(request.onnx_model)
    children = not params and accuracy.in_background(request.options)
    built = {}
    with contextlib.ExitStack() as stack:
        source = model if isinstance(model, (str, os.PathLike)) else request.onnx_model
        path = stack.enter_context(reference_build.model_file(source)) if children else None
        for i, (key, bucket) in enumerate(request.imports()):
            with request.building(key):
                session_k = session.bucket(request.options)
                with session.phases("import"):  # the buckets differ only in their inputs' sizes: one ONNX check
                    mod = bucket.module(lifted, params, check=i == 0)
                    pending = accuracy.start_reference(path, None, mod, session_k, bucket=bucket) if path else None
                built[key] = request.checked(key, session_k.build(mod, reference=pending))
    return request.module(built, session.note)


def choose_kernels(fp32_mod, session):
    """precision -> layout -> merge choice -> kernel choice: (selection, merge record) of an imported model."""
    state = _run(session, _State(None, None, None, fp32_mod=fp32_mod), ("precision", "layout", "merge", "kernels"))
    return state.selection, state.merge_record


def with_nchw_fallback(attempt, session):
    """(``attempt(session)``, the session it ran in): where TVM fails (a RuntimeError) on the channels-last module
    that ``layout="auto"`` chose, ``attempt`` runs again in the model's layout (:func:`nchw_fallback`)."""
    try:
        return attempt(session), session
    except RuntimeError as err:  # TVM's errors are RuntimeErrors
        session = session.with_options(nchw_fallback(session.options, err, session.note))
        return attempt(session), session


def nchw_fallback(opts: BuildOptions, err: Exception, note) -> BuildOptions:
    """The options to build again with after TVM failed (``err``) on a channels-last module that ``layout="auto"``
    chose: the model's layout, with a note. Any other failure is raised again.

    Why: ConvertLayout and the lowering after it are TVM's, on every operator of a model; a model that TVM cannot
    lower channels-last should still build, as it did before channels-last existed, and say so."""
    if isinstance(err, NimbleError) or opts.layout != "auto" or opts.data_layout != "nhwc":
        raise err
    note(f"TVM failed on the channels-last (NHWC) form of this model ({type(err).__name__}: "
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


def _build_selected(selection: Selection, session) -> BuildResult:
    """The selection's module lowered, scheduled and generated with the session's options. Where the model check
    compiled that module one-stream already, with the same target, tuning database and memory plan, that build is
    rescheduled instead: the kernels do not depend on the schedule (as in :mod:`.stream_choice`), and compiling a
    large model's kernels again costs as much as the first time."""
    options, built, phases = session.options, selection.built, session.phases
    if built is None or not options.compile_kernels or not _same_kernels(built.options, options):
        return stages.build_fixed(selection.mod, options, session, final=True)
    session.remember_hash(selection.mod, built.source_hash)  # (a Selection made in another session)
    stages.note_default_schedules(selection.mod, options, session.note)
    cap = None if options.max_streams == "auto" else options.max_streams
    with phases("schedule"):
        result = rescheduled(built, cap, options.reuse)
    cache, kept = session.kernel_cache(), None
    if cache is not None:  # kept for the next build, which finds the model check in the timing cache
        with phases("generate"):
            key = session.key("kernels", selection.mod)
            kept = "present" if cache.has(key) else "stored" if cache.store(key, built.lowered, built.kernels) else "miss"
    report = BuildReport.of_build(options, built.report.concats_in_place, built.report.splits_as_views, kept)
    return dataclasses.replace(result, report=report, options=options)


def _same_kernels(a: BuildOptions, b: BuildOptions) -> bool:
    """Whether builds of one module with options ``a`` and ``b`` compile the same kernels and plan memory alike."""
    return ((str(a.target), a.tuning_db, a.concat_in_place, a.reuse, a.merge != "off")
            == (str(b.target), b.tuning_db, b.concat_in_place, b.reuse, b.merge != "off"))
