"""Every use of a private or moving TVM/MetaSchedule API by the compiler side, in one place.

Each function says what it works around. They are pinned to apache-tvm 0.27.0.post1 (see
pyproject.toml); when TVM changes one of these internals, this file is the one to update.
The runtime has its own, ``tvm_nimble.runtime.tvm_compat`` (the runtime never imports the
compiler side); ``tests/test_layout.py`` checks that no other module uses TVM's private API.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import math
import os
import sys

from tvm_nimble import env

# TVMScript's decorator modules; each calls ``inspect.stack()`` once per parsed function.
_TVMSCRIPT_ENTRIES = ("tvm.tirx.script.parser.entry", "tvm.script.parser.ir.entry")
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


@contextlib.contextmanager
def cheap_tvmscript_stacks():
    """TVMScript's decorators take the call stack with :func:`_cheap_stack` within this context.

    The one place this matters: ``tvm.s_tir.tensor_intrin`` (TVM's tensor-core intrinsics), which
    DLight's GPU Matmul rule imports the first time it tensorizes a float16 (or int8) matmul.
    That import parses ~250 TVMScript functions, each taking ``inspect.stack()``, at a cost of
    (import frames on the stack) x ``len(sys.modules)`` each: the first fp16 CUDA build of
    googlenet spent over a minute there on a 2-core CPU, more with PyTorch loaded. Only the
    decorator modules' ``inspect`` name is swapped (the global module is untouched) and it is
    restored on exit; if TVM's internals move, this is a no-op.
    """
    with contextlib.ExitStack() as restore:
        for name in _TVMSCRIPT_ENTRIES:
            try:
                entry = importlib.import_module(name)
            except ImportError:
                continue
            if getattr(entry, "inspect", None) is inspect:
                entry.inspect = _CheapStackInspect()
                restore.callback(setattr, entry, "inspect", inspect)
        yield


def import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics within :func:`cheap_tvmscript_stacks`, unless already imported.

    MetaSchedule imports them in every TuneContext and every builder worker before its first build;
    this makes that import cheap there too."""
    if TENSOR_INTRIN in sys.modules:
        return
    with cheap_tvmscript_stacks():
        importlib.import_module(TENSOR_INTRIN)


def onnx_converter_map() -> dict:
    """The Relax ONNX importer's table of converters (private: ``onnx_frontend._get_convert_map``)."""
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()


def measure_callback(fn, mean_us):
    """A MetaSchedule measure callback calling fn(task_id in the call, [run us or None per trial],
    [the runner's error message or None per trial])."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class _Callback(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            fn(int(task_id), [mean_us(r.run_secs) for r in runner_results],
               [str(r.error_msg) if r.error_msg else None for r in runner_results])

    return _Callback()


def _build_in_worker(args):
    """One MetaSchedule build in a builder worker (runs there; pickled by reference)."""
    from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func  # pinned TVM

    import_tensor_intrinsics()  # cheaply, before _worker_func does it the slow way
    return _worker_func(*args)


def lasting_builder(timeout_sec: float):
    """MetaSchedule's LocalBuilder, but its worker processes live until ``close()``, not one build batch.

    LocalBuilder starts fresh workers for every batch (TVM's guard against a slow leak in long-lived
    workers) and each fresh worker imports TVM's tensor intrinsics before its first build (30-70 s on a
    2-core machine done plainly; see ``import_tensor_intrinsics``), paid once per MetaSchedule iteration.
    ``tuning.tune`` closes it every few rounds instead, so that rounds that start workers are known and timed apart."""
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
                self.pool = PopenPoolExecutor(max_workers=os.cpu_count() or 1, timeout=timeout_sec)
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
    unnamed one (pytest attaches its capture handlers to every non-propagating logger): keep them off."""
    logger = logging.getLogger(name)
    unnamed = [h for h in logger.handlers if h.get_name() is None]
    for h in unnamed:
        logger.removeHandler(h)
    try:
        yield
    finally:
        for h in unnamed:
            logger.addHandler(h)


def folds_epilogue(mod) -> bool:
    """Whether a scheduled kernel of ``mod`` has a reduction block whose ``init`` reads a buffer: an
    epilogue folded into the reduction, which TVM 0.27 gets wrong (see :func:`tolerant_default_schedule`)."""
    import tvm_ffi
    from tvm import s_tir, tirx

    found = []

    def visit_block(block):
        if block.init is not None:
            tvm_ffi.structural_walk(block.init, [(object, lambda n: found.append(1) if type(n).__name__ in (
                "BufferLoad", "TensorLoad") else None)], order="post")

    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit_block)], order="post")
    return bool(found)


def allocates_global_buffers(func) -> bool:
    """Whether the scheduled GPU PrimFunc ``func`` keeps an intermediate buffer in global memory (two kernels in one
    function, one writing what the other reads: ``Fallback``'s or the plain schedule's form of a reduction with an
    epilogue). TVM allocates it from its workspace pool at every call, and that pool knows no streams: the plan must
    not let two such kernels overlap (``relay_passes.lowered_ir``). CPU functions (no thread bindings) run one at a
    time on the host and are not counted."""
    import tvm_ffi
    from tvm import s_tir, tirx

    found, bound = [], []

    def visit_block(block):
        found.extend(b for b in block.alloc_buffers if b.scope() == "global")

    def visit_for(loop):
        if loop.kind == tirx.ForKind.THREAD_BINDING:
            bound.append(loop)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit_block), (tirx.For, visit_for)], order="post")
    return bool(found) and bool(bound)


#: DLight rules that give each output (row) of a reduction its own thread block, the reduction across its threads
_BLOCK_PER_OUTPUT_RULES = ("Reduction", "GeneralReduction")
#: a reduction this short over this many outputs is "short and wide" (see :func:`short_wide_reduction`)
SHORT_REDUCTION, WIDE_OUTPUTS = 64, 65536
#: set (to anything) to schedule short, wide reductions as stock DLight does: for experiments that compare the two
STOCK_REDUCTIONS_ENV = env.STOCK_REDUCTIONS


def short_wide_reduction(func) -> bool:
    """Whether a reduction block of ``func`` sums at most SHORT_REDUCTION terms into at least WIDE_OUTPUTS outputs
    (a depthwise convolution's 25 or 49 products, a 3x3 pool). DLight's (General)Reduction rules give such a kernel a
    block per output with the terms across its 256 threads, so most threads idle and a million-thread grid does a few
    million multiply-adds: an fp16 depthwise convolution of nasnetalarge (5x5, 296,352 outputs) accumulating in fp32,
    fused with its rounding cast, took 0.55 ms on an H100 that way. One thread per output (``Fallback``) fits it."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    try:
        infos = normalize_prim_func(s_tir.Schedule(func))
    except Exception:  # noqa: BLE001  (a function DLight cannot analyse: leave it to the rules)
        return False
    for info in infos or ():
        kinds = info.dom_kind()
        if "R" not in kinds:
            continue
        doms = info.dom()
        if not all(isinstance(d, int) for d in doms):
            return False
        spatial = math.prod(d for d, k in zip(doms, kinds) if k == "S")
        reduced = math.prod(d for d, k in zip(doms, kinds) if k == "R")
        return reduced <= SHORT_REDUCTION and spatial >= WIDE_OUTPUTS
    return False


def thread_per_output(func, target, threads: int = 256):
    """A short, wide reduction (:func:`short_wide_reduction`) scheduled as one kernel with a thread per output: its
    producers (padding, input casts) inlined, the sum in a register, the epilogue (the policy's rounding cast, a
    pool's division, a residual add) computed by the same thread; None where the function is not that shape.

    DLight's ``Fallback`` also gives each output a thread, but schedules a reduction fused with an epilogue as two
    kernels with the sum in a global buffer between them. TVM allocates that buffer from its workspace pool, which
    knows no streams: two such kernels on two streams got the same memory (nasnetalarge in fp16 and TF32, multi-stream
    CUDA graph: NaN and wrong outputs, twentieth session), and the sum made a round trip through memory."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    try:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos:
            return None
        at = [i for i, info in enumerate(infos) if "R" in info.dom_kind()]
        if len(at) != 1:
            return None
        red = infos[at[0]]
        for info in infos[:at[0]]:
            sch.compute_inline(info.block_rv)
        epilogue = infos[at[0] + 1:]
        for info in reversed(epilogue[1:]):  # element-wise chains fold into the first block after the sum
            sch.reverse_compute_inline(info.block_rv)
        loops = sch.get_loops(red.block_rv)
        kinds = red.dom_kind()
        spatial = [loop for loop, k in zip(loops, kinds) if k == "S"]
        reduction = [loop for loop, k in zip(loops, kinds) if k == "R"]
        if not spatial or len(spatial) + len(reduction) != len(loops):
            return None
        sch.reorder(*spatial, *reduction)
        bx, tx = sch.split(sch.fuse(*spatial), factors=[None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if epilogue:
            sch.reverse_compute_at(epilogue[0].block_rv, tx)
            sch.set_scope(red.block_rv, 0, "local")
        sch.decompose_reduction(red.block_rv, reduction[0])
        return sch
    except Exception:  # noqa: BLE001  (any schedule error: the next rule takes the function)
        return None


def tolerant_default_schedule(schedule_pass: tvm.transform.Pass) -> tvm.transform.Pass:
    """DLight's ``ApplyDefaultSchedule`` with two TVM 0.27 bugs kept out of the kernels.

    A rule is meant to return None for a kernel it does not fit, and the next rule (last of all
    ``Fallback``) takes it. Here a rule is also skipped where
    - it raises a ScheduleError instead (``GeneralReduction`` on a max-pool gradient fused with the
      adds of the branch gradients it joins: "does not have compact dataflow"), which failed the
      whole build of a training step, or an InternalError (``Reduction``'s rfactor, "block_realize ==
      old_block_realize_", on a weight gradient's reduction fused beside cuDNN's gradient calls);
    - its schedule folds an epilogue into a reduction block, so that the block's ``init`` reads a
      buffer: ``Fallback`` inlines ``momentum * v + a @ b`` into the matmul's reduction and then adds
      ``momentum * v`` in the init *and* in every update (``2 * momentum * v + a @ b`` for a
      one-element reduction: the Gemm weight gradient with the optimizer's momentum update at
      batch 1, wrong on CUDA in stock TVM too).
    Where ``Fallback`` itself is skipped, the kernel gets its plain form: every block's spatial loops
    bound to blocks and threads, nothing inlined. Any other pass is returned unchanged."""
    from tvm import s_tir
    from tvm.error import InternalError
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import max_threads_per_block
    from tvm.s_tir.schedule import ScheduleError

    inst = getattr(schedule_pass, "_inst", None)  # the pass object's Python instance
    rules = getattr(inst, "rules", None)
    if type(inst).__name__ != "ApplyDefaultSchedule" or not rules:
        return schedule_pass

    def plain(func, target):
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = []
        for info in infos:
            block = info.block_rv
            loops = sch.get_loops(block)
            if any(sch.get(l).thread_binding is not None for l in loops):
                continue
            kinds = dict(zip(loops, info.dom_kind()))
            spatial = [l for l in loops if kinds[l] == "S"] or [sch.add_unit_loop(block)]
            rest = [l for l in loops if kinds.get(l) == "R"] + [l for l in loops if kinds.get(l) == "O"]
            sch.reorder(*spatial, *rest)
            bx, tx = sch.split(sch.fuse(*spatial), factors=[None, max_threads_per_block(target)])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            reduction = [l for l in loops if kinds[l] == "R"]
            if reduction:
                reductions.append((block, reduction[0]))
        for block, loop in reductions:
            sch.decompose_reduction(block, loop)
        return sch

    class Guarded(dl.ScheduleRule):
        def __init__(self, rule, last: bool):
            self.rule, self.last = rule, last

        def apply(self, func, target, tunable):
            if (type(self.rule).__name__ in _BLOCK_PER_OUTPUT_RULES and not env.stock_reductions()
                    and short_wide_reduction(func)):
                # a block per output would leave most of its threads idle: a thread per output, one kernel
                return thread_per_output(func, target)
            try:
                sch = self.rule.apply(func, target, tunable)
            except (ScheduleError, InternalError):
                sch = None
            if sch is not None and not isinstance(sch, list) and folds_epilogue(sch.mod):
                logging.getLogger("tvm_nimble").debug("DLight %s folded an epilogue into a reduction: skipped",
                                                      type(self.rule).__name__)
                sch = None
            if sch is None and self.last:
                return plain(func, target)
            return sch

    return _schedule_once([Guarded(r, i == len(rules) - 1) for i, r in enumerate(rules)],
                          tuple(type(r).__name__ for r in rules))


#: PrimFuncs DLight scheduled in this process: (digest of the PrimFunc's JSON, target, rules) -> its scheduled
#: form, or None. A build lowers the kernel choice's probes, both modules of its model check and the stock-TVM
#: baselines: the same element-wise and fused kernels again and again, and DLight's rules (Python) cost about
#: 20 ms a kernel (4 s of densenet121's lowering). Its schedule is a function of the PrimFunc and the target.
#: The key is the JSON, names included: structural equality ignores names, and a schedule reused from a kernel
#: named otherwise (a probe's parameters) would change the CUDA source, so a later build in a fresh process
#: would miss the fatbin cache and compile again.
_SCHEDULED: dict = {}
_SCHEDULED_MAX = 8192
#: kernels DLight scheduled, and kernels whose schedule was reused, in this process
schedule_counts = {"scheduled": 0, "reused": 0}


def _schedule_once(rules: list, rule_names: tuple) -> tvm.transform.Pass:
    """DLight's ``ApplyDefaultSchedule`` with ``rules`` (its ``transform_module``, private helpers
    ``_is_scheduled`` / ``_get_target`` / ``_apply_rules``), each PrimFunc scheduled once per process:
    one identical to a PrimFunc scheduled before (names too), for the same target and rules, gets that schedule."""
    import hashlib

    import tvm
    from tvm import tirx
    from tvm.s_tir.dlight.base.transform import _apply_rules, _get_target, _is_scheduled

    def scheduled(func, target):
        key = (hashlib.sha256(tvm.ir.save_json(func).encode()).hexdigest(), str(target), rule_names)
        if key in _SCHEDULED:
            schedule_counts["reused"] += 1
            return _SCHEDULED[key]
        sch = _apply_rules(func, target, rules, tunable=False)
        after = None if sch is None else sch[0].mod["main"].with_attr("tirx.is_scheduled", True)
        if len(_SCHEDULED) >= _SCHEDULED_MAX:
            _SCHEDULED.clear()
        _SCHEDULED[key] = after
        schedule_counts["scheduled"] += 1
        return after

    @tvm.transform.module_pass(opt_level=0, name="ApplyDefaultSchedule")
    def _pass(mod, _ctx):
        updated = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and not _is_scheduled(func):
                after = scheduled(func, _get_target(func))
                if after is not None:
                    updated[gv] = after
        for gv, func in updated.items():
            mod[gv] = func
        return mod

    return _pass


def ptxas_options() -> list[str]:
    """The ptxas options TVM's nvcc compile passes (private: ``tvm.support.nvcc._ptxas_option_flags``), for
    the ptxas step of a fatbin made from PTX compiled in parts (``codegen.cuda_split``): the same options
    give the same machine code as TVM's own one-step compile."""
    from tvm.support import nvcc

    return list(nvcc._ptxas_option_flags())
