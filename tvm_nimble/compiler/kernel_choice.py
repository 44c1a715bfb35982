"""``kernels="best"``: per operator, the fastest of the kernel providers that accept it and TVM's kernel.

Every provider's candidate kernels are timed on the GPU the model will run on, in graph mode, inside
its probe module (``relay_passes.kernel_probe``: one copy of each distinct chain the provider takes)
built with that provider's calls, and TVM's kernels (tuned ones when a database is given) inside one
probe of every provider's chains (:class:`TvmChainTimes`: a chain several providers offer is compiled
once), each replayed as a one-stream CUDA graph with an event pair around every launch. A chain's time
is the sum over the launches that feed its output (TVM may need two kernels where the provider needs
one, e.g. a padding and a convolution). Each launch's bracket adds the same small cost on both sides.
Per operator, the provider whose chain saves the most time against TVM's kernel for the same chain
wins (ties go to the provider); TVM keeps it when none saves any. Measurements are kept in the build
session's cache (:mod:`.session`: on disk, and in memory), keyed by the measuring GPU, the chain's
signature, the precision, TF32 and the tuning database's contents, so a second build of the model (or
of one that shares its chains), and the stock-TVM baseline of a benchmark, measure nothing again.
The whole-model check is kept likewise, by the structural hashes of the modules it compares.

:func:`select_kernels` is the stage the build session runs; it builds its probes and the whole-model check
with :func:`.stages.build_fixed`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm

from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes import providers as provider_registry
from tvm_nimble.relay_passes.kernel_probe import build_probe, chain_keys
from tvm_nimble.relay_passes.vendor_offload import OffloadReport, find_offloads
from tvm_nimble.contract.plan import Plan

from . import stages, timing_cache
from .gemm_algorithms import GemmAlgorithm, choose_gemm_algorithms
from .options import BuildOptions
from .report import KernelChoice, KernelTiming, ModelCheck, NotTaken  # noqa: F401  (KernelTiming: public here)

#: profiled replays per build; the median per launch is kept
PROFILE_REPS = 15
#: a mix of providers and TVM kernels is confirmed by the model check only when the chains' own times predict it
#: this much faster than all-vendor (a share of the all-vendor chains' time); below it the check, which costs two
#: whole-model compiles (densenet121 on an H100: ~40 s of a 74 s build), could not tell the two apart from its own
#: replay noise, and all-vendor is kept
MIN_MIX_GAIN = 0.01

#: how :func:`measure_kernels` times a provider's chains (part of the timing cache's key): each GEMM with its
#: measured-fastest algorithm (older entries timed the heuristic's first; see benchmarks/findings.md, 'cuBLASLt at its
#: best in the kernel choice')
CHAIN_TIMING = "fastest-gemm-algorithm"

#: a mix that loses the model check by this factor or more is profiled, and its slowest launches noted: the chains'
#: own times predicted it faster, so something in the model (a fusion, a layout) made a kernel far slower
MIX_LOSS_PROFILED = 1.5


def launches_per_output(plan: Plan) -> list[list[int]]:
    """For each output of ``plan``: the launches its value depends on (backward through the data flow)."""
    writers_of: dict[int, list[int]] = {}
    for w, r in plan.read_after_write():
        writers_of.setdefault(r, []).append(w)
    result = []
    for out in plan.outputs:
        root = plan.root(out)
        stack = [l.idx for l in plan.launches if any(plan.root(t) == root for t in l.writes)]
        seen: set[int] = set()
        while stack:
            idx = stack.pop()
            if idx not in seen:
                seen.add(idx)
                stack.extend(writers_of.get(idx, ()))
        result.append(sorted(seen))
    return result


def _per_output_ms(result, reps: int, timer) -> list[float]:
    """Graph-mode time of the launches behind each output of a built probe, on ``timer``'s GPU."""
    per_launch = timer.launch_ms(result, reps)
    return [sum(per_launch[i] for i in launches) for launches in launches_per_output(result.plan)]


def one_stream(options: BuildOptions) -> BuildOptions:
    """The options a measurement builds with: one stream, kernels compiled, no budget to meet."""
    return options.replace(max_streams=1, compile_kernels=True, memory_budget=None)


def replay_in_model(mods: list, session, prebuilt: list | None = None) -> tuple[list, list | None]:
    """The modules (already offloaded) built one-stream and replayed, side by side, on the session's GPU: (ms of
    each, the builds when they were made here, else None: the session's cache knew the answer). ``prebuilt``: a
    build of a module already made (or None), by position."""
    options = session.options
    key = session.key("model_check", modules=[session.module_hash(m) for m in mods])
    known = session.cached(key, valid=timing_cache.numbers(len(mods)))
    if known is not None:
        return list(known), None
    prebuilt = prebuilt or [None] * len(mods)
    built = [b if b is not None else stages.build_fixed(m, one_stream(options), session)
             for m, b in zip(mods, prebuilt)]
    times = session.timer.replay_ms(built).median()
    session.keep(key, times)
    return times, built


def check_in_model(chosen: tvm.IRModule, all_vendor: tvm.IRModule, session) -> tuple[ModelCheck, list | None]:
    """Both modules (already offloaded) built one-stream and replayed, side by side (:func:`replay_in_model`).
    Returns the check, and the two builds when they were made here (None when the cache knew the answer), for the
    build to reuse the one it keeps."""
    times, built = replay_in_model([chosen, all_vendor], session)
    return ModelCheck(*times), built


def check_measurable(session) -> None:
    """A one-line error unless the session's timer has a GPU of the (CUDA) target's arch to measure on."""
    target = session.target
    if not session.can_measure():
        timer = session.timer
        arch, there = str(target.attrs["arch"]), timer.arch()
        fix = ("build there, measure there through an RPC tracker (rpc_tracker=, rpc_key=), or use kernels='vendor' "
               "or 'tvm'") if session.measuring_here else "start the key's servers on such a GPU, or use another key"
        raise NimbleError(f"kernels='best' times the kernels on a {arch} GPU, and {timer.where} has "
                          f"{'a ' + there if there else 'none'}; {fix}")


class TvmChainTimes:
    """TVM's kernel time for every distinct chain the providers take (by :func:`chain_keys`), from one probe of all
    of them built with TVM's kernels and timed once, when a provider first needs it. Providers offer many of the
    same chains (cuDNN's legacy and graph-API calls the same convolutions, cuBLASLt the channels-last 1x1 ones,
    our depthwise kernel cuDNN's depthwise convolutions and pools): a TVM probe per provider compiled TVM's
    kernels for such a chain once per provider, and TVM's candidates are most of a cold build's time (googlenet
    fp16 on an H100: nvcc 64 s and DLight 24 s of a 108 s kernel choice)."""

    def __init__(self, mod: tvm.IRModule, offloads_by_provider: dict, measure):
        """``measure``: a module's per-output times (:func:`_module_ms`)."""
        self.mod, self.offloads, self.measure = mod, offloads_by_provider, measure
        self._times: dict[str, dict[str, float]] | None = None  # provider -> signature -> TVM's time, once timed

    def ms(self, provider: str, signatures: list[str]) -> list[float]:
        """TVM's time for each of ``provider``'s chains (by signature); the first call builds and times them all
        (a build whose chains are all in the timing cache never calls it)."""
        self.measure_all()
        return [self._times[provider][s] for s in signatures]

    def measure_all(self) -> None:
        """Build and time TVM's kernels for every chain, unless done already (this needs no vendor extension: a
        cold build does it while the extension compiles)."""
        if self._times is None:  # (a failed build or replay raises here again for the next provider that asks)
            keys = {name: chain_keys(self.mod, offloads) for name, offloads in self.offloads.items()}
            key_of = {id(o): keys[name][o.signature] for name, offloads in self.offloads.items() for o in offloads}
            union = [o for offloads in self.offloads.values() for o in offloads]
            probe = build_probe(self.mod, offloads=union, key=lambda o: key_of[id(o)])
            by_key = dict(zip(probe.signatures, self.measure(probe.mod)))
            self._times = {name: {s: by_key[k] for s, k in ks.items()} for name, ks in keys.items()}


def _module_ms(module: tvm.IRModule, session, reps: int, measured: dict) -> list[float]:
    """The per-output times of ``module`` built one-stream (see :func:`_per_output_ms`); ``measured`` (by structural
    hash) keeps them, so a module two measurements need is compiled and timed once."""
    key = (session.module_hash(module), reps)
    if key not in measured:
        built = stages.build_fixed(module, one_stream(session.options), session)
        measured[key] = _per_output_ms(built, reps, session.timer)
    return measured[key]


def measure_kernels(mod: tvm.IRModule, session, provider, tvm_times: TvmChainTimes, reps: int = PROFILE_REPS,
                    measured: dict | None = None, offloads=None) -> list[KernelTiming]:
    """``provider``'s and TVM's times for every distinct chain of ``mod`` the provider takes, measured on the
    session's GPU (a :class:`~.timers.RemoteGPU` measures through an RPC tracker). ``tvm_times``: TVM's times of
    every provider's chains, timed once for all. ``measured``: the per-output times of the probe builds measured
    already (:func:`_module_ms`; one per ``select_kernels``). ``offloads``: the chains ``provider`` takes in
    ``mod`` (``find_offloads``), where the caller has them."""
    check_measurable(session)
    options = session.options
    probe = build_probe(mod, allow_tf32=options.allow_tf32, providers=[provider], offloads=offloads)
    if probe is None:
        return []
    # CHAIN_TIMING names how a provider's chains were timed: a timing taken another way is measured again
    keys = [session.key("chain", provider=provider.name, signature=s, reps=reps, timing=CHAIN_TIMING)
            for s in probe.signatures]
    found = [session.cached(k, valid=timing_cache.numbers(2)) for k in keys]
    if any(f is None for f in found):  # the probe holds every chain: measuring one costs the builds of all
        # each cuBLASLt GEMM with the algorithm the build will run (the fastest measured, see .gemm_algorithms),
        # not the heuristic's first: against TVM's kernel the provider competes at its best
        offloaded = stages.offload(probe.mod, options, providers=[provider])
        with_provider = _module_ms(choose_gemm_algorithms(offloaded, session)[0], session, reps,
                                   {} if measured is None else measured)
        found = [[v, t] for v, t in zip(with_provider, tvm_times.ms(provider.name, probe.signatures))]
        for k, f in zip(keys, found):
            session.keep(k, f)
    return [KernelTiming(s, n, *f, provider=provider.name)
            for s, n, f in zip(probe.signatures, probe.counts, found)]


@dataclass
class Selection:
    """A model with its kernels chosen: the Relax module (providers' calls in it), the resolved
    ``kernels`` choice, and, for ``best``, what was measured. ``build`` accepts one as its model."""

    mod: tvm.IRModule
    kernels: str
    timings: list[KernelTiming] = field(default_factory=list)
    check: ModelCheck | None = None
    algorithms: list[GemmAlgorithm] = field(default_factory=list)  # per distinct GEMM (gemm_algorithms)
    not_taken: list[NotTaken] = field(default_factory=list)  # operators no provider takes, by reason
    #: provider (or "tvm") -> how many of the measured operators it runs in the plan (each operator once, however
    #: many providers offered it)
    operators: dict[str, int] = field(default_factory=dict)
    #: ``mod`` built one-stream with its kernels compiled, where the model check built it already (the
    #: build reschedules it instead of compiling the same kernels again); None otherwise
    built: object = field(default=None, repr=False, compare=False)
    #: why a mix was not checked in the model and all-vendor kept instead ("": checked, or nothing to check)
    check_skipped: str = ""
    #: seconds the measuring waited on the vendor extension's units compiling (:class:`KernelChoice`)
    extension_wait_s: float = 0.0

    @property
    def choice(self) -> KernelChoice:
        """What was measured and chosen: the build report's section."""
        return KernelChoice(tuple(self.timings), dict(self.operators), self.check, self.check_skipped,
                            tuple(self.algorithms), tuple(self.not_taken), self.extension_wait_s)


def resolve_kernels(session) -> str:
    """The session's ``kernels``, where ``auto`` is, on CUDA, ``best`` (each operator on the fastest provider) when
    the vendor extension can be built and a GPU is here (or behind the timer's RPC tracker) to measure on,
    ``vendor`` when there is none, TVM's kernels when the extension cannot be built; a one-line note says which
    and why."""
    options = session.options
    if options.kernels != "auto":
        return options.kernels
    if not options.is_cuda or not options.offload_providers():
        return "tvm"
    from tvm_nimble.codegen.vendor_build import vendor_available

    ok, why = vendor_available()
    if not ok:
        session.note(f"vendor kernels unavailable, building with TVM's kernels: {why}")
        return "tvm"
    if not session.can_measure():
        session.note(f"no {options.arch} GPU {'here' if session.measuring_here else 'at ' + session.timer.where} to time "
                  "cuDNN/cuBLAS against TVM's kernels: every convolution and GEMM goes to cuDNN/cuBLAS "
                  "(kernels='vendor'); build on that GPU, or measure there through an RPC tracker, for kernels='best'")
        return "vendor"
    return "best"


def select_kernels(mod: tvm.IRModule, session) -> Selection:
    """The kernel-choice stage: ``mod`` with its operators on the providers' kernels, all that accept them
    (``kernels="vendor"``), none (``"tvm"``), or each on the fastest measured on the session's GPU (``"best"``;
    TVM's tuned kernels when the options have a tuning database). With ``best``, a mix of providers and
    TVM kernels is kept only if the whole model, built one-stream both ways, confirms it is faster than
    the providers' kernels everywhere (see :class:`ModelCheck`). To measure, the vendor extension is built for
    the target's arch and loaded in this process."""
    options = session.options
    kernels = resolve_kernels(session)
    if kernels == "tvm":
        return Selection(mod, kernels)  # vendor and best are CUDA's (BuildOptions refuses them on another target)
    if kernels == "best":
        check_measurable(session)  # before building anything for a GPU that is not there
    report = OffloadReport()
    providers = options.offload_providers()
    # what every provider takes, first come first served: the all-vendor module's chains, found once
    found_first = find_offloads(mod["main"], allow_tf32=options.allow_tf32, report=report, providers=providers)
    all_vendor = stages.offload(mod, options, report=report, found_in_main=found_first)
    not_taken = not_taken_by_providers(report)
    if kernels == "vendor":
        return Selection(all_vendor, kernels, not_taken=not_taken)
    # each provider's chains, found once: the probes, the choice and the plan's counts all read them
    found = {p.name: find_offloads(mod["main"], allow_tf32=options.allow_tf32, providers=[p]) for p in providers}
    offering = {p.kernel_prefix for p in providers if found[p.name]}
    measured: dict = {}
    tvm_times = TvmChainTimes(mod, {name: offloads for name, offloads in found.items() if offloads},
                              lambda module: _module_ms(module, session, PROFILE_REPS, measured))
    waited = 0.0
    if offering:  # measuring runs the calls of the providers that offer something here: only their units compile
        library = stages.PendingLibrary(options.target, offering)
        if library.compiling:  # a cold machine: TVM's side of every chain is compiled and timed meanwhile
            try:
                tvm_times.measure_all()
            except (RuntimeError, ValueError):
                pass  # raised again where a provider's measurement first asks for TVM's times, as without this
        library.wait()
        waited = library.waited_s
    timings, failed = [], []
    for p in providers:
        try:
            timings += measure_kernels(mod, session, p, tvm_times, measured=measured, offloads=found[p.name])
        except (RuntimeError, ValueError) as err:  # the provider's calls fail on this GPU: measure without it
            if p.name in {o.provider for o in found_first}:
                raise  # the all-vendor module runs its calls: nothing to fall back to
            failed.append(p)
            lines = str(err).strip().splitlines()
            session.note(f"{p.title}: its calls failed on this GPU ({lines[-1][:200] if lines else type(err).__name__}); "
                      "the kernel choice leaves it out")
    providers = [p for p in providers if p not in failed]
    offers = offers_by_anchor(mod, providers, options.allow_tf32, found)
    chosen = choose_providers(mod, timings, providers, options.allow_tf32, offers)
    _mark_kernels(timings, chosen)
    first = {o.signature: o.provider for o in found_first}
    skipped = ""
    if not all(chosen.get(s) == p for s, p in first.items()):
        gain, base = predicted_gain(timings, chosen, offers)
        if gain >= MIN_MIX_GAIN * base:
            selection = _checked_mix(mod, session, timings, providers, first, chosen, found, offers, all_vendor,
                                     not_taken)
            selection.extension_wait_s = waited
            return selection
        skipped = (f"the mix was predicted {gain * 1e3:.1f} us faster than all-vendor ({gain / base:.2%} of the chains' "
                   f"{base:.3f} ms), under the {MIN_MIX_GAIN:.0%} a model check can confirm: all-vendor kept")
        _mark_kernels(timings, first)
    operators = record_assignment(mod, timings, providers, options.allow_tf32, first, found)
    return _with_gemm_algorithms(Selection(all_vendor, kernels, timings, not_taken=not_taken, operators=operators,
                                           check_skipped=skipped, extension_wait_s=waited), session)


def _mark_kernels(timings: list[KernelTiming], assignment: dict[str, str]) -> None:
    """Each timing's ``kernel``: "vendor" where ``assignment`` (signature -> provider) gives its chain to its provider."""
    for t in timings:
        t.kernel = "vendor" if assignment.get(t.signature) == t.provider else "tvm"


def predicted_gain(timings: list[KernelTiming], chosen: dict[str, str], offers: dict) -> tuple[float, float]:
    """(ms the chosen mix saves over all-vendor, ms of all-vendor), summed over the operators the providers offer,
    from each chain's own measured times: all-vendor runs an operator on the first provider that offers it, the mix
    on the provider ``chosen`` for one of its chains, or on TVM's kernel for the first provider's chain.

    Both sides are timed over the same work: where the chosen chain takes more of the model than the first
    provider's (a GEMV whose prologue computes the LayerNorm before it), all-vendor runs that part on TVM's kernels,
    whose time is the difference of TVM's times for the two chains; and the other way round. This is the
    comparison :func:`choose_providers` makes (each chain's saving against TVM's kernels for the same chain)."""
    by_chain = {(t.provider, t.signature): t for t in timings}
    gain = base = 0.0
    for offered in offers.values():
        first = by_chain.get(offered[0])
        if first is None:
            continue
        taken = [by_chain[o] for o in offered if o in by_chain and chosen.get(o[1]) == o[0]]
        mix = taken[0] if taken else None
        work = max(first.tvm_ms, mix.tvm_ms) if mix else first.tvm_ms  # TVM's time for the larger chain
        vendor_ms = first.vendor_ms + work - first.tvm_ms
        mix_ms = mix.vendor_ms + work - mix.tvm_ms if mix else first.tvm_ms
        gain += vendor_ms - mix_ms
        base += vendor_ms
    return gain, base


def _checked_mix(mod, session, timings, providers, first, chosen, found, offers, all_vendor,
                 not_taken) -> Selection:
    """The mix and all-vendor built one-stream and replayed (:func:`check_in_model`); where the mix loses, every
    operator on its fastest provider too (:func:`replay_in_model`, beside all-vendor again). The fastest is kept."""
    options = session.options
    picked = stages.offload(mod, options, select=lambda o: chosen.get(o.signature) == o.provider)
    # each GEMM's algorithm before the check: the check then times what the build runs, and its build of the
    # module it keeps is the build's (no GEMM changes after it)
    both = [choose_gemm_algorithms(m, session) for m in (picked, all_vendor)]
    check, built = check_in_model(both[0][0], both[1][0], session)
    built = list(built) if built else [None, None]  # by position, as ``both``; None: the timing cache knew the times
    assignments = [chosen, first]
    if check.kept == "vendor":
        if built[0] is not None and check.best_ms > MIX_LOSS_PROFILED * check.vendor_ms:
            _note_slowest_launches(check, built[0], session)
        # the mix lost in the model (a TVM kernel slower there than alone): the providers' own choice, each operator
        # on its fastest provider and none on TVM, may still beat the first provider everywhere (a TF32 or fp16
        # model's convolutions split between cuDNN's legacy calls and its graph API)
        alt = choose_providers(mod, timings, providers, options.allow_tf32, offers, providers_only=True)
        if not all(alt.get(s) == p for s, p in first.items()):
            picked_alt = stages.offload(mod, options, select=lambda o: alt.get(o.signature) == o.provider)
            both.append(choose_gemm_algorithms(picked_alt, session))
            times, built_alt = replay_in_model([both[2][0], both[1][0]], session, prebuilt=[None, built[1]])
            check = ModelCheck(check.best_ms, times[1], times[0], check.mix_slowest)
            assignments.append(alt)
            built = [built[0], built_alt[1], built_alt[0]] if built_alt else built + [None]
    kept = {"best": 0, "vendor": 1, "providers": 2}[check.kept]
    _mark_kernels(timings, assignments[kept])
    operators = record_assignment(mod, timings, providers, options.allow_tf32, assignments[kept], found)
    return Selection(both[kept][0], "best", timings, check, both[kept][1], not_taken, operators, built=built[kept])


def _note_slowest_launches(check: ModelCheck, mix_build, session) -> None:
    """The losing mix's 8 slowest launches (one profiled replay of its build) into ``check.mix_slowest``, and the
    first five in a note: what made the model slower than the chains' own times predicted."""
    per_launch = session.timer.launch_ms(mix_build, 5)
    slowest = sorted(zip(per_launch, (l.kernel for l in mix_build.plan.launches)), reverse=True)[:8]
    check.mix_slowest = [[k, round(ms, 4)] for ms, k in slowest]
    session.note(f"the kernel choice's mix measured {check.best_ms:.3f} ms in the model against all-vendor's "
              f"{check.vendor_ms:.3f}; its slowest launches: "
              + ", ".join(f"{k} {ms:.3f} ms" for k, ms in check.mix_slowest[:5]))


def record_assignment(mod: tvm.IRModule, timings: list[KernelTiming], providers, allow_tf32: bool,
                      assignment: dict[str, str], found: dict | None = None) -> dict[str, int]:
    """With ``assignment`` (signature -> the provider whose call of it the plan runs): set each timing's
    ``taken_by`` (the provider that runs its operators, "tvm" when none does) and return how many operators
    each provider runs. An operator two providers offered (a batched GEMM of an attention that the attention
    provider also takes) counts once, for the one that took it; so does an operator inside a chain another
    operator's winner runs (an attention's P·V, which cuBLASLt offers alone but the attention call absorbs).
    ``found``: provider name -> its ``find_offloads`` in ``mod``, where the caller has them."""
    chains = chains_by_anchor(mod, providers, allow_tf32, found)
    runs = {anchor: next((o for o in offered if assignment.get(o.signature) == o.provider), None)
            for anchor, offered in chains.items()}
    absorbed = {b.var: o.provider for anchor, o in runs.items() if o is not None
                for b in o.bindings if not b.var.same_as(anchor)}
    taken_by: dict[tuple[str, str], str] = {}
    counts: dict[str, int] = {}
    for anchor, offered in chains.items():
        o = runs[anchor]
        winner = absorbed.get(anchor) or (o.provider if o is not None else provider_registry.TVM)
        counts[winner] = counts.get(winner, 0) + 1
        for offer in offered:
            taken_by.setdefault((offer.provider, offer.signature), winner)
    for t in timings:
        t.taken_by = taken_by.get((t.provider, t.signature), provider_registry.TVM)
    return counts


def not_taken_by_providers(report: OffloadReport) -> list[NotTaken]:
    """Each distinct reason an operator stayed on TVM's kernels, with how many did."""
    counts: dict[tuple[str, str], int] = {}
    for op, why in report.kept:
        counts[(op, why)] = counts.get((op, why), 0) + 1
    return [NotTaken(op, why, n) for (op, why), n in counts.items()]


def _with_gemm_algorithms(selection: Selection, session) -> Selection:
    """The selection with each cuBLASLt GEMM's algorithm measured (see :mod:`.gemm_algorithms`)."""
    selection.mod, selection.algorithms = choose_gemm_algorithms(selection.mod, session)
    return selection


def choose_providers(mod: tvm.IRModule, timings: list[KernelTiming], providers, allow_tf32: bool,
                     offers: dict | None = None, providers_only: bool = False) -> dict[str, str]:
    """signature -> the provider that takes its chains: per operator, the provider saving the most time
    against TVM's kernel for its own chain (none: TVM keeps it, and no signature of it is listed; with
    ``providers_only``, the fastest provider even where TVM's kernel measured faster).
    ``offers``: :func:`offers_by_anchor`'s, where the caller has them."""
    saving = {(t.provider, t.signature): t.tvm_ms - t.vendor_ms for t in timings}
    chosen: dict[str, str] = {}
    offers = offers_by_anchor(mod, providers, allow_tf32) if offers is None else offers
    for offered in offers.values():
        measured = [(saving[o], -order, *o) for order, o in enumerate(offered) if o in saving]
        if measured and (providers_only or max(measured)[0] >= 0):
            best = max(measured)
            chosen.setdefault(best[3], best[2])
    return chosen


def chains_by_anchor(mod: tvm.IRModule, providers, allow_tf32: bool, found: dict | None = None) -> dict:
    """anchor var -> the Offload of each of ``providers`` that takes the chain starting there, in the providers'
    order. ``found``: provider name -> its ``find_offloads`` in ``mod``, where the caller has them."""
    chains: dict = {}
    for p in providers:
        mine = found[p.name] if found is not None else find_offloads(mod["main"], allow_tf32=allow_tf32, providers=[p])
        for o in mine:
            chains.setdefault(o.anchor, []).append(o)
    return chains


def offers_by_anchor(mod: tvm.IRModule, providers, allow_tf32: bool, found: dict | None = None) -> dict:
    """anchor var -> [(provider, signature)] of each of ``providers`` that takes the chain starting there, in
    the providers' order (what the choice weighs)."""
    return {anchor: [(o.provider, o.signature) for o in offered]
            for anchor, offered in chains_by_anchor(mod, providers, allow_tf32, found).items()}
