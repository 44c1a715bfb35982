"""The compiler side's uses of TVM's private or unstable API, and nothing else.

Each function wraps one such use and says in one line why no public API does. They are pinned to
apache-tvm 0.27.0.post1 (see pyproject.toml); when TVM changes one of these internals, this file is the
one to update. What the project builds on them lives with its callers: the guarded DLight schedules in
``relay_passes.schedules``, the split CUDA compile in ``codegen.cuda_split``, tuning in
``tvm_nimble.compiler.tuning``. The runtime has its own, ``tvm_nimble.runtime.tvm_compat`` (the runtime never
imports the compiler side); ``tests/test_layout.py`` checks that no other module uses TVM's private API.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import json
import logging
import marshal
import os
import sys
import tempfile
import types

from tvm_nimble import env

# TVMScript's decorator modules; each calls ``inspect.stack()`` once per parsed function.
_TIR_ENTRY = "tvm.tirx.script.parser.entry"
_TVMSCRIPT_ENTRIES = (_TIR_ENTRY, "tvm.script.parser.ir.entry")
TENSOR_INTRIN = "tvm.s_tir.tensor_intrin"


def _cheap_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` as TVMScript's decorators use it: every frame, source lines for the nearest three.

    ``inspect.stack()`` resolves the module of every frame on the stack, and for a frame
    without a source file (the ``<frozen importlib._bootstrap>`` frames of an import) that
    scans all of ``sys.modules``. TVMScript's decorators read ``.frame`` of the outer frames
    and ``code_context``/``lineno`` of ``stack[2]`` only, so deeper frames skip that lookup
    (their ``code_context`` is None).
    """
    frame, infos = sys._getframe(1), []
    while frame is not None:
        if len(infos) < 3:
            tb = inspect.getframeinfo(frame, context)
            extra = {"positions": tb.positions} if hasattr(tb, "positions") else {}  # Python >= 3.11
            infos.append(inspect.FrameInfo(frame, *tb[:5], **extra))
        else:
            code = frame.f_code
            infos.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
        frame = frame.f_back
    return infos


class _CheapStackInspect:
    """``inspect`` as TVMScript's decorator modules see it inside :func:`cheap_tvmscript_stacks`."""

    stack = staticmethod(_cheap_stack)

    def __getattr__(self, name):
        return getattr(inspect, name)


class _Unstable(Exception):
    """A value whose text is not the same in every process (an object's address): its parse is not cached."""


def _stable(value, depth: int = 0) -> str:
    """``value`` as text that is the same in every process that made an equal value (see :class:`_ParseCache`)."""
    if depth > 8:
        raise _Unstable
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}({','.join(_stable(v, depth + 1) for v in value)})"
    if isinstance(value, dict):
        return "dict(" + ",".join(f"{_stable(k, depth + 1)}:{_stable(v, depth + 1)}" for k, v in
                                  sorted(value.items(), key=lambda kv: repr(kv[0]))) + ")"
    if isinstance(value, types.ModuleType):
        return f"module({value.__name__})"
    if isinstance(value, types.FunctionType):  # its code, closure and defaults (its globals: the module's source)
        try:
            cells = [c.cell_contents for c in value.__closure__ or ()]
        except ValueError:  # an empty cell
            raise _Unstable from None
        code = hashlib.sha256(marshal.dumps(value.__code__)).hexdigest()
        return f"fn({value.__module__}.{value.__qualname__},{code},{_stable(cells, depth + 1)}," \
               f"{_stable(value.__defaults__, depth + 1)})"
    if type(value).__module__.split(".")[0] in ("tvm", "tvm_ffi"):
        import tvm

        try:  # a TVM object: its JSON (every field, no address)
            return f"{type(value).__name__}({tvm.ir.save_json(value)})"
        except Exception:  # noqa: BLE001  (not an Object: a dtype, a device)
            text = str(value)
        if " at 0x" in text or "object at" in text:
            raise _Unstable
        return f"{type(value).__name__}({text})"
    raise _Unstable


class _ParseCache:
    """TVMScript functions parsed once per machine: what :func:`cheap_tvmscript_stacks` parses is kept as TVM's
    JSON in one file per TVM and Python version, under a key of the function's module source (its globals), its
    own source, its annotations as evaluated where it was defined (``T.Buffer((4,), dtype_a)``: a TVM object of the
    enclosing scope's values), its defaults, and the values it captures from enclosing scopes (closure cells, the
    annotation names TVMScript resolves from outer frames), which must all print the same in every process (else
    the parse is not kept)."""

    def __init__(self, path: str):
        self.path, self.new, self.hits = path, {}, 0
        try:
            with open(path, encoding="utf-8") as f:
                self.entries = json.load(f)
        except (OSError, ValueError):
            self.entries = {}
        if not isinstance(self.entries, dict):
            self.entries = {}
        self._sources: dict = {}

    def key(self, func, extra_vars: dict, kwargs: dict) -> str | None:
        try:
            globals_ = func.__globals__
            captured = {name: value for name, value in extra_vars.items()
                        if not (name in globals_ and globals_[name] is value)}
            file = inspect.getsourcefile(func)
            if file not in self._sources:
                with open(file, "rb") as f:
                    self._sources[file] = hashlib.sha256(f.read()).hexdigest()
            text = "\0".join([func.__module__, func.__qualname__, self._sources[file], inspect.getsource(func),
                               _stable(captured), _stable(kwargs), _stable(dict(func.__annotations__)),
                               _stable(func.__defaults__), _stable(func.__kwdefaults__)])
        except (_Unstable, OSError, TypeError):
            return None
        return hashlib.sha256(text.encode()).hexdigest()

    def parse(self, real_parse, func, extra_vars: dict, **kwargs):
        key = self.key(func, extra_vars, kwargs)
        text = None if key is None else self.entries.get(key)
        if text is not None:
            from tvm_ffi.serialization import from_json_graph_str

            try:
                parsed = from_json_graph_str(text)
                self.hits += 1
                return parsed
            except Exception:  # noqa: BLE001  (a damaged entry: parse again)
                pass
        parsed = real_parse(func, extra_vars, **kwargs)
        if key is not None:
            import tvm

            self.new[key] = tvm.ir.save_json(parsed)
        return parsed

    def save(self) -> None:
        """Write the entries parsed here (with the file's others: the union, written whole and renamed in)."""
        if not self.new:
            return
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tvmscript-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**self.entries, **self.new}, f)
        os.replace(tmp, self.path)


def tvmscript_cache_path() -> str:
    """The parse cache's file (:class:`_ParseCache`) for this TVM and Python."""
    import tvm

    return env.cache_dir("tvmscript", f"tvm-{tvm.__version__}-py{sys.version_info[0]}{sys.version_info[1]}.json")


@contextlib.contextmanager
def cheap_tvmscript_stacks():
    """TVMScript's decorators take the call stack with :func:`_cheap_stack`, and each function is parsed once per
    machine (:class:`_ParseCache`), within this context.

    Private: swaps the ``inspect`` name of TVMScript's decorator modules, which offer no option to skip the stack
    walk, and the ``parse`` name of the TIR decorator's module, which has no cache. The one place this matters:
    ``tvm.s_tir.tensor_intrin`` (TVM's tensor intrinsics), which DLight's GPU Matmul rule imports the first time
    it tensorizes a float16 (or int8) matmul. That import parses ~250 TVMScript functions: each took
    ``inspect.stack()`` at a cost of (import frames on the stack) x ``len(sys.modules)``, and the parses
    themselves take 6-8 s of a first fp16 CUDA build on an H100's host (14-28 s on a 2-core CPU). The names are
    restored on exit; if TVM's internals move, this is a no-op.
    """
    cache = None
    with contextlib.ExitStack() as restore:
        for name in _TVMSCRIPT_ENTRIES:
            try:
                entry = importlib.import_module(name)
            except ImportError:
                continue
            if getattr(entry, "inspect", None) is inspect:
                entry.inspect = _CheapStackInspect()
                restore.callback(setattr, entry, "inspect", inspect)
            real_parse = getattr(entry, "parse", None)
            if name == _TIR_ENTRY and callable(real_parse):
                cache = _ParseCache(tvmscript_cache_path())
                entry.parse = lambda func, extra_vars, _real=real_parse, **kw: cache.parse(_real, func, extra_vars, **kw)
                restore.callback(setattr, entry, "parse", real_parse)
        try:
            yield
        finally:
            if cache is not None:
                with contextlib.suppress(OSError):
                    cache.save()


def import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics within :func:`cheap_tvmscript_stacks`, unless already imported.

    MetaSchedule imports them in every TuneContext and every builder worker before its first build;
    this makes that import cheap there too. Internal: ``TENSOR_INTRIN``, the module whose import registers them
    (TVM has no public call that does)."""
    if TENSOR_INTRIN in sys.modules:
        return
    with cheap_tvmscript_stacks():
        importlib.import_module(TENSOR_INTRIN)


def onnx_converter_map() -> dict:
    """The Relax ONNX importer's table of converters.

    Private: ``onnx_frontend._get_convert_map``; the importer offers no public list of the operators it takes."""
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()


def measure_callback(fn, mean_us):
    """A MetaSchedule measure callback calling fn(task_id in the call, [run us or None per trial],
    [the runner's error message or None per trial]).

    Unstable: MetaSchedule's Python-derived objects (``derived_object``, ``PyMeasureCallback``) and the fields of
    its runner results, which moved with ``tvm.meta_schedule`` -> ``tvm.s_tir.meta_schedule``."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class _Callback(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            fn(int(task_id), [mean_us(r.run_secs) for r in runner_results],
               [str(r.error_msg) if r.error_msg else None for r in runner_results])

    return _Callback()


def _build_in_worker(args):
    """One MetaSchedule build in a builder worker (runs there; pickled by reference).

    Private: ``local_builder._worker_func``, LocalBuilder's own build step, so that ours builds exactly as it does."""
    from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func  # pinned TVM

    import_tensor_intrinsics()  # cheaply, before _worker_func does it the slow way
    return _worker_func(*args)


#: the fewest builds a builder worker is started for: a worker's start (TVM and its tensor intrinsics imported)
#: costs the CPU of many candidates' builds (benchmarks/findings.md, 'Where the test suite's CPU goes'), so a batch
#: of a few builds gets one worker, not one a core
BUILDS_PER_WORKER = 4


def lasting_builder(timeout_sec: float):
    """MetaSchedule's LocalBuilder, but its worker processes live until ``close()``, not one build batch.

    Its first batch sizes the pool: a worker per ``BUILDS_PER_WORKER`` builds, at most one a core.
    LocalBuilder starts fresh workers for every batch (TVM's guard against a slow leak in long-lived
    workers) and each fresh worker imports TVM's tensor intrinsics before its first build (30-70 s on a
    2-core machine done plainly; see ``import_tensor_intrinsics``), paid once per MetaSchedule iteration.
    ``tuning.tune`` closes it every few rounds instead, so that rounds that start workers are known and timed apart.

    Private: ``local_builder._serialize_params`` and the worker step above; LocalBuilder has no option to keep its
    workers."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params  # pinned TVM
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    @derived_object
    class _Builder(PyBuilder):
        pool, batches = None, 0

        def build(self, build_inputs):
            if self.pool is None:
                # a worker imports TVM, whose tvm_ffi imports PyTorch and probes torch.cuda.is_available(),
                # initializing CUDA (seconds per worker on a GPU machine); builders need neither
                env.quiet_torch_interop()
                workers = -(-len(build_inputs) // BUILDS_PER_WORKER)
                self.pool = PopenPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, workers)),
                                              timeout=timeout_sec)
            self.batches += 1
            results = []
            for r in self.pool.map_with_error_catching(
                    _build_in_worker,
                    [(None, None, b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]):
                if r.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(r.value, None))
                elif r.status == StatusKind.TIMEOUT:
                    results.append(BuilderResult(None, f"LocalBuilder: Timeout, killed after {timeout_sec} seconds"))
                else:
                    results.append(BuilderResult(None, f"LocalBuilder: An exception occurred\n{r.value}"))
            return results

        def close(self):
            if self.pool is not None:
                self.pool.shutdown()
            self.pool, self.batches = None, 0

    return _Builder()


@contextlib.contextmanager
def unnamed_log_handlers_detached(name: str = "tvm.s_tir.meta_schedule"):
    """MetaSchedule's logging setup names its logger's current handlers in a dictConfig and fails on an
    unnamed one (pytest attaches its capture handlers to every non-propagating logger): keep them off.

    Internal: works around how TVM's MetaSchedule configures its logger, which it offers no option for."""
    logger = logging.getLogger(name)
    unnamed = [h for h in logger.handlers if h.get_name() is None]
    for h in unnamed:
        logger.removeHandler(h)
    try:
        yield
    finally:
        for h in unnamed:
            logger.addHandler(h)


def default_schedule_rules(schedule_pass) -> list | None:
    """The rules of DLight's ``ApplyDefaultSchedule`` pass ``schedule_pass``, or None for any other pass.

    Private: ``_inst``, the Python instance behind a pass made by ``module_pass`` on a class; a pass object
    offers its name, not its rules."""
    inst = getattr(schedule_pass, "_inst", None)
    rules = getattr(inst, "rules", None)
    if type(inst).__name__ != "ApplyDefaultSchedule" or not rules:
        return None
    return list(rules)


def dlight_apply_rules(func, target, rules: list):
    """The first of ``rules`` that schedules the PrimFunc ``func`` for ``target``, as DLight applies them:
    a list of schedules, or None where none applies.

    Private: ``dlight.base.transform._apply_rules``, the loop of ``ApplyDefaultSchedule`` (so that a pass
    replacing it applies rules exactly as DLight does)."""
    from tvm.s_tir.dlight.base.transform import _apply_rules

    return _apply_rules(func, target, rules, tunable=False)


def dlight_is_scheduled(func) -> bool:
    """Whether DLight counts the PrimFunc ``func`` as scheduled already (and leaves it alone).

    Private: ``dlight.base.transform._is_scheduled``: which attribute marks it is DLight's business."""
    from tvm.s_tir.dlight.base.transform import _is_scheduled

    return _is_scheduled(func)


def dlight_target(func):
    """The target DLight schedules the PrimFunc ``func`` for: its own ``target`` attribute, else the current one.

    Private: ``dlight.base.transform._get_target``."""
    from tvm.s_tir.dlight.base.transform import _get_target

    return _get_target(func)


def nvcc_ptxas_flags() -> list[str]:
    """The ptxas options TVM's nvcc compile passes (``--ptxas-options``), environment overrides included.

    Private: ``tvm.support.nvcc._ptxas_option_flags``; TVM's compile offers no way to read its options."""
    from tvm.support import nvcc

    return list(nvcc._ptxas_option_flags())
