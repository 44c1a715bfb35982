"""One build as one session: its options, target, timer, cache, notes and phase times, and the stages it runs.

    session = BuildSession(options)             # the timer made once from the options (local GPU or RPC)
    result = session.build(model, params, shape_dict)

:data:`STAGES` run in order: import -> precision -> layout -> merge -> kernels -> build -> streams -> accuracy.
Every measured choice (the merge check, each provider's chains and cuBLASLt's GEMM algorithms, the whole-model
check, the stream choice, the accuracy report's float32 reference) asks the session for its measurement through
:meth:`BuildSession.measured`, under a key made by the one key function :meth:`BuildSession.key`; the compiled-kernel
cache keys its entries with the same function. Like Triton's compile options whose hash is the cache key, a key is
made of:

- the kind of measurement (``chain``, ``gemm``, ``model_check``, ``merge_check``, ``launch_ms``, ``replay_ms``,
  ``stream_choice``, ``fp32_reference``, ``kernels``);
- the fields of the options that change that kind's result (:data:`KEY_FIELDS`; the tuning database by the digest
  of its files);
- the structural hash of the module measured, taken the first time the session sees that module object, before
  anything lowers it (:meth:`BuildSession.module_hash`: lowering fills parts of a module in place, which changes
  its hash), plus what else the measurement names (a chain's signature, a plan's digest, repetitions);
- the identity of the GPU that measured it (the timer's fingerprint; a compiled kernel depends on no GPU, its
  target's arch is in the context);
- the context: the entry format, TVM's version, a digest of tvm-nimble's sources, the target.

What a session measured or read stays in its :class:`CacheMemory`, in memory; a caller that builds several times
in one process (a benchmark) passes one on. On disk the entries are :mod:`.timing_cache`'s and
:mod:`.kernel_cache`'s files. Nothing here is process-global: two sessions with different GPUs, or different
cache directories, never see each other's entries unless they share a :class:`CacheMemory`, and then only under
their own keys.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from functools import cached_property

import tvm
import tvm_ffi

from . import timing_cache
from .build_stages import STAGES, run_stages
from .kernel_cache import KernelCache
from .notes import Notes
from .options import BuildOptions
from .report import PHASES
from .timers import has_gpu_for, timer_for

#: the options each kind of measurement depends on (besides the target, in every key's context); what the
#: lowered module and kernels depend on: the tuning database, concatenations in place, split views (merge)
_KERNEL_FIELDS = ("tuning_db", "concat_in_place", "merge")
KEY_FIELDS = {
    "chain": ("precision", "allow_tf32", "tuning_db"),
    "gemm": (),
    "model_check": (*_KERNEL_FIELDS, "reuse"),
    "merge_check": (*_KERNEL_FIELDS, "reuse"),
    "launch_ms": _KERNEL_FIELDS,
    "replay_ms": _KERNEL_FIELDS,
    "stream_choice": _KERNEL_FIELDS,
    "fp32_reference": (),
    "kernels": _KERNEL_FIELDS,
}
#: the kinds whose result does not depend on the GPU it was made for beyond the target (compiled kernels)
_GPU_FREE = frozenset({"kernels"})


def _option_value(options: BuildOptions, name: str):
    if name == "tuning_db":
        return timing_cache.tuning_db_digest(options.tuning_db)
    if name == "merge":
        return options.merge != "off"  # what lowering sees: splits read in place
    return getattr(options, name)


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class CacheKey:
    """What one cached result depends on (see the module docstring). ``what``: the options' fields, the module's
    hash and the rest, as JSON; ``gpu``: the measuring GPU's fingerprint ({} for compiled kernels; an unidentified
    GPU's ``{"unidentified": where}``, kept in memory only); ``context``: format, TVM, code, target."""

    kind: str
    what: dict
    gpu: dict
    context: dict
    #: whether the entry may be kept on disk (a GPU without a fingerprint: nothing would tell its entries apart)
    persistent: bool = True

    @cached_property
    def digest(self) -> str:
        """The content address: of everything the key holds."""
        return hashlib.sha256(_canonical([self.kind, self.what, self.gpu, self.context]).encode()).hexdigest()[:40]


@dataclass
class CacheMemory:
    """What sessions measured or read (by key digest), and the compiled-kernel cache's counts: one per session,
    unless a caller that builds several times in one process passes one on."""

    values: dict = field(default_factory=dict)
    #: entries loaded ("hit"), builds that found none ("miss"), entries written ("stored"), entries ignored as
    #: unreadable or foreign ("rejected")
    kernels: dict = field(default_factory=lambda: {"hit": 0, "miss": 0, "stored": 0, "rejected": 0})
    #: weights narrowed to a reduced precision, by source tensor (``relay_passes.precision.NarrowedWeights``): the
    #: steps of a generator bind the same weights, and narrow them once
    narrowed: dict = field(default_factory=dict)
    #: the compiled-kernel cache's weights this session loaded, by sha256 (the buckets and steps of a model share them)
    weights: dict = field(default_factory=dict)


class Phases:
    """``with phases("lower"): ...`` adds the block's seconds to that phase; ``on_phase(name)`` (the CLI's progress
    line) is told each phase's name as it begins."""

    def __init__(self, on_phase=None):
        self.seconds: dict[str, float] = {}
        self.on_phase = on_phase

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.on_phase is not None:
            self.on_phase(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def rounded(self) -> dict[str, float]:
        """The seconds of each phase run, to the millisecond, in :data:`~.report.PHASES` order (the report's)."""
        return {name: round(self.seconds[name], 3) for name in PHASES if name in self.seconds}


class BuildSession:
    """The options (frozen), the target, the timer (made once: ``timer`` or the options' RPC tracker's GPU or this
    machine's), the cache (``memory`` shared with other sessions where the caller passes one), the notes and the
    phase times of one build. :meth:`with_options` is the same session with other options (the buckets of a
    bucketed build, a layout fallback): the same timer, cache, notes, phases and module hashes."""

    def __init__(self, options: BuildOptions, timer=None, memory: CacheMemory | None = None, on_phase=None):
        self.options = options
        self.notes = Notes()
        self.timer = timer if timer is not None else timer_for(options.rpc_tracker, options.rpc_key, note=self.notes)
        self.memory = memory if memory is not None else CacheMemory()
        self.phases = Phases(on_phase)
        self._hashes: dict[int, tuple] = {}  # id(module) -> (module, its structural hash when first seen)
        self._disk: dict[str, timing_cache.TimingCache] = {}  # (gpu, context) digest -> its files

    @property
    def target(self) -> tvm.target.Target:
        return self.options.target

    def with_options(self, options: BuildOptions) -> "BuildSession":
        other = object.__new__(BuildSession)
        other.__dict__.update(self.__dict__)
        other.options = options
        return other

    def bucket(self, options: BuildOptions) -> "BuildSession":
        """The session of one bucket of a bucketed build: :meth:`with_options`, with phase times of its own."""
        other = self.with_options(options)
        other.phases = Phases(self.phases.on_phase)
        return other

    def note(self, text: str, stacklevel: int = 3) -> None:
        self.notes(text, stacklevel + 1)

    # ---- the one key ------------------------------------------------------------------------------------------
    def module_hash(self, mod: tvm.IRModule) -> str:
        """``mod``'s structural hash, taken the first time this session sees the module object (the stages hash a
        module before they lower it: lowering changes the hash in place)."""
        known = self._hashes.get(id(mod))
        if known is None or known[0] is not mod:
            known = self._hashes[id(mod)] = (mod, str(tvm_ffi.structural_hash(mod)))
        return known[1]

    def remember_hash(self, mod: tvm.IRModule, source_hash: str | None) -> None:
        """Take ``source_hash`` as ``mod``'s hash where this session has not seen ``mod``: the hash another session
        took of it before lowering it (a :class:`~.kernel_choice.Selection`'s build, made where it was chosen)."""
        if source_hash is not None and self._hashes.get(id(mod), (None,))[0] is not mod:
            self._hashes[id(mod)] = (mod, source_hash)

    def key(self, kind: str, mod: tvm.IRModule | None = None, options: BuildOptions | None = None,
            **what) -> CacheKey:
        """The key of a ``kind`` measurement (or compiled-kernel entry) of ``mod`` made with ``options`` (default:
        the session's); ``what``: whatever else names it (a signature, a plan's digest, repetitions)."""
        options = options or self.options
        parts = {name: _option_value(options, name) for name in KEY_FIELDS[kind]}
        if mod is not None:
            parts["module"] = self.module_hash(mod)
        parts.update(what)
        if kind in _GPU_FREE:
            gpu, persistent = {}, True
        else:
            fingerprint = self.gpu_identity
            gpu, persistent = fingerprint or {"unidentified": self.timer.where}, bool(fingerprint)
        return CacheKey(kind, json.loads(_canonical(parts)), gpu, timing_cache.context_of(options.target), persistent)

    @cached_property
    def gpu_identity(self) -> dict:
        """The timer's fingerprint, asked once (a remote GPU's through RPC)."""
        return json.loads(_canonical(self.timer.fingerprint()))

    # ---- the cache ---------------------------------------------------------------------------------------------
    def cached(self, key: CacheKey, valid=None):
        """The value kept under ``key`` (in memory, else on disk), or None."""
        if key.digest in self.memory.values:
            return self.memory.values[key.digest]
        files = self._files(key)
        value = files.get(key.kind, key.what, valid) if files is not None else None
        if value is not None:
            self.memory.values[key.digest] = value
        return value

    def keep(self, key: CacheKey, value) -> None:
        """Keep ``value`` (JSON) under ``key``: in memory, and on disk when the session has a directory."""
        value = json.loads(_canonical(value))
        self.memory.values[key.digest] = value
        files = self._files(key)
        if files is not None:
            files.put(key.kind, key.what, value)

    def measured(self, key: CacheKey, measure, valid=None):
        """The value kept under ``key``, else ``measure()``'s, kept there."""
        value = self.cached(key, valid)
        if value is None:
            value = measure()
            self.keep(key, value)
            value = self.memory.values[key.digest]
        return value

    def _files(self, key: CacheKey) -> timing_cache.TimingCache | None:
        directory = self.options.timing_cache
        if directory is None or not key.persistent:
            return None
        at = _canonical([directory, key.gpu, key.context])
        if at not in self._disk:
            self._disk[at] = timing_cache.TimingCache(directory, key.gpu, key.context, note=self.notes)
        return self._disk[at]

    def kernel_cache(self, options: BuildOptions | None = None) -> KernelCache | None:
        """The compiled-kernel cache of a build with ``options`` (default: the session's), or None when it keeps
        none (no timing-cache directory, ``kernel_cache`` off, or no kernels compiled)."""
        options = options or self.options
        if not options.timing_cache or not options.kernel_cache or not options.compile_kernels:
            return None
        return KernelCache(os.path.join(options.timing_cache, timing_cache.KERNELS_FOLDER), self.memory.kernels,
                           self.notes, self.memory.weights)

    # ---- where measurements run --------------------------------------------------------------------------------
    def can_measure(self, target: tvm.target.Target | None = None) -> bool:
        """Whether the timer has a GPU of ``target``'s (default: the session's) arch to measure on."""
        return has_gpu_for(self.timer, target or self.target)

    @property
    def measuring_here(self) -> bool:
        """Whether the timer is this machine's GPU (not an RPC server's)."""
        from .timers import LocalGPU

        return isinstance(self.timer, LocalGPU)

    # ---- the stages --------------------------------------------------------------------------------------------
    def build(self, model, params: dict | None = None, shape_dict: dict | None = None, reference=None):
        """:data:`STAGES` on ``model`` (see ``tvm_nimble.build``): a BuildResult. ``reference``: its float32
        reference compiling in a child already (:func:`.accuracy.start_reference`)."""
        return run_stages(self, model, params, shape_dict, reference)
