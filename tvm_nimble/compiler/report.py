"""The build report: what one build was asked, chose and measured, as typed sections (``BuildResult.report``).

Each stage of a build (:mod:`.build_stages`) makes its own section, and the report is put together from them:

    build_fixed             the options as built, the stream cap scheduled, concatenations and splits in place,
                            the compiled-kernel cache's outcome
    choose_merges           :class:`MergeChoice`: each sibling group found, merged or not and why
    select_kernels          :class:`KernelChoice`: per-chain times, the model check, cuBLASLt's GEMM algorithms,
                            the operators no provider takes (``Selection.choice``)
    choose_streams          :class:`StreamChoice`: the candidate caps and their times, the cap chosen and how
    accuracy.report         :class:`Accuracy`: the relative L2 error against float32 (precisions other than fp32)
    the session             the seconds of each phase, in :data:`PHASES` order

An artifact keeps the report as the JSON dict ``info`` of its manifest (:meth:`BuildReport.to_dict`, the same keys
and values artifacts always held: the runtime reads it back as a dict and needs no compiler);
:meth:`BuildReport.from_dict` reads one back, an older artifact's too (a key it lacks takes the section's default).
:meth:`BuildReport.format` gives the lines ``tvm-nimble compile`` prints and ``explain`` interleaves with the plan's.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field

from tvm_nimble.relay_passes import providers as provider_registry
from tvm_nimble.relay_passes.providers import simt_gemm

#: the phases a build times, in order: the stages, with "build" as its three parts and the kernel and stream
#: stages by their longer names (:attr:`BuildReport.phases` holds those a build ran, in seconds)
PHASES = ("import", "precision", "layout", "merge", "kernel choice", "lower", "schedule", "generate", "stream choice",
          "accuracy")


def _without_none(pairs: dict) -> dict:
    return {k: v for k, v in pairs.items() if v is not None}


# ---- the options as built ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuiltOptions:
    """The options a build's kernels and plan were made with, as resolved (``kernels`` is ``tvm``, ``vendor`` or
    ``best``, never ``auto``; ``layout`` the activation layout built, never ``auto``). None: not recorded (an older
    artifact)."""

    kernels: str | None = None
    providers: tuple[str, ...] | None = None  # None: every registered provider
    precision: str | None = None
    allow_tf32: bool | None = None
    layout: str | None = None
    policy: str | None = None  # the reduced-precision policy, described; None where compute stays float32
    tuning_db: str | None = None  # its absolute path
    merge: str | None = None

    @classmethod
    def of(cls, options) -> "BuiltOptions":
        """Of a :class:`~.options.BuildOptions`."""
        return cls(options.kernels, tuple(options.providers) if options.providers else None, options.precision,
                   options.allow_tf32, options.data_layout,
                   options.policy.describe() if options.compute_dtype != "float32" else None,
                   os.path.abspath(options.tuning_db) if options.tuning_db else None, options.merge)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["providers"] = list(self.providers) if self.providers is not None else None
        return out

    @classmethod
    def from_dict(cls, info: dict) -> "BuiltOptions":
        values = {f.name: info.get(f.name) for f in dataclasses.fields(cls)}
        if values["providers"] is not None:
            values["providers"] = tuple(values["providers"])
        return cls(**values)


# ---- kernel choice -----------------------------------------------------------------------------------------------
@dataclass
class KernelTiming:
    """One distinct chain a provider can take: how often the model has it, the provider's and TVM's
    measured times for it, and the kernel it got (``vendor``: the provider's; ``tvm``: TVM's, because
    it was faster, another provider saved more, or the whole-model check overruled the choice)."""

    signature: str
    count: int
    vendor_ms: float
    tvm_ms: float
    kernel: str = ""
    provider: str = ""  # the provider whose call ``vendor_ms`` times (cudnn, cublaslt, ...)
    #: who runs these operators in the plan: this provider, another that saved more, or "tvm" ("": not recorded)
    taken_by: str = ""

    def __post_init__(self):
        self.kernel = self.kernel or ("vendor" if self.vendor_ms <= self.tvm_ms else "tvm")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ModelCheck:
    """The per-chain choice against all-vendor kernels, both as whole one-stream CUDA graphs: a chain
    timed alone can fuse differently inside the model (TVM fuses a following element-wise op into
    its convolution; the vendor call does not), so the mix is kept only where the model confirms it."""

    best_ms: float
    vendor_ms: float
    #: only where the mix lost: every operator a provider offers on its fastest provider, none on TVM's kernels
    #: (replayed beside all-vendor again, which ``vendor_ms`` then is)
    providers_ms: float | None = None
    #: where the mix lost by over MIX_LOSS_PROFILED: its slowest launches in the model, [kernel, ms] (what to look at)
    mix_slowest: list | None = None

    @property
    def kept(self) -> str:
        if self.providers_ms is not None and self.providers_ms < min(self.best_ms, self.vendor_ms):
            return "providers"
        return "best" if self.best_ms < self.vendor_ms else "vendor"

    def to_dict(self) -> dict:
        return {**asdict(self), "kept": self.kept}

    @classmethod
    def from_dict(cls, check: dict) -> "ModelCheck":
        return cls(check["best_ms"], check["vendor_ms"], check.get("providers_ms"), check.get("mix_slowest"))


@dataclass(frozen=True)
class GemmAlgorithm:
    """One distinct GEMM call timed (:mod:`.gemm_algorithms`): its candidates' microseconds and the index run."""

    signature: str
    candidates_us: tuple[float, ...]
    chosen: int
    provider: str | None = None  # cublaslt or simt_gemm (None: an older artifact's, cuBLASLt's)

    def to_dict(self) -> dict:
        return _without_none({"signature": self.signature, "candidates_us": list(self.candidates_us),
                              "chosen": self.chosen, "provider": self.provider})

    @classmethod
    def from_dict(cls, record: dict) -> "GemmAlgorithm":
        return cls(record["signature"], tuple(record["candidates_us"]), record["chosen"], record.get("provider"))


@dataclass(frozen=True)
class NotTaken:
    """Operators that stayed on TVM's kernels for one reason (no provider takes them)."""

    operator: str
    why: str
    count: int


@dataclass(frozen=True)
class KernelChoice:
    """What the kernel choice measured and chose (:mod:`.kernel_choice`); empty where nothing was measured
    (``kernels`` ``tvm`` or ``vendor``, which still list what no provider takes)."""

    timings: tuple[KernelTiming, ...] = ()
    #: provider (or "tvm") -> how many of the measured operators it runs in the plan
    operators: dict[str, int] = field(default_factory=dict)
    check: ModelCheck | None = None
    #: why a mix was not checked in the model and all-vendor kept instead ("": checked, or nothing to check)
    check_skipped: str = ""
    gemm_algorithms: tuple[GemmAlgorithm, ...] = ()
    not_taken: tuple[NotTaken, ...] = ()
    #: seconds the measuring waited, after TVM's side of every chain was timed, on the vendor extension's units
    #: compiling (a machine's first build that needs them; 0: they were compiled before)
    extension_wait_s: float = 0.0

    def to_dict(self) -> dict:
        """Its keys of an artifact's info, each only where it holds something."""
        out = {}
        if self.timings:
            out["kernel_choice"] = [t.to_dict() for t in self.timings]
        if self.extension_wait_s:
            out["kernel_choice_extension_wait_s"] = round(self.extension_wait_s, 3)
        if self.operators:
            out["kernel_choice_operators"] = dict(self.operators)
        if self.check is not None:
            out["kernel_choice_check"] = self.check.to_dict()
        if self.check_skipped:
            out["kernel_choice_check_skipped"] = self.check_skipped
        if self.gemm_algorithms:
            out["gemm_algorithms"] = [a.to_dict() for a in self.gemm_algorithms]
        if self.not_taken:
            out["not_taken"] = [[n.operator, n.why, n.count] for n in self.not_taken]
        return out

    @classmethod
    def from_dict(cls, info: dict) -> "KernelChoice":
        check = info.get("kernel_choice_check")
        return cls(tuple(KernelTiming(**t) for t in info.get("kernel_choice", [])),
                   dict(info.get("kernel_choice_operators") or {}), ModelCheck.from_dict(check) if check else None,
                   info.get("kernel_choice_check_skipped", ""),
                   tuple(GemmAlgorithm.from_dict(a) for a in info.get("gemm_algorithms", [])),
                   tuple(NotTaken(*n) for n in info.get("not_taken", [])),
                   float(info.get("kernel_choice_extension_wait_s", 0.0)))

    def summary(self) -> str:
        """One line: which kernel measured faster for how many operators, the kernel time of each choice,
        the model check, and the kernels the plan got (per provider, from ``operators`` when recorded; else from
        the timings, where an operator two providers offered counts twice)."""
        timings, check, operators = self.timings, self.check, self.operators
        faster_tvm = sum(t.count for t in timings if t.tvm_ms < t.vendor_ms)
        n = sum(t.count for t in timings)
        total = {k: sum(t.count * getattr(t, f"{k}_ms") for t in timings) for k in ("vendor", "tvm")}
        best = sum(t.count * min(t.vendor_ms, t.tvm_ms) for t in timings)
        line = (f"kernel choice: cuDNN/cuBLAS measured faster for {n - faster_tvm} operators, TVM for {faster_tvm}; "
                f"kernel time {best:.3f} ms with the faster of each (all vendor {total['vendor']:.3f} ms, "
                f"all TVM {total['tvm']:.3f} ms)")
        if check is not None:
            line += f"; whole model, one stream: that mix {check.best_ms:.3f} ms, all vendor {check.vendor_ms:.3f} ms"
            if check.providers_ms is not None:
                line += f", each operator on its fastest provider (no TVM kernel) {check.providers_ms:.3f} ms"
        elif self.check_skipped:
            line += f"; {self.check_skipped}"
        if operators:
            order = sorted(operators, key=lambda p: (p == provider_registry.TVM, -operators[p], p))
            return line + "; in the plan: " + ", ".join(f"{operators[p]} on {p}" for p in order)
        on_tvm = sum(t.count for t in timings if t.kernel == "tvm")
        return line + f"; in the plan: {n - on_tvm} on cuDNN/cuBLAS, {on_tvm} on TVM"

    def timing_table(self) -> list[str]:
        """explain's table: one row per chain timed, the costliest first."""
        lines = [f"  {'ops':>4s} {'provider':>9s} {'its ms':>8s} {'tvm ms':>8s}  ran on    operators -> provider call"]
        for c in sorted(self.timings, key=lambda c: -c.count * max(c.vendor_ms, c.tvm_ms)):
            chosen = c.taken_by or ((c.provider or "vendor") if c.kernel == "vendor" else "tvm")
            lines.append(f"  {c.count:4d} {c.provider or 'vendor':>9s} {c.vendor_ms:8.4f} {c.tvm_ms:8.4f}  "
                         f"{chosen:8s}  {c.signature}")
        return lines

    def gemm_lines(self) -> list[str]:
        """A line for the GEMMs timed, then one per cuBLASLt GEMM whose algorithm is not the heuristic's first."""
        if not self.gemm_algorithms:
            return []
        ours = [r for r in self.gemm_algorithms if r.provider == simt_gemm.PROVIDER.name]
        theirs = [r for r in self.gemm_algorithms if r.provider != simt_gemm.PROVIDER.name]
        moved = [r for r in theirs if r.chosen]
        lines = [f"cuBLASLt algorithms: {len(theirs)} distinct GEMMs timed, {len(moved)} run a faster one than the "
                 "heuristic's first"]
        if ours:
            lines.append(f"our fp32 GEMM: {len(ours)} distinct GEMMs, the fastest of each one's tile / split-K "
                         "candidates")
        for r in moved:
            us = r.candidates_us
            lines.append(f"  algorithm {r.chosen}: {us[r.chosen]:.1f} us (first: {us[0]:.1f} us)  {r.signature}")
        return lines

    def not_taken_lines(self) -> list[str]:
        """What no provider takes, and why."""
        if not self.not_taken:
            return []
        return ["not taken by any provider (on TVM's kernels):"] + [
            f"  {n.count:4d} x {n.operator}: {n.why}" for n in sorted(self.not_taken, key=lambda n: -n.count)]

    def wait_line(self) -> list[str]:
        """Where the measuring waited on the vendor extension's compile: a line saying so and what avoids it."""
        if self.extension_wait_s < 0.05:
            return []
        return [f"kernel choice waited {self.extension_wait_s:.1f} s on the vendor extension's units compiling (this "
                "machine's first build that needs them; cached now, and `tvm-nimble prepare` compiles them ahead)"]

    def lines(self, detail: bool = False) -> list[str]:
        """The summary, the wait on the vendor extension and the GEMMs' line; with ``detail``, the per-chain table,
        each GEMM run with another algorithm, and what no provider takes."""
        if not detail:
            return ([self.summary()] if self.timings else []) + self.wait_line() + self.gemm_lines()[:1]
        head = [self.summary()] + self.timing_table() if self.timings else []
        return head + self.wait_line() + self.gemm_lines() + self.not_taken_lines()


# ---- merge choice ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MergeGroup:
    """One group of sibling operators found (``relay_passes.merge_siblings``), and whether it was merged and why."""

    group: str
    merged: bool
    why: str = ""


@dataclass(frozen=True)
class MergeMeasurement:
    """``merge="auto"``'s replays: [one stream, widest] ms of the separate and the merged model."""

    separate_ms: tuple[float, ...]
    merged_ms: tuple[float, ...]
    kept: str  # "merged" or "separate"
    where: str

    def to_dict(self) -> dict:
        return {"separate_ms": list(self.separate_ms), "merged_ms": list(self.merged_ms), "kept": self.kept,
                "where": self.where}


@dataclass(frozen=True)
class MergeChoice:
    """The merge stage's record (:mod:`.merge_choice`; none with ``merge="off"``)."""

    mode: str
    groups: tuple[MergeGroup, ...] = ()
    measured: MergeMeasurement | None = None

    def to_dict(self) -> dict:
        out = {"mode": self.mode, "groups": [asdict(g) for g in self.groups]}
        if self.measured is not None:
            out["measured"] = self.measured.to_dict()
        return out

    @classmethod
    def from_dict(cls, record: dict) -> "MergeChoice":
        m = record.get("measured")
        return cls(record["mode"], tuple(MergeGroup(g["group"], g["merged"], g.get("why", "")) for g in record["groups"]),
                   MergeMeasurement(tuple(m["separate_ms"]), tuple(m["merged_ms"]), m["kept"], m["where"])
                   if m else None)

    @property
    def merged_count(self) -> int:
        return sum(g.merged for g in self.groups)

    def lines(self, detail: bool = True) -> list[str]:
        """How many groups were found and merged; with ``detail`` (explain's), each group, whether it was merged
        and why, and what was measured."""
        lines = [f"merge ({self.mode}): {len(self.groups)} sibling groups found, {self.merged_count} merged"]
        if not detail:
            return lines
        for g in self.groups:
            lines.append(f"  {'merged' if g.merged else 'separate'}: {g.group}"
                         + (f" -- {g.why}" if g.why and g.why != "merged" else ""))
        m = self.measured
        if m:
            lines.append(f"  measured on {m.where}: separate {m.separate_ms[0]:.3f} ms one stream, "
                         f"{m.separate_ms[1]:.3f} ms widest; merged {m.merged_ms[0]:.3f} / {m.merged_ms[1]:.3f} ms; "
                         f"kept {m.kept}")
        return lines


# ---- stream choice -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamCandidate:
    """One schedule the stream choice weighed: its cap, order (``program`` or cost-aware ``slack``), streams,
    memory pool, and its replay time where measured."""

    max_streams: int
    order: str
    streams: int
    pool_bytes: int
    measured_ms: float | None = None

    def to_dict(self) -> dict:
        return _without_none(asdict(self))

    @classmethod
    def from_dict(cls, c: dict) -> "StreamCandidate":
        return cls(c["max_streams"], c.get("order", "program"), c["streams"], c["pool_bytes"], c.get("measured_ms"))


@dataclass(frozen=True)
class StreamPriority:
    """The chosen plan tried with critical-path stream priorities: which streams (one 0/1 each), its time against
    the plan's without, whether it was kept, and why (``why``: the rounds' verdict, e.g. "within noise")."""

    streams: tuple[int, ...]
    base_ms: float
    measured_ms: float
    kept: bool
    why: str | None = None

    def to_dict(self) -> dict:
        return _without_none({**asdict(self), "streams": list(self.streams)})

    @classmethod
    def from_dict(cls, p: dict) -> "StreamPriority":
        return cls(tuple(p["streams"]), p["base_ms"], p["measured_ms"], p["kept"], p.get("why"))


@dataclass(frozen=True)
class EdgesTrial:
    """The chosen plan replayed with its edges into TVM's kernels programmatic (sm_90+: the kernels begin by waiting,
    ``codegen/dependent_launch.py``) and with every edge a full dependency: both times, whether the programmatic
    edges were kept, and why (the rounds' verdict)."""

    full_ms: float
    programmatic_ms: float
    kept: bool
    why: str | None = None

    def to_dict(self) -> dict:
        return _without_none(asdict(self))

    @classmethod
    def from_dict(cls, e: dict) -> "EdgesTrial":
        return cls(e["full_ms"], e["programmatic_ms"], e["kept"], e.get("why"))


@dataclass(frozen=True)
class StreamChoice:
    """``max_streams="auto"``'s record (:mod:`.stream_choice`): every candidate, the cap and order chosen, how
    (``how``: measured where, the only candidate, or the widest that fits with nothing measured) and, where
    measured, why (``why``: "cap 2 faster than 1 stream by 3.1% ± 0.4% in 5/5 rounds", or the faster one's gain
    within noise and the simpler schedule kept). ``edges``: the chosen plan's trial of programmatic edges into TVM's
    kernels, where its kernels wait first and the choice measured."""

    memory_budget: int | None
    candidates: tuple[StreamCandidate, ...]
    chosen: int
    chosen_order: str
    how: str
    priority: StreamPriority | None = None
    why: str | None = None
    edges: EdgesTrial | None = None

    def to_dict(self) -> dict:
        out = {"memory_budget": self.memory_budget, "candidates": [c.to_dict() for c in self.candidates],
               "chosen": self.chosen, "chosen_order": self.chosen_order, "how": self.how}
        if self.priority is not None:
            out["priority"] = self.priority.to_dict()
        if self.why is not None:
            out["why"] = self.why
        if self.edges is not None:
            out["edges"] = self.edges.to_dict()
        return out

    @classmethod
    def from_dict(cls, record: dict) -> "StreamChoice":
        p, e = record.get("priority"), record.get("edges")
        return cls(record.get("memory_budget"), tuple(StreamCandidate.from_dict(c) for c in record["candidates"]),
                   record["chosen"], record.get("chosen_order", "program"), record["how"],
                   StreamPriority.from_dict(p) if p else None, record.get("why"),
                   EdgesTrial.from_dict(e) if e else None)

    @property
    def chosen_ms(self) -> float | None:
        """The chosen schedule's measured latency (with its priorities where they were kept, with or without the
        programmatic edges as kept), or None."""
        if self.edges is not None:
            return self.edges.programmatic_ms if self.edges.kept else self.edges.full_ms
        if self.priority is not None and self.priority.kept:
            return self.priority.measured_ms
        return next((c.measured_ms for c in self.candidates
                     if (c.max_streams, c.order) == (self.chosen, self.chosen_order)), None)

    def summary(self) -> str:
        parts = []
        for c in self.candidates:
            ms = f" {c.measured_ms:.3f} ms" if c.measured_ms is not None else ""
            order = ", least slack first" if c.order == "slack" else ""
            parts.append(f"cap {c.max_streams} ({c.streams} streams{order}){ms}")
        chosen = f"{self.chosen}{' least slack first' if self.chosen_order == 'slack' else ''}"
        why = f"; {self.why}" if self.why else ""
        text = f"stream cap: {chosen} ({self.how}{why}); " + ", ".join(parts)
        p = self.priority
        if p:
            text += (f"; critical-path stream priority on {sum(p.streams)} of {len(p.streams)} streams: "
                     f"{p.measured_ms:.3f} vs {p.base_ms:.3f} ms, {'kept' if p.kept else 'not kept'}"
                     + (f" ({p.why})" if p.why else ""))
        e = self.edges
        if e:
            text += (f"; programmatic edges into TVM's kernels: {e.programmatic_ms:.3f} vs {e.full_ms:.3f} ms, "
                     f"{'kept' if e.kept else 'not kept'}" + (f" ({e.why})" if e.why else ""))
        return text


# ---- accuracy ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Accuracy:
    """A reduced-precision build's error against float32 (:mod:`.accuracy`), or why it was not measured."""

    precision: str
    rel_l2: float | None  # the largest over the seeded inputs; None: not measured
    why: str | None = None  # why not measured
    seeds: int | None = None
    reference: str | None = None  # what computed the float32 outputs
    input_dependent: bool | None = None  # whether the reference's output depends on the input (else no real check)
    reference_cached: bool | None = None  # whether the reference outputs came from the session's cache
    non_finite: int = 0  # output values NaN or infinite where float32's are finite

    def to_dict(self) -> dict:
        out = {"precision": self.precision, "rel_l2": self.rel_l2,
               **_without_none({"why": self.why, "seeds": self.seeds, "reference": self.reference,
                                "input_dependent": self.input_dependent, "reference_cached": self.reference_cached})}
        if self.non_finite:
            out["non_finite"] = self.non_finite
        return out

    @classmethod
    def from_dict(cls, report: dict) -> "Accuracy":
        return cls(report.get("precision"), report.get("rel_l2"), report.get("why"), report.get("seeds"),
                   report.get("reference"), report.get("input_dependent"), report.get("reference_cached"),
                   report.get("non_finite", 0))

    def describe(self) -> str:
        """One line for compile and explain."""
        if self.rel_l2 is None:
            return f"accuracy ({self.precision}): not measured, {self.why}"
        note = "" if self.input_dependent else " (the fp32 output barely depends on the input: not a meaningful check)"
        return (f"accuracy ({self.precision}): {self.rel_l2:.2e} relative L2 from {self.reference}, "
                f"worst of {self.seeds} seeded inputs{note}")


# ---- the report --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildReport:
    """One build's report (see the module docstring). A field left at its default is a part the build did not
    run (no stream choice with a fixed cap, no accuracy in fp32, no merge record with ``merge="off"``)."""

    options: BuiltOptions = field(default_factory=BuiltOptions)
    #: the stream cap the plan was scheduled with (None: Nimble's widest)
    max_streams: int | None = None
    concats_in_place: int = 0  # concatenations whose producers write straight into their slices
    splits_as_views: int | None = None  # splits read in place (merged builds only)
    #: the compiled-kernel cache: "hit" (loaded), "stored" (compiled and kept), "present" (the model check's compile
    #: reused, already kept), "miss" (not kept); None: the build kept no cache
    kernel_cache: str | None = None
    #: the order the stream choice's plan runs each stream in ("program", or cost-aware "slack"); None: not chosen
    stream_order: str | None = None
    stream_choice: StreamChoice | None = None
    accuracy: Accuracy | None = None
    merge_choice: MergeChoice | None = None
    kernel_choice: KernelChoice = field(default_factory=KernelChoice)
    #: seconds per phase, in :data:`PHASES` order (None: not timed, e.g. a probe's build)
    phases: dict[str, float] | None = None

    @classmethod
    def of_build(cls, options, concats_in_place: int, splits_as_views: int | None = None,
                 kernel_cache: str | None = None) -> "BuildReport":
        """What lowering, scheduling and generating with ``options`` (a :class:`~.options.BuildOptions`) reports."""
        return cls(BuiltOptions.of(options), None if options.max_streams == "auto" else options.max_streams,
                   concats_in_place, splits_as_views, kernel_cache)

    def replace(self, **changes) -> "BuildReport":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The JSON an artifact keeps as its ``info`` (the keys and values it always held)."""
        out = {"max_streams": self.max_streams, **self.options.to_dict(), "concats_in_place": self.concats_in_place,
               **_without_none({"splits_as_views": self.splits_as_views, "kernel_cache": self.kernel_cache,
                                "stream_order": self.stream_order})}
        if self.stream_choice is not None:
            out["streams_choice"] = self.stream_choice.to_dict()
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy.to_dict()
        if self.merge_choice is not None:
            out["merge_choice"] = self.merge_choice.to_dict()
        out.update(self.kernel_choice.to_dict())
        if self.phases is not None:
            out["phases"] = dict(self.phases)
        return out

    @classmethod
    def from_dict(cls, info: dict) -> "BuildReport":
        """The report an artifact's ``info`` holds (an older artifact's: what it lacks takes the defaults)."""
        streams, acc, merge, phases = (info.get(k) for k in ("streams_choice", "accuracy", "merge_choice", "phases"))
        return cls(BuiltOptions.from_dict(info), info.get("max_streams"), info.get("concats_in_place", 0),
                   info.get("splits_as_views"), info.get("kernel_cache"), info.get("stream_order"),
                   StreamChoice.from_dict(streams) if streams else None, Accuracy.from_dict(acc) if acc else None,
                   MergeChoice.from_dict(merge) if merge else None, KernelChoice.from_dict(info),
                   ordered_phases(phases) if phases is not None else None)

    # ---- what compile and explain print --------------------------------------------------------------------------
    def precision_lines(self) -> list[str]:
        """The precision and its policy, and the accuracy line (precisions other than fp32)."""
        precision = self.options.precision
        if precision is None or precision == "fp32":
            return []
        policy = f" ({self.options.policy})" if self.options.policy else " (TF32 tensor cores in cuDNN/cuBLASLt)"
        return [f"precision: {precision}{policy}"] + ([self.accuracy.describe()] if self.accuracy else [])

    def phases_line(self) -> str | None:
        """One line: the seconds of each phase the build ran, in order, and their sum."""
        if not self.phases:
            return None
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases.items())
        return f"build phases: {parts} (total {sum(self.phases.values()):.1f} s)"

    def lines(self, detail: bool = False) -> list[str]:
        """What the build chose, a line or two per section (compile's): merges, kernels, stream cap, precision and
        accuracy, layout; with ``detail`` (explain's), each merge group, every chain timed, each GEMM run with
        another algorithm, and what no provider takes."""
        lines = self.merge_choice.lines(detail) if self.merge_choice else []
        lines += self.kernel_choice.lines(detail)
        if self.stream_choice is not None:
            lines.append(self.stream_choice.summary())
        lines += self.precision_lines()
        if self.options.layout == "nhwc":
            lines.append("layout: NHWC inside the build (convolutions and pools channels-last; inputs and outputs "
                         "keep the model's layout)")
        return lines

    def format(self, detail: bool = False) -> str:
        """:meth:`lines`, then the phases' line."""
        return "\n".join(self.lines(detail) + [line for line in (self.phases_line(),) if line])

    def __str__(self) -> str:
        return self.format()


def ordered_phases(seconds: dict[str, float]) -> dict[str, float]:
    """``seconds`` in :data:`PHASES` order (an artifact's JSON keeps its keys sorted), any other name after."""
    rank = {name: i for i, name in enumerate(PHASES)}
    return {name: seconds[name] for name in sorted(seconds, key=lambda n: (rank.get(n, len(PHASES)), n))}
