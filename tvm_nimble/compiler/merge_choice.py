"""``merge``: sibling operators merged into one (``relay_passes.merge_siblings``), or not, by measurement.

A merged group is one larger kernel; kept apart, its members run side by side on streams. Which is faster
depends on the GPU, the sizes and the kernels (a zero-padded 1x1 in a 5x5 costs 25x its FLOPs), so
``merge="auto"`` measures, per model: the model with every group merged and the model with none, each
with the kernels the build would give it without measuring (the providers' where the build uses them,
else TVM's), compiled once and replayed as CUDA graphs side by side on the GPU, one-stream and with
Nimble's widest schedule. Each side counts its faster schedule (separate-and-concurrent is the widest
one); the merged model is kept only when it beats the separate one by ``MIN_GAIN``. The answer is kept
in the build session's cache, keyed by the two modules' structural hashes.

Without a GPU of the target's arch to measure on, ``auto`` keeps every group separate, with a one-line
note, as the kernel choice falls back without one. ``on`` merges every group, ``off`` (default) none.
Each group found, and why it was or was not merged, is the build report's :class:`~.report.MergeChoice`.
"""
from __future__ import annotations

import tvm

from tvm_nimble.relay_passes.merge_siblings import MergeSiblings

from . import stages, timing_cache
from .report import MergeChoice, MergeGroup, MergeMeasurement

#: the merged model replaces the separate one only when it is at least this much faster
MIN_GAIN = 0.01


def merged(mod: tvm.IRModule, select=None) -> tuple[tvm.IRModule, list]:
    """(``mod`` with the sibling groups ``select(group)`` keeps merged (default: all), every group found)."""
    groups: list = []
    return MergeSiblings(select=select, groups=groups)(mod), groups


def _record(mode: str, groups: list, measured: MergeMeasurement | None = None) -> MergeChoice:
    return MergeChoice(mode, tuple(MergeGroup(g.describe(), g.merged, g.why) for g in groups), measured)


def choose_merges(mod: tvm.IRModule, session) -> tuple[tvm.IRModule, MergeChoice | None]:
    """The merge stage of a build session: (the module to build, the report's :class:`~.report.MergeChoice`; None
    with ``merge="off"``)."""
    options = session.options
    if options.merge == "off":
        return mod, None
    if options.merge == "on":
        out, groups = merged(mod)
        return out, _record("on", groups)
    out, groups = merged(mod)
    if not any(g.merged for g in groups):
        return mod, _record("auto", groups)
    if not options.is_cuda or not session.can_measure():
        where = (f"a {options.target.kind.name} build runs on no GPU" if not options.is_cuda else
                 f"there is no {options.arch} GPU {'here' if session.measuring_here else 'at ' + session.timer.where}")
        session.note(f"merge='auto' measures merged against separate sibling operators on a GPU, and {where}: keeping "
                  "them separate (merge='on' merges them)")
        _, groups = merged(mod, select=lambda g: False)
        for g in groups:
            g.why = g.why or "auto: nothing to measure on, kept separate"
        return mod, _record("auto", groups)
    separate_ms, merged_ms = measure(mod, out, session)
    keep = min(merged_ms) < min(separate_ms) * (1 - MIN_GAIN)
    verdict = (f"auto: the model with every group merged measured {min(merged_ms):.3f} ms, separate "
               f"{min(separate_ms):.3f} ms (the faster of one stream and the widest schedule)")
    for g in groups:
        if g.merged:
            g.merged = keep
            g.why = verdict + ("; merged" if keep else "; kept separate")
    measured = MergeMeasurement(tuple(separate_ms), tuple(merged_ms), "merged" if keep else "separate",
                                session.timer.where)
    return (out if keep else mod), _record("auto", groups, measured=measured)


def _with_kernels(mod: tvm.IRModule, session) -> tvm.IRModule:
    """``mod`` with the kernels a build gets without measuring: every chain a provider takes on it, unless
    the build uses TVM's kernels only."""
    from .kernel_choice import resolve_kernels

    if resolve_kernels(session) == "tvm":
        return mod
    return stages.offload(mod, session.options)  # (the build that measures it loads the units its calls need)


def measure(separate: tvm.IRModule, merged_mod: tvm.IRModule, session) -> tuple[list, list]:
    """([one stream, widest] ms of ``separate``, the same of ``merged_mod``), replayed side by side on the
    session's GPU (or read from its cache)."""
    from .stream_choice import rescheduled

    mods = [_with_kernels(m, session) for m in (separate, merged_mod)]
    key = session.key("merge_check", modules=[session.module_hash(m) for m in mods])

    def replay() -> list[float]:
        plans = []
        for m in mods:
            options = session.options.replace(max_streams=None, compile_kernels=True, memory_budget=None)
            widest = stages.build_fixed(m, options, session)
            plans += [rescheduled(widest, 1), widest]
        return session.timer.replay_ms(plans).median()

    known = session.measured(key, replay, valid=timing_cache.numbers(4))
    return known[:2], known[2:]

