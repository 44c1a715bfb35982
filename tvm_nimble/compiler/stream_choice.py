"""``max_streams="auto"``: the stream cap chosen by measuring the candidate schedules on this GPU.

Nimble's assignment maximizes logical concurrency and ignores cost; on a GPU whose kernels already
fill it, more streams only add contention (nasnetalarge's 14 streams run their kernels 1.70x
longer than alone on an H100, see benchmarks/findings.md). The kernels do not depend on the
schedule, so every candidate cap (1, 2, 3, 4, 6, 8 and Nimble's maximum) reuses one compiled
library; each plan is replayed as a CUDA graph side by side with the others, and the fastest is
kept. The one-stream plan wins unless another beats it by more than ``MIN_GAIN``. The chosen
multi-stream plan is then tried with CUDA stream priorities: the streams that carry the critical
path (one-stream kernel durations measured here along the plan's dependencies) go first when
streams compete for the GPU; the prioritized plan is kept only if it too wins by ``MIN_GAIN``. A memory budget
drops every candidate whose concurrency-safe pool does not fit. Without a GPU of the target's arch
here, the largest cap that fits the budget is kept (Nimble's schedule), with a one-line note.
"""
from __future__ import annotations

import dataclasses

from tvm_nimble.errors import NimbleError

from .notes import note_once

CAPS = (1, 2, 3, 4, 6, 8)
#: another schedule replaces the one-stream plan only when it is at least this much faster
MIN_GAIN = 0.01


def rescheduled(result, schedule, max_streams: int, reuse: str = "concurrent"):
    """``result`` with the plan of another stream cap and the same compiled kernels (they do not depend on
    the schedule). ``schedule`` is :func:`tvm_nimble.compiler.build.schedule` (passed in: this module sits
    below it)."""
    annotated, program, assignment, plan, consts = schedule(result.lowered, result.tvm_target,
                                                            max_streams=max_streams, reuse=reuse)
    plan.index_bounds = result.plan.index_bounds
    return dataclasses.replace(result, plan=plan, params=consts, annotated_mod=annotated, program=program,
                               assignment=assignment, info={**result.info, "max_streams": max_streams})


def _candidates(result, schedule, reuse: str, memory_budget: int | None) -> dict[int, object]:
    """cap -> a BuildResult with that cap's plan and ``result``'s kernels, for every cap that fits."""
    widest = result.plan.num_streams
    every = {cap: result if cap == widest else rescheduled(result, schedule, cap, reuse)
             for cap in sorted({c for c in CAPS if c < widest} | {widest})}
    out = {cap: c for cap, c in every.items() if memory_budget is None or c.plan.memory["pool_bytes"] <= memory_budget}
    if not out:
        need = min(c.plan.memory["pool_bytes"] for c in every.values())
        raise NimbleError(f"no schedule's memory pool fits the budget of {memory_budget} bytes: the smallest "
                          f"needs {need} bytes; raise --memory-budget")
    return out


def choose_streams(result, schedule, reuse: str = "concurrent", memory_budget: int | None = None, timer=None):
    """(the chosen BuildResult, a record of every candidate: cap, streams, pool bytes, measured ms), measured on
    ``timer``'s GPU (default: this machine's)."""
    from .timers import LocalGPU

    timer = timer or LocalGPU()
    candidates = _candidates(result, schedule, reuse, memory_budget)
    target = result.tvm_target
    record = {"candidates": [{"max_streams": cap, "streams": c.plan.num_streams, "pool_bytes": c.plan.memory["pool_bytes"]}
                             for cap, c in candidates.items()], "memory_budget": memory_budget}
    if target.kind.name != "cuda" or result.kernels is None or timer.arch() != str(target.attrs["arch"]):
        if target.kind.name == "cuda" and result.kernels is not None:
            note_once(f"max_streams='auto' measures schedules on a {target.attrs['arch']} GPU and {timer.where} has "
                      "none: keeping Nimble's widest schedule that fits")
        cap = max(candidates)
        record.update(chosen=cap, how="widest that fits (nothing measured)")
        return candidates[cap], record
    caps = list(candidates)
    times = timer.replay_ms([candidates[c] for c in caps])
    for entry, ms in zip(record["candidates"], times):
        entry["measured_ms"] = ms
    by_cap = dict(zip(caps, times))
    best = min(caps, key=lambda c: (by_cap[c], c))
    if 1 in by_cap and by_cap[best] > by_cap[1] * (1 - MIN_GAIN):
        best = 1
    record.update(chosen=best, how=f"measured on {timer.where}: CUDA-graph replays, side by side")
    chosen = candidates[best]
    if best != 1 and 1 in candidates:
        chosen = _try_priorities(chosen, candidates[1], record, timer)
    return chosen, record


def prioritized(result, durations):
    """``result`` with its plan's critical-path streams given priority (same kernels, same plan otherwise)."""
    from tvm_nimble.codegen.critical_path import critical_stream_priority

    plan = dataclasses.replace(result.plan, stream_priority=critical_stream_priority(result.plan, durations))
    return dataclasses.replace(result, plan=plan)


def _try_priorities(chosen, one_stream, record: dict, timer):
    """``chosen`` with critical-path stream priorities if that measures ``MIN_GAIN`` faster, else ``chosen``."""
    if [l.kernel for l in one_stream.plan.launches] != [l.kernel for l in chosen.plan.launches]:
        return chosen  # durations are matched by launch position
    durations = timer.launch_ms(one_stream, 5)
    candidate = prioritized(chosen, durations)
    base_ms, prio_ms = timer.replay_ms([chosen, candidate])
    kept = prio_ms < base_ms * (1 - MIN_GAIN)
    record["priority"] = {"streams": candidate.plan.stream_priority, "base_ms": base_ms, "measured_ms": prio_ms,
                          "kept": kept}
    return candidate if kept else chosen


def summarize(record: dict) -> str:
    parts = []
    for c in record["candidates"]:
        ms = f" {c['measured_ms']:.3f} ms" if "measured_ms" in c else ""
        parts.append(f"cap {c['max_streams']} ({c['streams']} streams){ms}")
    text = f"stream cap: {record['chosen']} ({record['how']}); " + ", ".join(parts)
    p = record.get("priority")
    if p:
        text += (f"; critical-path stream priority on {sum(p['streams'])} of {len(p['streams'])} streams: "
                 f"{p['measured_ms']:.3f} vs {p['base_ms']:.3f} ms, {'kept' if p['kept'] else 'not kept'}")
    return text
