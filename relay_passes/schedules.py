"""Our GPU schedules, and the rules deciding when DLight's default schedules give way to them.

The pipeline (``relay_passes.pipeline``) schedules every GPU kernel TVM has not tuned with DLight's
``ApplyDefaultSchedule``. :func:`tolerant_default_schedule` replaces that pass with one applying the same rules
in the same order, each wrapped in a :class:`GuardedRule`:

- a rule that raises (TVM 0.27 bugs) or folds an epilogue into a reduction's ``init`` (:func:`folds_epilogue`,
  wrong results in TVM 0.27) is skipped, as if it had returned None;
- where a block-per-output rule meets a short reduction over many outputs (:func:`short_wide_reduction`), the
  kernel gets :func:`thread_per_output` instead;
- where the last rule (``Fallback``) is skipped, the kernel gets :func:`plain_schedule`;
- a large element-wise kernel on CUDA whose accesses allow it gets :func:`vectorized_elementwise` before
  ``Fallback`` is tried;
- with the ``NIMBLE_ROW_THREADS`` experiment switch, a normalization over the last axis of many rows (RMSNorm,
  LayerNorm, a softmax) gets :func:`threads_per_row` instead of DLight's block per row.

Each PrimFunc is scheduled once per :class:`ScheduleCache` (a kernel met again gets the very schedule).
:func:`allocates_global_buffers` reads a scheduled kernel for what the stream plan must know about it. The
private DLight helpers these need are in ``relay_passes.tvm_compat``.
"""
from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.error import InternalError
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import max_threads_per_block, try_inline, try_inline_contiguous_spatial
from tvm.s_tir.schedule import ScheduleError

from tvm_nimble import env

from .schedule_pool import MIN_PARALLEL, WorkerError, process_pool
from .tvm_compat import default_schedule_rules, dlight_apply_rules, dlight_is_scheduled, dlight_target

#: DLight rules that give each output (row) of a reduction its own thread block, the reduction across its threads
BLOCK_PER_OUTPUT_RULES = ("Reduction", "GeneralReduction")
#: a reduction this short over this many outputs is "short and wide" (see :func:`short_wide_reduction`)
SHORT_REDUCTION, WIDE_OUTPUTS = 64, 65536
#: set (to anything) to schedule short, wide reductions as stock DLight does: for experiments that compare the two
STOCK_REDUCTIONS_ENV = env.STOCK_REDUCTIONS
#: set (to anything) to schedule large element-wise kernels with DLight's ``Fallback``: the A/B switch of
#: :func:`vectorized_elementwise`
STOCK_ELEMENTWISE_ENV = env.STOCK_ELEMENTWISE
#: threads per block of :func:`thread_per_output`
THREADS_PER_OUTPUT_BLOCK = 256
#: elements each thread of :func:`vectorized_elementwise` loads and stores at once (half4 / float4: 8 or 16 bytes)
VECTOR_LANES = 4
#: element-wise kernels with fewer outputs keep DLight's schedule (their time is the launch, not the accesses)
MIN_VECTOR_OUTPUTS = 1 << 16
#: threads per block of :func:`vectorized_elementwise`
VECTOR_BLOCK_THREADS = 256
#: :func:`threads_per_row`'s shapes: at least this many rows, each at least as wide as the row's threads
ROW_MIN_ROWS = 256


# --- reading scheduled kernels ------------------------------------------------------------------------------------

def folds_epilogue(mod) -> bool:
    """Whether a scheduled kernel of ``mod`` has a reduction block whose ``init`` reads a buffer: an
    epilogue folded into the reduction, which TVM 0.27 gets wrong (see :class:`GuardedRule`)."""
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
    found, bound = [], []

    def visit_block(block):
        found.extend(b for b in block.alloc_buffers if b.scope() == "global")

    def visit_for(loop):
        if loop.kind == tirx.ForKind.THREAD_BINDING:
            bound.append(loop)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit_block), (tirx.For, visit_for)], order="post")
    return bool(found) and bool(bound)


def short_wide_reduction(func) -> bool:
    """Whether a reduction block of ``func`` sums at most SHORT_REDUCTION terms into at least WIDE_OUTPUTS outputs
    (a depthwise convolution's 25 or 49 products, a 3x3 pool). DLight's (General)Reduction rules give such a kernel a
    block per output with the terms across its 256 threads, so most threads idle and a grid of as many blocks as
    outputs does a few multiply-adds per block. One thread per output fits it (:func:`thread_per_output`)."""
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


# --- our schedules ------------------------------------------------------------------------------------------------

def thread_per_output(func, target, threads: int = THREADS_PER_OUTPUT_BLOCK):
    """A short, wide reduction (:func:`short_wide_reduction`) scheduled as one kernel with a thread per output: its
    producers (padding, input casts) inlined, the sum in a register, the epilogue (the policy's rounding cast, a
    pool's division, a residual add) computed by the same thread; None where the function is not that shape.

    DLight's ``Fallback`` also gives each output a thread, but schedules a reduction fused with an epilogue as two
    kernels with the sum in a global buffer between them. TVM allocates that buffer from its workspace pool, which
    knows no streams, so two such kernels on two streams can be given the same memory (wrong outputs in a
    multi-stream CUDA graph; see :func:`allocates_global_buffers`), and the sum makes a round trip through memory."""
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


def vectorized_elementwise(func, target, lanes: int = VECTOR_LANES, threads: int = VECTOR_BLOCK_THREADS):
    """An element-wise kernel on CUDA with each thread loading and storing ``lanes`` consecutive elements at once
    (one 8- or 16-byte access where DLight's ``Fallback`` makes ``lanes`` 2- or 4-byte ones); None where the kernel is
    not that shape (:func:`_vector_accesses`).

    A 16-bit decoder's SiLU-multiply (``silu(gate) * up`` read from the merged gate/up projection's output) is such a
    kernel: DLight's ``Fallback`` gives each output a thread, so a warp's loads are 64-byte ones. The last axis is
    split in ``lanes`` first and the other loops with the rest over blocks and threads, so a partial last block's
    guard does not depend on the vector lane and TVM vectorizes the accesses (``half4`` / ``float4`` loads and
    stores); the arithmetic stays per element, as ``Fallback`` computes it.

    A branch (``if_then_else``: a rotary embedding's rotate-half, a concatenation) qualifies where the whole vector
    takes the same side: its condition is put in the form TVM's simplifier reduces to one without the lane
    (:func:`_lane_free_conditions`), so that the vectorizer keeps it scalar and loads only the side taken (a vector
    condition would make it fall back to a loop of ``lanes`` scalar elements)."""
    if target.kind.name != "cuda":
        return None
    try:
        sch = s_tir.Schedule(_lane_free_conditions(func))
        infos = normalize_prim_func(sch)
        if not infos or any(k != "S" for info in infos for k in info.dom_kind()):
            return None
        infos = try_inline(sch, infos)
        if len(infos) != 1:
            return None
        block_rv = infos[0].block_rv
        loops = sch.get_loops(block_rv)
        if not loops or not _vector_accesses(sch, block_rv, loops, lanes):
            return None
        *others, last = loops
        outer, vector = sch.split(last, factors=[None, lanes])
        bx, tx = sch.split(sch.fuse(*others, outer), factors=[None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vector)
        return sch
    except Exception:  # noqa: BLE001  (any schedule error: Fallback takes the function)
        return None


def threads_per_row(func, target, threads: int, rows_per_block: int | None = None, min_rows: int = ROW_MIN_ROWS):
    """A normalization over the last axis of many rows on CUDA -- reductions of each row (RMSNorm's sum of squares,
    LayerNorm's mean and variance, a softmax's maximum and sum) and an element-wise epilogue over the same rows --
    with ``threads`` threads a row: each thread sums every ``threads``-th element of its row in a register, TVM's
    cross-thread reduction combines the threads' sums (shuffles within a warp; every thread gets the row's value),
    and the same threads write the row's outputs. A block holds ``rows_per_block`` rows (default: two for a warp a
    row, else one). None where the function is not that shape (``min_rows`` rows or more, at least
    ``threads`` wide, a multiple of a warp).

    DLight's ``Reduction`` / ``GeneralReduction`` give each row a block of up to 512 threads and a shared-memory
    tree: a 0.5B decoder's 896-wide RMSNorm is 1.75 elements a thread. An experiment's switch
    (``NIMBLE_ROW_THREADS``) until measured faster in a model (``scripts/experiments/row_norm_schedules.py`` times
    the kernels alone)."""
    if target.kind.name != "cuda":
        return None
    try:
        sch = s_tir.Schedule(func)
        infos = try_inline_contiguous_spatial(sch, normalize_prim_func(sch))
        if not infos or len(infos) < 2:
            return None
        *reductions, epilogue = infos
        dom = epilogue.dom()
        if (epilogue.dom_kind() != "SS" or any(r.dom_kind() != "SR" or r.dom() != dom for r in reductions)
                or not all(isinstance(d, int) for d in dom)):
            return None
        rows, width = dom
        per_block = rows_per_block or (2 if threads == 32 and rows % 2 == 0 else 1)
        if rows < min_rows or width < threads or width % 32 or rows % per_block:
            return None
        row, column = sch.get_loops(epilogue.block_rv)
        outer, tx = sch.split(column, factors=[None, threads])
        if per_block > 1:
            bx, at = sch.split(row, factors=[None, per_block])
            sch.reorder(bx, at, tx, outer)
            sch.bind(at, "threadIdx.y")
        else:
            bx = at = row
            sch.reorder(bx, tx, outer)
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        for red in reversed(reductions):
            sch.compute_at(red.block_rv, at, preserve_unit_loops=True)
            r_outer, lane = sch.split(sch.get_loops(red.block_rv)[-1], factors=[None, threads])
            sch.reorder(lane, r_outer)
            sch.bind(lane, "threadIdx.x")
            sch.annotate(r_outer, ann_key="pragma_auto_unroll_max_step", ann_val=256)
            sch.annotate(r_outer, ann_key="pragma_unroll_explicit", ann_val=1)
            sch.set_scope(red.block_rv, 0, "local")  # the reduction leaves the row's value in every thread
        return sch
    except Exception:  # noqa: BLE001  (any schedule error: DLight's rules take the function)
        return None


def _vector_accesses(sch, block_rv, loops, lanes: int) -> bool:
    """Whether the one block of an inlined element-wise kernel may load and store ``lanes`` elements at once: it
    stores one 16- or 32-bit buffer at its own loop indices (unit axes at 0 aside; of at least
    :data:`MIN_VECTOR_OUTPUTS` elements, the last axis a multiple of ``lanes``), and every load, with the last loop
    index stepping through ``lanes`` consecutive values from a multiple of ``lanes``, reads one element (a broadcast)
    or ``lanes`` consecutive ones starting on a multiple of ``lanes`` of a 16- or 32-bit buffer (an aligned vector:
    TVM's vectorizer assumes the alignment it does not prove). No selects: both sides are read, and a side's loads
    may lie outside the buffer on the lanes the condition leaves out. An ``if_then_else`` only where its condition,
    simplified for the vector's lanes, does not read the lane (the vector takes one side, and only that side is
    read)."""
    block = sch.get(block_rv)
    store = block.body
    loop_vars = [sch.get(l).loop_var for l in loops]
    extents = [sch.get(l).extent for l in loops]
    if (not isinstance(store, tirx.BufferStore) or len(block.iter_vars) != len(loops)
            or not all(isinstance(e, tirx.IntImm) for e in extents)):
        return False
    extents = [int(e) for e in extents]
    realize = []
    tvm_ffi.structural_walk(sch.mod["main"].body, [(s_tir.SBlockRealize, realize.append)], order="post")
    realize = [r for r in realize if r.block.name_hint == block.name_hint]
    if len(realize) != 1 or not all(v.same_as(lv) for v, lv in zip(realize[0].iter_values, loop_vars)):
        return False
    iters = [iv.var for iv in block.iter_vars]
    out = store.buffer
    # the analysis drops unit axes from the loops (a model's [1, rows, width] is stored at [0, v0, v1])
    shape = [_int(d) for d in out.shape]
    kept = [(i, d) for i, d in zip(store.indices, shape) if not (d == 1 and _int(i) == 0)]
    if (len(store.indices) != len(shape) or len(kept) != len(iters)
            or not all(i.same_as(v) for (i, _), v in zip(kept, iters)) or [d for _, d in kept] != extents
            or extents[-1] % lanes or math.prod(extents) < MIN_VECTOR_OUTPUTS or not _vector_dtype(out.dtype)):
        return False
    loads, selects, branches = [], [], []
    tvm_ffi.structural_walk(store.value, [(tvm.ir.expr.TensorLoad, loads.append), (tirx.Select, selects.append),
                                          (tvm.ir.expr.Call, lambda c: branches.append(c) if str(
                                              getattr(c.op, "name", "")).endswith("if_then_else") else None)],
                            order="post")
    if selects:
        return False
    step = tirx.Var("vector_step", str(iters[-1].ty.dtype))
    ranges = tvm.sym.Analyzer()
    for var, extent in zip(iters[:-1], extents[:-1]):
        ranges.bind(var, tvm.ir.Range(0, extent))
    ranges.bind(step, tvm.ir.Range(0, extents[-1] // lanes))
    lane = tirx.Var("vector_lane", str(iters[-1].ty.dtype))
    ranges.bind(lane, tvm.ir.Range(0, lanes))
    for branch in branches:  # taken alike by the whole vector: the simplified condition does not read the lane
        # (substituted, not simplified twice: a first simplification would undo _lane_free_conditions' form)
        cond = tvm_ffi.structural_mutate(branch.args[0], [
            (tirx.Var, lambda v, _: step * lanes + lane if v.same_as(iters[-1]) else v)])
        used = []
        tvm_ffi.structural_walk(ranges.simplify(cond),
                                [(tirx.Var, lambda v: used.append(v) if v.same_as(lane) else None)])
        if used:
            return False
    for load in loads:
        buf = load.source
        shape = [_int(d) for d in buf.shape]
        if None in shape or not _vector_dtype(buf.dtype) or _int(buf.elem_offset) != 0:
            return False
        flat = sum((i * math.prod(shape[k + 1:]) for k, i in enumerate(load.indices)), tirx.IntImm("int32", 0)) \
            if len(load.indices) > 1 else load.indices[0]
        at = []
        for offset in range(lanes):
            lane_of = tvm.sym.Analyzer()
            lane_of.bind(iters[-1], step * lanes + offset)
            at.append(lane_of.simplify(flat))
        steps = [ranges.simplify(a - at[0]) for a in at]
        if not all(isinstance(s, tirx.IntImm) for s in steps):
            return False
        steps = [int(s) for s in steps]
        if steps == list(range(lanes)):
            if not ranges.can_prove(tirx.floormod(at[0], lanes) == 0):
                return False
        elif any(steps):
            return False
    return True


def _lane_free_conditions(func):
    """``func`` with each ``a <= b`` written ``not (b < a)`` (and ``a >= b`` as ``not (a < b)``): TVM's simplifier
    reduces ``4 * i + lane < 32`` (``lane`` in [0, 4)) to ``i < 8`` but leaves ``32 <= 4 * i + lane`` as it is."""
    return tvm_ffi.structural_mutate(func, [
        (tirx.LE, lambda e, m: tirx.Not(tirx.LT(m.mutate(e.b), m.mutate(e.a)))),
        (tirx.GE, lambda e, m: tirx.Not(tirx.LT(m.mutate(e.a), m.mutate(e.b))))])


def _int(expr) -> int | None:
    return int(expr) if isinstance(expr, (int, tirx.IntImm)) else None


def _vector_dtype(dtype) -> bool:
    d = tvm.DataType(str(dtype))
    return d.lanes == 1 and d.bits in (16, 32) and d.type_code in (tvm.DataTypeCode.FLOAT, tvm.DataTypeCode.BFLOAT,
                                                                    tvm.DataTypeCode.INT, tvm.DataTypeCode.UINT)


def plain_schedule(func, target):
    """Every block's spatial loops fused and bound to blocks and threads, nothing inlined, reductions decomposed:
    the form a kernel gets where even DLight's ``Fallback`` is skipped (see :class:`GuardedRule`)."""
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


# --- the rules deciding when they apply ---------------------------------------------------------------------------

class GuardedRule(dl.ScheduleRule):
    """One of DLight's default rules, with two TVM 0.27 bugs kept out of the kernels and our schedules where
    DLight's do not fit.

    A rule is meant to return None for a kernel it does not fit, and the next rule (last of all ``Fallback``)
    takes it. Here a rule is also skipped where
    - it raises a ScheduleError instead (``GeneralReduction`` on a max-pool gradient fused with the adds of the
      branch gradients it joins: "does not have compact dataflow"), which failed the whole build of a training
      step, or an InternalError (``Reduction``'s rfactor, "block_realize == old_block_realize_", on a weight
      gradient's reduction fused beside cuDNN's gradient calls);
    - its schedule folds an epilogue into a reduction block, so that the block's ``init`` reads a buffer:
      ``Fallback`` inlines ``momentum * v + a @ b`` into the matmul's reduction and then adds ``momentum * v`` in
      the init *and* in every update (``2 * momentum * v + a @ b`` for a one-element reduction: the Gemm weight
      gradient with the optimizer's momentum update at batch 1, wrong on CUDA in stock TVM too).
    Where the last rule is skipped, the kernel gets :func:`plain_schedule`. A block-per-output rule
    (:data:`BLOCK_PER_OUTPUT_RULES`) gives a short, wide reduction :func:`thread_per_output` instead, and before the
    last rule a large element-wise kernel gets :func:`vectorized_elementwise`, unless ``stock`` names them
    (``"reductions"``, ``"elementwise"``: :func:`tvm_nimble.env.stock_schedules`, for A/B experiments), which keeps
    DLight's. ``stock``'s ``"rows=T"`` (the ``NIMBLE_ROW_THREADS`` experiment) gives a normalization of many rows
    :func:`threads_per_row` with T threads a row."""

    def __init__(self, rule, last: bool, stock: tuple[str, ...] = ()):
        self.rule, self.last, self.stock = rule, last, tuple(stock)
        self.row_threads = next((int(s[len("rows="):]) for s in self.stock if s.startswith("rows=")), None)

    def apply(self, func, target, tunable):
        if (type(self.rule).__name__ in BLOCK_PER_OUTPUT_RULES and "reductions" not in self.stock
                and short_wide_reduction(func)):
            # a block per output would leave most of its threads idle: a thread per output, one kernel
            return thread_per_output(func, target)
        if type(self.rule).__name__ in BLOCK_PER_OUTPUT_RULES and self.row_threads:
            sch = threads_per_row(func, target, self.row_threads)
            if sch is not None:
                return sch
        if self.last and "elementwise" not in self.stock:
            sch = vectorized_elementwise(func, target)
            if sch is not None:
                return sch
        try:
            sch = self.rule.apply(func, target, tunable)
        except (ScheduleError, InternalError):
            sch = None
        if sch is not None and not isinstance(sch, list) and folds_epilogue(sch.mod):
            logging.getLogger("tvm_nimble").debug("DLight %s folded an epilogue into a reduction: skipped",
                                                  type(self.rule).__name__)
            sch = None
        if sch is None and self.last:
            return plain_schedule(func, target)
        return sch


# --- each kernel scheduled once -----------------------------------------------------------------------------------

@dataclass
class ScheduleCache:
    """Scheduled PrimFuncs by (digest of the PrimFunc's JSON, target, rules): its scheduled form, or None where no
    rule applies.

    A build lowers the kernel choice's probes, both modules of its model check and the stock-TVM baselines: the same
    element-wise and fused kernels again and again, and DLight's rules (Python) cost tens of milliseconds a kernel
    (seconds of a large model's lowering). A schedule is a function of the PrimFunc, the target and the rules. The
    key is the JSON, names included: structural equality ignores names, and a schedule reused from a kernel named
    otherwise (a probe's parameters) would change the CUDA source, so a later build in a fresh process would miss
    the fatbin cache and compile again. At ``max_entries`` the cache starts over."""

    max_entries: int = 8192
    #: kernels the rules scheduled, and kernels whose schedule was reused, since the last :meth:`clear`
    scheduled: int = 0
    reused: int = 0
    _entries: dict = field(default_factory=dict, repr=False)

    def schedule(self, func, target, rules: list, rules_key: tuple):
        """``func`` scheduled by the first of ``rules`` that applies (``rules_key`` names them in the key), marked
        scheduled; None where none applies."""
        return self.schedule_all([func], target, rules, rules_key)[0]

    def schedule_all(self, funcs: list, target, rules: list, rules_key: tuple, pool=None,
                     stock: tuple[str, ...] = ()) -> list:
        """:meth:`schedule` of each of ``funcs`` (PrimFuncs for ``target``), in order. Where ``pool`` (a
        :class:`.schedule_pool.SchedulePool`, whose workers apply DLight's default rules guarded as ``rules`` are,
        ``stock`` as there) is given and :data:`~.schedule_pool.MIN_PARALLEL` or more of them are not
        cached, its workers and this thread schedule those (a failing worker's share here)."""
        texts = [tvm.ir.save_json(f) for f in funcs]
        keys = [(hashlib.sha256(t.encode()).hexdigest(), str(target), rules_key) for t in texts]
        todo = {}  # key -> (the first function with it, its JSON)
        for key, func, text in zip(keys, funcs, texts):
            if key not in self._entries:
                todo.setdefault(key, (func, text))
        done = {}
        if pool is not None and len(todo) >= MIN_PARALLEL:
            pending = list(todo.values())
            try:  # this thread schedules too, and takes back what a failing worker had
                done = dict(zip(todo, pool.schedule([t for _, t in pending], target, rules_key, stock,
                                                    here=lambda i: schedule_with(pending[i][0], target, rules))))
            except WorkerError as e:  # (a pool closed since it was handed over)
                logging.getLogger("tvm_nimble").warning("scheduling kernels in this process: %s", e)
        for key, (func, _) in todo.items():
            if key not in done:
                done[key] = schedule_with(func, target, rules)
        out = [done[key] if key in done else self._entries[key] for key in keys]
        if len(self._entries) + len(done) > self.max_entries:
            self._entries.clear()
        self._entries.update(done)
        self.scheduled += len(done)
        self.reused += len(funcs) - len(done)
        return out

    def clear(self) -> None:
        """Forget every schedule and reset the counts (tests start from an empty cache)."""
        self._entries.clear()
        self.scheduled = self.reused = 0


#: The schedules of this process. Process-wide for speed: the builds that meet the same kernels (a build's
#: kernel choice, model check and stock baselines, each lowered by its own ``lower`` call, and later builds of the
#: same model) share no object that could own it, and a schedule depends only on its key. Tests call ``clear()``.
PROCESS_SCHEDULES = ScheduleCache()


def schedule_with(func, target, rules: list):
    """``func`` scheduled by the first of ``rules`` that applies to it for ``target``, marked scheduled; None where
    none applies."""
    sch = dlight_apply_rules(func, target, rules)
    return None if sch is None else sch[0].mod["main"].with_attr("tirx.is_scheduled", True)


def guarded_rules(schedule_pass: tvm.transform.Pass, stock: tuple[str, ...]) -> tuple[list, tuple] | None:
    """(the rules of DLight's ``ApplyDefaultSchedule`` pass ``schedule_pass``, each a :class:`GuardedRule`, and the
    key naming them), or None for any other pass. ``stock``: which of our schedules (``"reductions"``,
    ``"elementwise"``) DLight's own replace."""
    rules = default_schedule_rules(schedule_pass)
    if rules is None:
        return None
    guarded = [GuardedRule(r, i == len(rules) - 1, stock) for i, r in enumerate(rules)]
    return guarded, tuple(type(r).__name__ for r in rules) + tuple(f"stock {name}" for name in stock)


def tolerant_default_schedule(schedule_pass: tvm.transform.Pass,
                              cache: ScheduleCache | None = None) -> tvm.transform.Pass:
    """DLight's ``ApplyDefaultSchedule`` pass ``schedule_pass`` with each of its rules a :class:`GuardedRule`, each
    PrimFunc scheduled once per ``cache`` (default :data:`PROCESS_SCHEDULES`), a large module's in this process's
    :func:`.schedule_pool.process_pool` where it has one. Any other pass is returned unchanged.
    The experiment switches (:func:`tvm_nimble.env.stock_schedules`) are read here, and are part of the cache's
    key."""
    stock = env.stock_schedules()
    guarded = guarded_rules(schedule_pass, stock)
    if guarded is None:
        return schedule_pass
    rules, rules_key = guarded
    return _scheduled_once(rules, rules_key, stock, PROCESS_SCHEDULES if cache is None else cache)


def _scheduled_once(rules: list, rules_key: tuple, stock: tuple[str, ...], cache: ScheduleCache) -> tvm.transform.Pass:
    """``ApplyDefaultSchedule``'s module pass with ``rules``, through ``cache``: every PrimFunc not scheduled yet
    gets its schedule from the cache, or from the rules once (in the process's schedule pool where it has one)."""
    @tvm.transform.module_pass(opt_level=0, name="ApplyDefaultSchedule")
    def _pass(mod, _ctx):
        by_target: dict = {}  # str(target) -> (target, [(gv, func)])
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and not dlight_is_scheduled(func):
                target = dlight_target(func)
                by_target.setdefault(str(target), (target, []))[1].append((gv, func))
        updated = {}
        for target, items in by_target.values():
            scheduled = cache.schedule_all([f for _, f in items], target, rules, rules_key, pool=process_pool(),
                                           stock=stock)
            updated.update((gv, after) for (gv, _), after in zip(items, scheduled) if after is not None)
        for gv, func in updated.items():
            mod[gv] = func
        return mod

    return _pass
