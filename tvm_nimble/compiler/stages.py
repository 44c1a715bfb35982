"""The stages of a build, as plain functions: import, precision, offload, lower, schedule, generate.

    import_model -> apply_precision -> apply_layout -> [kernel choice: offload] -> lower -> schedule -> generate_kernels

``build_fixed`` strings the last three together for a module whose kernels are already chosen: it is
what the kernel choice (``kernel_choice``) builds its probes and model checks with, and what
``build`` finishes with. ``stream_choice`` and ``profile_report`` call :func:`schedule` directly to
re-plan the same kernels under another stream cap. The build session (``session.py``, ``build.py``) strings
the stages and the measured choices together.
"""
from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from dataclasses import dataclass, field

import tvm
import tvm_ffi

from tvm_nimble.codegen import dependent_launch
from tvm_nimble.errors import NimbleError
from tvm_nimble.codegen.kernels import build_kernels
from tvm_nimble.codegen.lower_plan import build_plan
from tvm_nimble.relay_passes.annotate import annotate_function
from tvm_nimble.relay_passes.concat_in_place import ATTR_CONCATS_IN_PLACE
from tvm_nimble.relay_passes.merge_siblings import ATTR_SPLITS_AS_VIEWS
from tvm_nimble.relay_passes.lowered_ir import LoweredProgram, read_lowered_function
from tvm_nimble.relay_passes.pipeline import kernel_passes, run_passes
from tvm_nimble.relay_passes.layout import to_nhwc
from tvm_nimble.relay_passes.precision import hoist_casts, to_precision
from tvm_nimble.relay_passes.rms_norm import fuse_rms_norm
from tvm_nimble.relay_passes.stream_assignment import StreamAssignment
from tvm_nimble.relay_passes.vendor_offload import OffloadReport, OffloadToVendor
from tvm_nimble.runtime.module import NimbleModule

from .options import BuildOptions
from .report import BuildReport
from .target import target_dict
from .tuning.database import database_applies, open_tuning_database


@dataclass
class BuildResult(NimbleModule):
    """A :class:`NimbleModule` (plan, kernels, params: what runs and exports) plus the stages' products and their
    typed :class:`~.report.BuildReport` (``report``). ``info`` is no field here: it is the report as the JSON dict
    an artifact keeps (:attr:`info`, read-only, kept for code written against the dict)."""

    info: dict = field(init=False, repr=False, compare=False)  # the read-only property set below the class
    report: BuildReport = field(default_factory=BuildReport)
    lowered: tvm.IRModule | None = None  # TVM kernel passes applied, before stream annotation
    program: LoweredProgram | None = None  # the kernel DAG read from ``lowered``
    assignment: StreamAssignment | None = None
    tvm_target: tvm.target.Target | None = None
    options: BuildOptions | None = None
    #: the structural hash of the Relax module the kernels were built from, taken before lowering (the build
    #: session's :meth:`~.session.BuildSession.module_hash`): what the stream choice's measurements are keyed by
    source_hash: str | None = None


def _info(result: BuildResult) -> dict:
    """``report.to_dict()``: the report as an artifact keeps it (what ``export`` writes). Read-only, for code
    written against the dict; read :attr:`BuildResult.report` instead."""
    return result.report.to_dict()


# a property cannot be a dataclass field's default: set once the dataclass is made (``info`` is init=False there)
BuildResult.info = property(_info, doc=_info.__doc__)


def import_model(model, params: dict | None = None, shape_dict: dict | None = None,
                 check: bool = True, weights: list | None = None) -> tvm.IRModule:
    """A Relax IRModule of ``model`` (an IRModule, an ONNX ModelProto or a path to a .onnx file), with
    ``params`` bound as constants; ``check=False``: an ONNX model checked already (see ``from_onnx``).
    ``weights``: ``model`` is ``weights_as_inputs``'s model, and these tensors are its lifted weights
    (:func:`bind_lifted_weights`; the importer's warning for each name it renames is left out)."""
    if not isinstance(model, tvm.IRModule):
        from tvm_nimble.compiler.frontend import from_onnx

        with warnings.catch_warnings():
            if weights is not None:  # TVM's importer warns of every input name with dots (to underscores)
                warnings.filterwarnings("ignore", message="Renaming name")
            model = from_onnx(model, shape_dict=shape_dict, check=check)
    if params:
        model = tvm.relax.transform.BindParams("main", params)(model)
    return model if weights is None else bind_lifted_weights(model, weights)


def bind_lifted_weights(mod: tvm.IRModule, weights: list) -> tvm.IRModule:
    """``mod`` (an import of ``weights_as_inputs``'s model) with its ``main``'s last ``len(weights)`` parameters, the
    lifted weights in their order, bound to ``weights`` (TVM tensors): several imports of one model at other input
    sizes (a generator's steps, a build's buckets) then hold the same weights, parsed and narrowed once."""
    if not weights:
        return mod
    params = list(mod["main"].params)[-len(weights):]
    for p, w in zip(params, weights):
        if tuple(int(d) for d in p.ty.shape.values) != tuple(w.shape) or str(p.ty.dtype) != str(w.dtype):
            raise NimbleError(f"internal: the imported model's parameter {p.name_hint} is not the weight bound to it")
    mod = tvm.relax.transform.BindParams("main", dict(zip(params, weights)))(mod)
    main = mod["main"]
    if main.attrs is not None and "num_input" in main.attrs:  # the importer's count of the model's own inputs
        mod["main"] = main.with_attr("num_input", len(main.params))
    return mod


def apply_precision(mod: tvm.IRModule, options: BuildOptions, narrowed_weights: dict | None = None) -> tvm.IRModule:
    """``mod`` computing in ``options.precision`` under its policy (inputs and outputs keep their dtypes), each
    spelled-out RMSNorm then one operator in the dtype the policy gave it (``relay_passes.rms_norm``);
    ``narrowed_weights``: see ``to_precision``."""
    return fuse_rms_norm(to_precision(mod, options.compute_dtype, options.policy, narrowed_weights=narrowed_weights))


def apply_layout(mod: tvm.IRModule, options: BuildOptions) -> tvm.IRModule:
    """``mod`` in the options' activation layout (``relay_passes.layout``; inputs and outputs keep theirs), each
    narrowing cast then in front of the data movement between it and its producer (``hoist_casts``: the layout
    change adds such movement, and the cast fuses into the producer's kernel there)."""
    mod = to_nhwc(mod) if options.data_layout == "nhwc" else mod
    return hoist_casts(mod) if options.compute_dtype != "float32" else mod


def vendor_library(target: tvm.target.Target, kernels=None) -> str:
    """The vendor extension (cuDNN/cuBLASLt) for the target's arch, built (cached) and loaded in this process:
    of the units defining ``kernels`` (function names or providers' prefixes; None: every unit)."""
    return _vendor_library(str(target.attrs["arch"]), None if kernels is None else frozenset(kernels))


class PendingLibrary:
    """The vendor extension of some kernels, being compiled in a background thread (its units' nvcc processes) while
    the caller does other work; :meth:`wait` gives what :func:`vendor_library` gives (loaded in this process)."""

    def __init__(self, target: tvm.target.Target, kernels):
        from concurrent.futures import ThreadPoolExecutor

        from tvm_nimble.codegen.vendor_build import build_vendor_library, units_compiled

        self.target, self.kernels = target, kernels
        arch = str(target.attrs["arch"])
        #: whether units had to be compiled (else nothing runs in the background: the link, if any, waits for wait())
        self.compiling = not units_compiled(arch, kernels)
        self._future = None
        self.waited_s = 0.0
        if self.compiling:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nimble-vendor")
            self._future = pool.submit(build_vendor_library, arch, kernels=kernels)
            pool.shutdown(wait=False)

    def wait(self) -> str:
        """The library's path, built and loaded; a failed build raises here its one line, as :func:`vendor_library`
        does (the build is made again in this thread, from the objects compiled so far). ``waited_s``: how long the
        caller waited here on the units compiling."""
        if self._future is not None:
            start = time.perf_counter()
            self._future.exception()  # (waits; an error is raised by the call below)
            self.waited_s = time.perf_counter() - start
        return vendor_library(self.target, self.kernels)


def one_vendor_library(modules: dict, target: tvm.target.Target) -> dict:
    """``modules`` (key -> built module: a bucketed model's buckets, a generator's steps) with one vendor extension
    between them, of the units any of their plans calls: an artifact holds one."""
    kernels = set().union(*(m.plan.vendor_kernels for m in modules.values() if m.vendor_library))
    if not kernels:
        return modules
    path = vendor_library(target, kernels)
    return {k: dataclasses.replace(m, vendor_library=path) if m.vendor_library else m for k, m in modules.items()}


@functools.lru_cache(maxsize=None)
def _vendor_library(arch: str, kernels: frozenset | None) -> str:
    """Once per arch, kernels and process: measuring needs it loaded, and artifacts package the same file."""
    from tvm_nimble.codegen.vendor_build import build_vendor_library
    from tvm_nimble.runtime.vendor import load_vendor_library

    path = build_vendor_library(arch, kernels=kernels)
    load_vendor_library(path)
    return path


def offload(mod: tvm.IRModule, options: BuildOptions, select=None, providers=None,
            report: OffloadReport | None = None, found_in_main=None) -> tvm.IRModule:
    """``mod`` with the chains that ``providers`` (default: the options' providers) take replaced by their
    calls; ``select(offload) -> bool`` keeps only some (see ``relay_passes.vendor_offload``); ``report``
    collects the operators no provider takes, with the reason. ``found_in_main``: ``find_offloads`` of
    ``mod["main"]`` with these arguments (and ``report``), where the caller has it."""
    providers = options.offload_providers() if providers is None else providers
    return OffloadToVendor(allow_tf32=options.allow_tf32, select=select, providers=providers, report=report,
                           found_in_main=found_in_main)(mod)


def lower(mod: tvm.IRModule, target: tvm.target.Target, tuning_database=None,
          concat_in_place: bool = True, split_views: bool = False) -> tvm.IRModule:
    """TVM's kernel passes (legalize, fuse, tuned database or DLight schedules, CallTIRRewrite), with
    concatenations built in place unless ``concat_in_place`` is off, and the contiguous parts of splits
    read in place with ``split_views`` (``relay_passes.pipeline``)."""
    return run_passes(kernel_passes(target, tuning_database, concat_in_place, split_views), mod, target,
                      tuning_database)


def schedule(lowered: tvm.IRModule, target: tvm.target.Target, *, max_streams: int | None = None,
             reuse: str = "concurrent", costs=None, program: LoweredProgram | None = None, params=None):
    """Stream assignment, annotation and the launch plan of a lowered module; ``costs`` (one per kernel
    of the lowered program) make a stream cap cost-aware; ``program``: ``lowered`` read already (another
    schedule of it; nothing changes it); ``params``: that other schedule's constants (its plan's, by name), reused.

    Returns (annotated module, program, assignment, plan, params)."""
    program = program if program is not None else read_lowered_function(lowered)
    func, assignment = annotate_function(lowered, max_streams=max_streams, program=program, costs=costs)
    annotated = lowered.clone()
    annotated["main"] = func
    plan, params = build_plan(annotated, target_dict(target), reuse=reuse, constants_of=params)
    return annotated, program, assignment, plan, params


def generate_kernels(annotated: tvm.IRModule, target: tvm.target.Target):
    """The compiled kernel library of a scheduled module."""
    return build_kernels(annotated, target)


#: element-wise operators through which an index input keeps its meaning (the ONNX importer wraps
#: negative indices with less/where/add before the take)
_INDEX_PRESERVING = {"relax.astype", "relax.add", "relax.where", "relax.clip", "relax.maximum", "relax.minimum"}


def index_bounds(mod: tvm.IRModule) -> dict[str, int]:
    """Inputs of ``main`` used as indices of a ``take`` (ONNX Gather), directly or through element-wise
    arithmetic: input name -> the size of the indexed axis. The executor checks them unless
    ``check_inputs=False``."""
    from tvm import relax

    func = mod["main"]
    origin = {p: p.name for p in func.params}  # var -> the input its values come from
    bounds: dict[str, int] = {}
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)):
                continue
            if v.op.name == "relax.take":
                data, idx = v.args
                name = origin.get(idx)
                shape = data.ty.shape if isinstance(data.ty, relax.TensorType) else None
                if name and shape is not None:
                    axis = int(v.attrs.axis) if v.attrs.axis is not None else 0
                    size = int(shape.values[axis % len(shape.values)])
                    bounds[name] = min(size, bounds.get(name, size))
            elif v.op.name in _INDEX_PRESERVING:
                names = {origin[a] for a in v.args if a in origin}
                if len(names) == 1:
                    origin[b.var] = names.pop()
    return bounds


def note_default_schedules(mod: tvm.IRModule, options: BuildOptions, note, database=None) -> None:
    """Say (``note``, the session's) when CUDA kernels get TVM's default schedules: no tuning database, or none of
    its records applies to ``mod`` (the user's build says so, not its probes)."""
    if database is None and options.tuning_db:
        database = open_tuning_database(options.tuning_db)
    if database is None and options.is_cuda and options.compile_kernels:
        note("building CUDA kernels without a tuning database: kernels use TVM's default "
                  "schedules (several times slower than tuned ones); see `tvm-nimble tune`", stacklevel=5)
    if database is not None and not database_applies(database, mod, options.target):
        note(f"nothing in the tuning database {options.tuning_db} applies to this model (none of its kernels "
                  "is in it: another model, shape, precision or target?); kernels use TVM's default schedules. "
                  "Tune this model with `tvm-nimble tune`", stacklevel=5)


def build_fixed(mod: tvm.IRModule, options: BuildOptions, session=None, final: bool = False) -> BuildResult:
    """Lower, schedule and (unless ``options.compile_kernels`` is off) generate ``mod`` as it is: its
    kernels are chosen already (vendor calls in it stay, everything else gets TVM's kernels). A
    ``max_streams`` of ``"auto"`` schedules the widest here; choosing a cap is ``stream_choice``'s.
    ``session``: the build session the module is built in (it hashes ``mod`` before lowering; None: a build of
    its own, e.g. the ``nimble`` TVM pipeline's). ``final``: the user's build, not a probe: it notes once when
    CUDA kernels get TVM's default schedules, times "lower", "schedule" and "generate" in the session's phases,
    and loads the lowered module and the kernel library from the session's compiled-kernel cache (the time to
    load them counted as "lower" and "generate"), or keeps them there."""
    t = options.target
    source_hash = session.module_hash(mod) if session is not None else str(tvm_ffi.structural_hash(mod))
    timed = session.phases if final else _untimed
    cache = session.kernel_cache(options) if final else None
    database = open_tuning_database(options.tuning_db) if options.tuning_db else None
    if final:
        note_default_schedules(mod, options, session.note, database)
    with timed("lower"):
        key = session.key("kernels", mod, options) if cache is not None else None
        hit = cache.load(key, t) if cache is not None else None
        # a merged build's splits read in place: Nimble's memory plan sees the views (merge="off" keeps the
        # lowering exactly as before, e.g. for the nimble TVM pipeline, whose module the Relax VM also runs)
        lowered = hit.lowered if hit else lower(mod, t, database, options.concat_in_place,
                                                split_views=options.merge != "off")
    cap = None if options.max_streams == "auto" else options.max_streams
    with timed("schedule"):
        annotated, program, assignment, plan, consts = schedule(lowered, t, max_streams=cap, reuse=options.reuse)
        plan.index_bounds = index_bounds(mod)
    with timed("generate"):
        # the kernels do not depend on the schedule: the cached library is the one this module's would be
        library = hit.library if hit else generate_kernels(annotated, t) if options.compile_kernels else None
        stored = cache is not None and hit is None and library is not None and cache.store(key, lowered, library)
    # its TVM kernels wait for the ones before them (generate_kernels: on sm_90+), so the graph may overlap them
    plan.dependent_launch = library is not None and dependent_launch.supported(t)
    attrs = lowered["main"].attrs
    report = BuildReport.of_build(
        options, int(attrs.get(ATTR_CONCATS_IN_PLACE, 0)) if options.concat_in_place else 0,
        int(attrs.get(ATTR_SPLITS_AS_VIEWS, 0)) if options.merge != "off" else None,
        kernel_cache=None if cache is None else "hit" if hit else "stored" if stored else "miss")
    # the extension is compiled code too: a build that stops before code generation (explain's) neither waits on
    # nvcc for it nor needs its toolchain
    uses_vendor = options.is_cuda and plan.uses_vendor_kernels and options.compile_kernels
    return BuildResult(plan, library, consts, annotated,
                       vendor_library(t, plan.vendor_kernels) if uses_vendor else None, report=report,
                       lowered=lowered, program=program, assignment=assignment, tvm_target=t, options=options,
                       source_hash=source_hash)


def _untimed(_phase: str):
    import contextlib

    return contextlib.nullcontext()
