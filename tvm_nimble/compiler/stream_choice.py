"""``max_streams="auto"``: the stream cap chosen by measuring the candidate schedules on this GPU.

Nimble's assignment maximizes logical concurrency and ignores cost; on a GPU whose kernels already
fill it, more streams only add contention (nasnetalarge's 14 streams run their kernels 1.70x
longer than alone on an H100, see benchmarks/findings.md). The kernels do not depend on the
schedule, so every candidate cap (1, 2, 3, 4, 6, 8 and Nimble's maximum) reuses one compiled
library. A cap below the widest is built twice: merging the streams that lose the least concurrency
and running them in program order, and cost-aware (``relay_passes/cost_schedule.py``: merges and
each stream's order chosen by a list schedule of the kernels' one-stream times measured here, least
critical-path slack first). Every plan is replayed as a CUDA graph side by side with the others, in
interleaved rounds (more of them where the two fastest are close: :func:`~tvm_nimble.runtime.timing.replay_ms`),
and :func:`decide` keeps the simplest plan that the fastest does not beat beyond the rounds' noise and
``MIN_GAIN`` (fewer streams, then program order before the cost-aware one). The chosen multi-stream plan is then
tried with CUDA stream priorities: the streams that carry the critical path (the same one-stream kernel times,
along the plan's dependencies) go first when streams compete for the GPU; the prioritized plan is kept only if it
too wins by that rule. Where the kernels begin by waiting for the ones before them (sm_90+,
``codegen/dependent_launch.py``), the chosen plan is last replayed with its edges into TVM's kernels programmatic
and with every edge a full dependency, and the programmatic edges are kept where they win beyond the rounds' noise
(a kernel launched early holds resources on the GPU while it waits, so they can cost as well as gain; the same
kernels on the same streams in the same order are not the more complex schedule ``MIN_GAIN`` guards against, so
no gain beyond the noise is asked of them: :data:`EDGES_MIN_GAIN`). A memory budget drops every
candidate whose concurrency-safe pool does not fit.
Without a GPU of the target's arch here, the largest cap that fits the budget is kept (Nimble's
schedule), with a one-line note. Every measurement (the one-stream kernel times, the side-by-side
replays, the priority trial) is kept in the build session's cache (:mod:`.session`), keyed by the
structural hash of the Relax module the kernels were built from (``BuildResult.source_hash``, the same in a warm
build that loads the lowered module from the compiled-kernel cache) and the digests of the plans replayed, so a second build of the same model on
the same GPU replays nothing; so is the choice itself (``stream_choice``: the chosen cap, order and
priorities, with the kernel times the cost-aware order used), so that the second build makes only the
chosen schedule, not every candidate's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from tvm_nimble.errors import NimbleError
from tvm_nimble.runtime.timing import ReplayTimes, paired_gain

from . import timing_cache
from .report import EdgesTrial, StreamCandidate, StreamChoice, StreamPriority
from .stages import schedule

CAPS = (1, 2, 3, 4, 6, 8)
#: a more complex schedule replaces a simpler one only when it is more than this much faster (and beyond noise)
MIN_GAIN = 0.01
#: programmatic edges replace full ones where they are faster beyond the rounds' noise, by however little: the
#: same kernels, streams and order, not a more complex schedule (benchmarks/findings.md, 'programmatic edges now
#: kept beyond noise')
EDGES_MIN_GAIN = 0.0
#: the rule :func:`decide` chooses by, in the stream choice's cache key: a decision made by another rule is not reused
RULE = "simplest within noise of the fastest; programmatic edges kept beyond noise"


def rescheduled(result, max_streams: int, reuse: str | None = None, costs=None):
    """``result`` with the plan of another stream cap and the same compiled kernels (they do not depend on
    the schedule); ``costs`` (one per kernel of ``result.program``) make the cap cost-aware. ``reuse``
    defaults to the memory plan ``result`` was built with."""
    reuse = reuse or _reuse_of(result)
    annotated, program, assignment, plan, consts = schedule(result.lowered, result.tvm_target,
                                                            max_streams=max_streams, reuse=reuse, costs=costs,
                                                            program=getattr(result, "program", None),
                                                            params=result.params)
    plan.index_bounds = result.plan.index_bounds
    plan.dependent_launch = result.plan.dependent_launch  # the same kernels: they wait first as they did
    report = result.report.replace(max_streams=max_streams, stream_order="slack" if costs else "program")
    return dataclasses.replace(result, plan=plan, params=consts, annotated_mod=annotated, program=program,
                               assignment=assignment, report=report)


def _reuse_of(result) -> str:
    return result.options.reuse if getattr(result, "options", None) is not None else "concurrent"


def kernel_costs(built, launch_durations) -> list[float]:
    """Per kernel of the lowered program, the duration of its launch in ``built``'s plan (whose launches
    run in its assignment's order)."""
    costs = [0.0] * len(launch_durations)
    for pos, kernel in enumerate(built.assignment.order):
        costs[kernel] = float(launch_durations[pos])
    return costs


def _fits(candidate, memory_budget: int | None) -> bool:
    return memory_budget is None or candidate.plan.memory["pool_bytes"] <= memory_budget


def _candidates(result, reuse: str, memory_budget: int | None) -> dict[tuple, object]:
    """(cap, "program") -> a BuildResult with that cap's plan and ``result``'s kernels, for every cap that fits."""
    widest = result.plan.num_streams
    every = {cap: result if cap == widest else rescheduled(result, cap, reuse)
             for cap in sorted({c for c in CAPS if c < widest} | {widest})}
    out = {(cap, "program"): c for cap, c in every.items() if _fits(c, memory_budget)}
    if not out:
        need = min(c.plan.memory["pool_bytes"] for c in every.values())
        raise NimbleError(f"no schedule's memory pool fits the budget of {memory_budget} bytes: the smallest "
                          f"needs {need} bytes; raise --memory-budget")
    return out


def _launch_signature(built):
    return [(l.kernel, l.stream, tuple(l.args)) for l in built.plan.launches]


def _slack_candidates(result, reuse, memory_budget, candidates: dict, costs) -> dict[tuple, object]:
    """(cap, "slack") -> the cost-aware schedule of every capped candidate, where it differs from the
    program-order one and fits the budget."""
    widest = result.plan.num_streams
    out = {}
    for cap, order in list(candidates):
        if 1 < cap < widest:
            c = rescheduled(result, cap, reuse, costs)
            if _fits(c, memory_budget) and _launch_signature(c) != _launch_signature(candidates[(cap, order)]):
                out[(cap, "slack")] = c
    return out


class _Measured:
    """The timer's two measurements of plans built from ``result``'s kernels, through the session's cache: a plan is
    named by the digest of its JSON, its kernels by the Relax module they were built from (``result.source_hash``)
    and the options that lowered it."""

    def __init__(self, result, session):
        import tvm_ffi

        self.session = session
        self.options = getattr(result, "options", None) or session.options
        self.kernels = getattr(result, "source_hash", None) or str(tvm_ffi.structural_hash(result.lowered))

    def key(self, kind: str, **what):
        return self.session.key(kind, options=self.options, module=self.kernels, **what)

    def launch_ms(self, built, reps: int) -> list[float]:
        return self.session.measured(self.key("launch_ms", plan=_plan_digest(built), reps=reps),
                                     lambda: [float(x) for x in self.session.timer.launch_ms(built, reps)],
                                     valid=timing_cache.numbers(len(built.plan.launches)))

    def replay_ms(self, results: list) -> ReplayTimes:
        return ReplayTimes.from_json(self.session.measured(
            self.key("replay_ms", plans=[_plan_digest(r) for r in results], times="per round"),
            lambda: self.session.timer.replay_ms(results).to_json(),
            valid=lambda value: ReplayTimes.is_json(value, len(results))))


def _plan_digest(built) -> str:
    """A digest of ``built``'s plan: of its fields as JSON, as ``Plan.to_json`` writes them but without its
    deep copy of every list (``dataclasses.asdict``), which took seconds over nasnetalarge's candidates."""
    plan = built.plan
    data = _fields(plan)
    for name in ("tensors", "storages", "launches"):
        data[name] = [_fields(x) for x in data[name]]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _fields(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


@dataclass(frozen=True)
class Decision:
    """:func:`decide`'s answer: the position of the candidate kept, and why, in words."""

    chosen: int
    why: str


def decide(times: ReplayTimes, labels: list[str], min_gain: float = MIN_GAIN) -> Decision:
    """The simplest candidate that the fastest does not beat beyond noise. ``times``: the candidates' side-by-side
    rounds, ordered from the simplest (fewest streams; program order before least slack first; no priorities) to
    the most complex; ``labels``: their names, in the same order.

    The fastest (by median over the rounds) is the one to match. From the simplest on, the first candidate that
    the fastest does not beat clearly (:meth:`~tvm_nimble.runtime.timing.PairedGain.clear`: in most rounds, by
    more than ``min_gain`` and more than the rounds vary by) is kept. So the choice is never slower than the
    fastest schedule measured by more than that noise, and a more complex one is taken only for a gain that held
    round after round: a schedule that came out ahead of a simpler one in a noisy comparison costs cross-stream
    waits and contention for nothing, and can run slower than the simpler one where it is used."""
    medians = times.median()
    fastest = min(range(times.modules), key=lambda m: (medians[m], m))
    chosen = next(m for m in range(times.modules) if not paired_gain(times, m, fastest).clear(min_gain))
    if chosen != fastest:
        gain = paired_gain(times, chosen, fastest)
        under = "within noise" if not gain.clear() else f"under the {min_gain:.0%} a more complex schedule must gain"
        why = f"{labels[fastest]} faster by only {gain.describe()}, {under}: kept {labels[chosen]}"
    elif chosen == 0:
        why = f"{labels[0]} measured fastest"
    else:
        why = f"{labels[chosen]} faster than {labels[0]} by {paired_gain(times, 0, chosen).describe()}"
    return Decision(chosen, why)


def _label(cap: int, order: str) -> str:
    return "1 stream" if cap == 1 else f"cap {cap}{' least slack first' if order == 'slack' else ''}"


def choose_streams(result, session, reuse: str | None = None,
                   memory_budget: int | None = None) -> tuple[object, StreamChoice]:
    """The stream-choice stage: (the chosen BuildResult, the :class:`~.report.StreamChoice`: every candidate's cap,
    order, streams, pool bytes and measured ms, the cap chosen and how), measured on the build session's GPU, or
    read from its cache."""
    timer = session.timer
    reuse = reuse or _reuse_of(result)
    target = result.tvm_target
    measuring = result.kernels is not None and session.can_measure(target)
    if measuring:
        measured = _Measured(result, session)
        decision_key = measured.key("stream_choice", plan=_plan_digest(result), reuse=reuse,
                                    memory_budget=memory_budget, rule=RULE)
        known = _decided(result, reuse, measured, decision_key)
        if known is not None:
            return known
    candidates = _candidates(result, reuse, memory_budget)
    if len(candidates) == 1:  # a chain (densenet121): no cap to choose; only the edges, where a GPU can try them
        (key, chosen), = candidates.items()
        chosen, edges = _try_edges(chosen, measured) if measuring else (chosen, None)
        return chosen, StreamChoice(memory_budget, _describe(candidates), *key, how="the only candidate", edges=edges)
    if not measuring:
        if target.kind.name == "cuda" and result.kernels is not None:
            session.note(f"max_streams='auto' measures schedules on a {target.attrs['arch']} GPU and {timer.where} has "
                      "none: keeping Nimble's widest schedule that fits")
        key = max(candidates)
        return candidates[key], StreamChoice(memory_budget, _describe(candidates), *key,
                                             how="widest that fits (nothing measured)")
    costs = None
    if (1, "program") in candidates and len(candidates) > 2:
        costs = kernel_costs(candidates[(1, "program")], measured.launch_ms(candidates[(1, "program")], 5))
        candidates.update(_slack_candidates(result, reuse, memory_budget, candidates, costs))
    keys = sorted(candidates)  # the simplest first: fewer streams, then program order before least slack first
    rounds = measured.replay_ms([candidates[k] for k in keys])
    decision = decide(rounds, [_label(*k) for k in keys])
    best = keys[decision.chosen]
    chosen, priority = candidates[best], None
    if best[0] != 1 and costs is not None:
        chosen, priority = _try_priorities(chosen, costs, measured)
    chosen, edges = _try_edges(chosen, measured)
    record = StreamChoice(memory_budget, _describe(candidates, dict(zip(keys, rounds.median()))), *best,
                          how=f"measured on {timer.where}: CUDA-graph replays, side by side", priority=priority,
                          why=decision.why, edges=edges)
    measured.session.keep(decision_key, {
        "chosen": list(best), "costs": costs, "prioritized": bool(priority and priority.kept),
        "full_edges": bool(edges and not edges.kept), "plan": _plan_digest(chosen), "record": record.to_dict()})
    return chosen, record


def _valid_decision(value) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("chosen"), list) and len(value["chosen"]) == 2
            and isinstance(value["chosen"][0], int) and value["chosen"][1] in ("program", "slack")
            and (value.get("costs") is None or timing_cache.numbers()(value["costs"]))
            and isinstance(value.get("prioritized"), bool) and isinstance(value.get("full_edges", False), bool)
            and isinstance(value.get("plan"), str)
            and isinstance(value.get("record"), dict))


def _decided(result, reuse: str, measured: "_Measured", key) -> tuple[object, StreamChoice] | None:
    """(chosen, record) as an earlier build measured and chose them (the timing cache's ``stream_choice``
    entry of this lowered module, widest plan, memory plan and budget), with only the chosen schedule
    built: every candidate's plan and replay are what decided it, and would be the same. None when there
    is no such entry, or the schedule built from it is not the plan chosen then."""
    known = measured.session.cached(key, valid=_valid_decision)
    if known is None:
        return None
    (cap, order), costs = known["chosen"], known["costs"]
    if (order == "slack" or known["prioritized"]) and (costs is None or len(costs) != len(result.assignment.order)):
        return None
    if cap == result.plan.num_streams and order == "program":
        chosen = result
    elif 1 <= cap < result.plan.num_streams:
        chosen = rescheduled(result, cap, reuse, costs if order == "slack" else None)
    else:
        return None
    if known["prioritized"]:
        chosen = prioritized(chosen, [costs[k] for k in chosen.assignment.order])
    if known.get("full_edges", False):
        chosen = without_programmatic_edges(chosen)
    if _plan_digest(chosen) != known["plan"]:
        return None
    return chosen, StreamChoice.from_dict(known["record"])


def _describe(candidates: dict, times: dict | None = None) -> tuple[StreamCandidate, ...]:
    return tuple(StreamCandidate(cap, order, c.plan.num_streams, c.plan.memory["pool_bytes"],
                                 times[(cap, order)] if times else None)
                 for (cap, order), c in sorted(candidates.items()))


def prioritized(result, durations):
    """``result`` with its plan's critical-path streams given priority (same kernels, same plan otherwise);
    ``durations`` are its launches' times."""
    from tvm_nimble.codegen.critical_path import critical_stream_priority

    plan = dataclasses.replace(result.plan, stream_priority=critical_stream_priority(result.plan, durations))
    return dataclasses.replace(result, plan=plan)


def without_programmatic_edges(result):
    """``result`` with its plan's edges into TVM's kernels full dependencies (the same kernels: their wait then
    finds the kernels before them done)."""
    return dataclasses.replace(result, plan=dataclasses.replace(result.plan, dependent_launch=False))


def _side_by_side(simpler, complex_, labels: list[str], measured: _Measured,
                  min_gain: float = MIN_GAIN) -> tuple[float, float, bool, str]:
    """The two plans replayed side by side: (the simpler's ms, the more complex one's, whether :func:`decide` keeps
    the more complex one, why)."""
    rounds = measured.replay_ms([simpler, complex_])
    decision = decide(rounds, labels, min_gain)
    simpler_ms, complex_ms = rounds.median()
    return simpler_ms, complex_ms, decision.chosen == 1, decision.why


def _try_edges(chosen, measured: _Measured) -> tuple[object, EdgesTrial | None]:
    """(``chosen`` with programmatic edges into TVM's kernels if :func:`decide` keeps them (a gain beyond the noise:
    :data:`EDGES_MIN_GAIN`), else without; the trial's record), or (``chosen``, None) where its kernels do not wait
    first."""
    if not chosen.plan.dependent_launch:
        return chosen, None
    full = without_programmatic_edges(chosen)
    full_ms, programmatic_ms, kept, why = _side_by_side(full, chosen, ["full edges", "programmatic edges"], measured,
                                                        EDGES_MIN_GAIN)
    return (chosen if kept else full), EdgesTrial(full_ms, programmatic_ms, kept, why)


def _try_priorities(chosen, costs, measured: _Measured) -> tuple[object, StreamPriority]:
    """(``chosen`` with critical-path stream priorities if :func:`decide` keeps them, the more complex of the two,
    else ``chosen``; the trial's record); ``costs`` are the kernels' one-stream times (see :func:`kernel_costs`)."""
    candidate = prioritized(chosen, [costs[k] for k in chosen.assignment.order])
    base_ms, prio_ms, kept, why = _side_by_side(chosen, candidate, ["no priorities", "critical-path priorities"],
                                                measured)
    trial = StreamPriority(tuple(int(s) for s in candidate.plan.stream_priority), base_ms, prio_ms, kept, why)
    return (candidate if kept else chosen), trial

