"""``BuildOptions``: every option of a build, validated once, carried as one object.

``build(model, target, **options)``, ``explain_model``, the command line, the ``nimble`` TVM pipeline
and the benchmarks all make one of these (:meth:`BuildOptions.create`), so an option is spelled,
defaulted and checked in one place. A bad value is a :class:`NimbleError` of one line naming the
option and the values it takes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import tvm

from tvm_nimble.codegen.lower_plan import REUSE_MODES
from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes import providers as provider_registry
from tvm_nimble.relay_passes.kv_cache import KvCacheSpec
from tvm_nimble.relay_passes.layout import LAYOUTS
from tvm_nimble.relay_passes.precision import PRECISIONS, Policy, precision_name

from .target import resolve_target
from .timing_cache import default_directory, directory_option

#: ``kernels``: the providers' kernels where they apply (``vendor``), TVM's only (``tvm``), each operator on
#: whichever measured fastest (``best``), or ``auto`` (see :func:`.kernel_choice.resolve_kernels`)
KERNEL_CHOICES = ("auto", "tvm", "vendor", "best")
#: ``merge``: sibling convolutions / GEMMs of one input kept separate (``off``), merged into one operator each
#: (``on``), or merged where that measured faster than separate and concurrent (``auto``, see
#: :mod:`.merge_choice`)
MERGE_CHOICES = ("off", "on", "auto")


@dataclass(frozen=True)
class BuildOptions:
    """What a build does; the model (and its params and input shapes) is not part of it.

    - ``target``: a ``tvm.target.Target`` (``create`` resolves 'cuda', 'llvm' and dicts).
    - ``kernels``: see :data:`KERNEL_CHOICES`; ``providers``: the kernel providers other than TVM that may
      take operators (default: every registered one for the target that is used by default, see
      ``relay_passes.providers``; ``("+NAME",)``: those and NAME, e.g. ``("+tf32x3",)``).
    - ``precision``: ``fp32`` (default), ``tf32`` (fp32 with TF32 tensor cores in cuDNN/cuBLASLt, about
      1e-3 error; the same as ``allow_tf32=True``), ``fp16`` or ``bf16`` (the mixed-precision policy of
      :mod:`relay_passes.precision`; ``keep_fp32`` names more operators to keep in float32, e.g.
      ``("matmul",)``). Inputs and outputs keep the model's dtypes. ``max_error``: the largest relative L2
      error against the fp32 model a reduced-precision build may have (measured on seeded inputs).
    - ``layout``: the activations' layout inside the build: ``nchw`` (the model's), ``nhwc`` (convolutions,
      pools and what runs between them channels-last, for cuDNN's tensor-core kernels; inputs and outputs keep the
      model's layout), or ``auto`` (default: NHWC for tf32, fp16 and bf16 CUDA builds, see :attr:`data_layout`).
    - ``max_streams``: an integer cap, None (Nimble's widest schedule) or ``"auto"`` (the fastest cap,
      measured). ``memory_budget``: bytes the concurrency-safe pool may take. ``reuse``: the memory plan
      (``concurrent`` is the only safe one for several streams).
    - ``merge``: see :data:`MERGE_CHOICES` (``relay_passes.merge_siblings``).
    - ``tuning_db``: a MetaSchedule database directory. ``concat_in_place``: branch kernels write into
      their slice of a concatenation. ``compile_kernels``: False stops before code generation (the vendor
      extension is not built either).
    - ``rpc_tracker`` / ``rpc_key``: measure on a GPU behind TVM's RPC tracker instead of this machine's.
    - ``timing_cache``: the directory where what ``best`` and ``auto`` measure is kept for later builds on
      the same GPU (see :mod:`.timing_cache`; default under the user's cache directory), None or ``"off"``
      to keep nothing. ``kernel_cache``: also keep the build's lowered module and compiled kernels there, so a
      second build of the same model loads them instead of lowering and compiling again (see
      :mod:`.kernel_cache`; on by default, nothing without a timing-cache directory).
    - ``kv_cache``: a :class:`~tvm_nimble.relay_passes.kv_cache.KvCacheSpec`: the model is a decoder exported with
      past key/values, built as one step of generation whose cache is state updated in place (rewritten right after
      the precision pass; ``tvm_nimble.build_generator`` sets it per step).
    - ``batch_sizes``: build one plan per batch size (a bucket) into one module that serves any batch
      (see :mod:`.buckets`); None: the model's own batch.
    - ``buckets``: build one plan per combination of sizes of the ONNX model's named dimensions (its
      dim_params), e.g. ``{"sequence_length": [16, 32, 64]}`` or ``{"batch": [1, 2], "sequence_length":
      [16, 32]}``, into one module that serves any extent up to the largest (see :mod:`.buckets`); kept as
      ((name, sizes), ...) in the order given. ``batch_sizes`` is buckets over the leading dimension of every
      input; give one or the other.
    """

    target: tvm.target.Target
    kernels: str = "auto"
    providers: tuple[str, ...] | None = None
    precision: str = "fp32"
    allow_tf32: bool = False
    keep_fp32: tuple[str, ...] = ()
    max_error: float | None = None
    layout: str = "auto"
    max_streams: int | str | None = "auto"
    memory_budget: int | None = None
    reuse: str = "concurrent"
    tuning_db: str | None = None
    concat_in_place: bool = True
    merge: str = "off"
    compile_kernels: bool = True
    rpc_tracker: str | None = None
    rpc_key: str | None = None
    batch_sizes: tuple[int, ...] | None = None
    buckets: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    timing_cache: str | None = dataclasses.field(default_factory=default_directory)
    kernel_cache: bool = True
    kv_cache: KvCacheSpec | None = None

    @classmethod
    def create(cls, target="llvm", **options) -> "BuildOptions":
        """Options from keywords, each checked; an unknown keyword is an error naming the known ones."""
        known = {f.name for f in dataclasses.fields(cls)} - {"target"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise NimbleError(f"unknown build option {unknown[0]!r}; the options are {', '.join(sorted(known))}")
        return cls(target=resolve_target(target), **options)

    def __post_init__(self):
        if not isinstance(self.target, tvm.target.Target):
            object.__setattr__(self, "target", resolve_target(self.target))
        _check(self.kernels in KERNEL_CHOICES, "kernels", self.kernels, f"one of {KERNEL_CHOICES}")
        if self.kernels in ("vendor", "best") and not self.is_cuda:
            raise NimbleError(f"kernels={self.kernels!r} (cuDNN / cuBLAS and our kernels) need a CUDA target; use "
                              f"kernels='tvm' for {self.target.kind.name}")
        _check(self.merge in MERGE_CHOICES, "merge", self.merge, f"one of {MERGE_CHOICES}")
        _check(self.layout in LAYOUTS, "layout", self.layout, f"one of {LAYOUTS}")
        if self.providers is not None:
            given = (self.providers,) if isinstance(self.providers, str) else tuple(self.providers)
            added = [p for p in given if p.startswith("+")]
            if added:  # "+NAME": the providers used by default, and NAME
                _check(len(added) == len(given), "providers", given, "names, or '+NAME's added to the default "
                       "ones, not both")
                given = tuple(p.name for p in provider_registry.offloading(self.target.kind.name)) + tuple(
                    p[1:] for p in added)
            others = tuple(n for n in provider_registry.names() if n != provider_registry.TVM)
            bad = [p for p in given if p not in others]
            _check(not bad, "providers", bad[0] if bad else None, f"names among {others}")
            object.__setattr__(self, "providers", given)
        try:
            precision = precision_name(self.precision)
        except (ValueError, TypeError):
            raise NimbleError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}") from None
        if precision == "fp32" and self.allow_tf32:
            precision = "tf32"
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "allow_tf32", precision == "tf32")
        keep = (self.keep_fp32,) if isinstance(self.keep_fp32, str) else tuple(self.keep_fp32)
        try:
            Policy().with_fp32(keep)
        except ValueError as err:
            raise NimbleError(str(err)) from None
        object.__setattr__(self, "keep_fp32", keep)
        me = self.max_error
        _check(me is None or (isinstance(me, (int, float)) and not isinstance(me, bool) and me > 0), "max_error", me,
               "a positive number (the largest relative L2 error against fp32)")
        ms = self.max_streams
        _check(ms is None or ms == "auto" or (isinstance(ms, int) and not isinstance(ms, bool) and ms >= 1),
               "max_streams", ms, "an integer >= 1, None or 'auto'")
        mb = self.memory_budget
        _check(mb is None or (isinstance(mb, int) and mb > 0), "memory_budget", mb, "a positive number of bytes")
        _check(self.reuse in REUSE_MODES, "reuse", self.reuse, f"one of {REUSE_MODES}")
        object.__setattr__(self, "batch_sizes", _batch_sizes(self.batch_sizes))
        object.__setattr__(self, "buckets", _buckets(self.buckets))
        if self.batch_sizes and self.buckets:
            raise NimbleError("give batch_sizes or buckets, not both: batch_sizes=[...] is buckets over the leading "
                              "dimension; to bucket it with other dimensions, name it in buckets (e.g. "
                              "buckets={'batch': [1, 2], 'sequence_length': [16, 32]})")
        object.__setattr__(self, "timing_cache", directory_option(self.timing_cache))
        _check(isinstance(self.kernel_cache, bool), "kernel_cache", self.kernel_cache, "True or False")
        _check(self.kv_cache is None or isinstance(self.kv_cache, KvCacheSpec), "kv_cache", self.kv_cache,
               "None or a relay_passes.kv_cache.KvCacheSpec (tvm_nimble.build_generator makes them)")
        if (self.rpc_tracker is None) != (self.rpc_key is None):
            raise NimbleError("measuring through an RPC tracker needs both the tracker (HOST:PORT) and the key "
                              "its servers registered under (--rpc-tracker and --rpc-key)")

    def replace(self, **changes) -> "BuildOptions":
        return dataclasses.replace(self, **changes)

    @property
    def compute_dtype(self) -> str:
        """The dtype reduced-precision operators compute in: float32 for fp32 and tf32."""
        return PRECISIONS[self.precision][0]

    @property
    def policy(self) -> Policy:
        """The mixed-precision policy, with ``keep_fp32``'s operators in float32."""
        return Policy().with_fp32(self.keep_fp32) if self.keep_fp32 else Policy()

    @property
    def data_layout(self) -> str:
        """``nchw`` or ``nhwc``: ``layout``, where ``auto`` means NHWC for tensor-core builds (tf32, fp16, bf16) whose
        convolutions may go to cuDNN, NCHW otherwise: cuDNN's tensor-core convolutions read channels-last data, while
        exact fp32 (FMA kernels) is slower in NHWC (see benchmarks/findings.md, 'Channels-last builds: every
        tensor-core precision')."""
        if self.layout != "auto":
            return self.layout
        tensor_cores = self.precision != "fp32"
        return "nhwc" if tensor_cores and self.is_cuda and self.kernels != "tvm" else "nchw"

    @property
    def is_cuda(self) -> bool:
        return self.target.kind.name == "cuda"

    @property
    def arch(self) -> str | None:
        return str(self.target.attrs["arch"]) if self.is_cuda else None

    def offload_providers(self) -> list:
        """The registered providers other than TVM this build may use, in the order they claim operators."""
        return provider_registry.offloading(self.target.kind.name, self.providers)


def _batch_sizes(value) -> tuple[int, ...] | None:
    """``batch_sizes`` as a sorted tuple of distinct positive ints (None or empty: the model's own batch)."""
    if value is None or (not isinstance(value, str) and hasattr(value, "__len__") and len(value) == 0):
        return None
    sizes = _sizes_of(value)
    _check(sizes is not None, "batch_sizes", value, "a list of positive batch sizes such as [1, 2, 4, 8]")
    return sizes


_BUCKETS_EXAMPLE = "a mapping of dimension names to sizes such as {'sequence_length': [16, 32, 64]}"


def _buckets(value) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """``buckets`` as ((dimension name, sorted distinct positive sizes), ...) in the order given (None or empty:
    no buckets). Takes a mapping, (name, sizes) pairs, or ``"name=16,32"`` strings (the command line's)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    pairs = []
    try:
        items = value.items() if hasattr(value, "items") else list(value)
    except TypeError:
        items = None
    _check(items is not None, "buckets", value, _BUCKETS_EXAMPLE)
    for item in items:
        if isinstance(item, str):
            name, sep, sizes = item.partition("=")
            _check(bool(sep), "buckets", item, "NAME=N,N,... such as sequence_length=16,32,64")
            item = (name.strip(), sizes)
        _check(isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str) and item[0] != "",
               "buckets", value, _BUCKETS_EXAMPLE)
        name, sizes = item
        parsed = _sizes_of(sizes)
        _check(bool(parsed), f"buckets[{name!r}]", sizes, "a list of positive sizes such as [16, 32, 64]")
        if name in dict(pairs):
            raise NimbleError(f"buckets names dimension {name!r} twice: give each dimension's sizes once, e.g. "
                              f"{name}={','.join(map(str, sorted(set(dict(pairs)[name]) | set(parsed))))}")
        pairs.append((name, parsed))
    return tuple(pairs) or None


def _sizes_of(value) -> tuple[int, ...] | None:
    """``value`` (a list of ints or ``"16,32"``) as sorted distinct positive ints; None when it is not one."""
    sizes = value.split(",") if isinstance(value, str) else value
    try:
        sizes = [int(s) if isinstance(s, str) else s for s in sizes]
    except (TypeError, ValueError):
        return None
    if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
        return None
    return tuple(sorted(set(sizes)))


def _check(ok: bool, name: str, value, expected: str) -> None:
    if not ok:
        raise NimbleError(f"{name} must be {expected}, got {value!r}")
