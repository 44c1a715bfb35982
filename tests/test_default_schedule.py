"""TVM's default GPU schedules (DLight) as the pipeline applies them: where the pipeline's guarded rules differ from
stock TVM's on purpose. Kernels only (lowered for sm_90, no GPU): each test reads the thread mapping of the lowered
kernels, and compares it with what stock TVM's own pipeline gives the same module."""
import re

import pytest

import tvm
from tvm import relax

from tvm_nimble.codegen import cuda_compile
from tvm_nimble.compiler import stages
from tvm_nimble.compiler.target import resolve_target
from tvm_nimble.relay_passes.pipeline import backend_for

SM90 = resolve_target("cuda", "sm_90")
THREADS = 256  # a thread per output, in blocks of this many


def _module(build_body, params):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build_body(bb))
        bb.emit_func_output(out)
    return bb.get()


def _threads(mod) -> dict[str, list[tuple[str, int]]]:
    """(thread axis, extent) of every thread binding of each scheduled kernel, by PrimFunc name."""
    return {gv.name_hint: [(axis, int(n)) for n, axis in re.findall(
        r'T\.thread_binding\(T\.int64\((\d+)\), thread="(\w+\.\w)"\)', func.script())]
            for gv, func in mod.functions.items() if isinstance(func, tvm.tirx.PrimFunc)}


def _block_counts(mod) -> dict[str, list[int]]:
    """The blockIdx.x extents of every scheduled kernel, by PrimFunc name."""
    return {name: [n for axis, n in bindings if axis == "blockIdx.x"] for name, bindings in _threads(mod).items()}


def _stock(mod):
    with SM90:
        return tvm.transform.Sequential(list(backend_for(SM90).legalize_passes(SM90)))(mod)


def test_a_short_reduction_over_many_outputs_gets_a_thread_per_output_not_a_block():
    """25 products into each of 296,352 outputs: stock DLight's GeneralReduction gives every output a block of
    threads over its 25 terms (a grid of 296,352 blocks); the pipeline's guard leaves it to Fallback, a thread per
    output (blocks of 256)."""
    x = relax.Var("x", relax.TensorType((1, 42, 42, 168), "float16"))
    w = relax.Var("w", relax.TensorType((168, 5, 5, 1), "float16"))

    def body(bb):
        y = bb.emit(relax.op.nn.conv2d(x, w, padding=[2, 2, 2, 2], groups=168, data_layout="NHWC",
                                       kernel_layout="OHWI", out_dtype="float32"))
        return bb.emit(relax.op.astype(y, "float16"))

    mod = _module(body, [x, w])
    outputs = 42 * 42 * 168
    stock = [n for name, ns in _block_counts(_stock(mod)).items() if "conv2d" in name for n in ns]
    ours = [n for name, ns in _block_counts(stages.lower(mod, SM90)).items() if "conv2d" in name for n in ns]
    assert stock == [outputs]  # the block per output this guards against (TVM 0.27's DLight)
    assert ours and max(ours) <= -(-outputs // THREADS)


def test_a_long_reduction_keeps_dlights_schedule():
    """A softmax over 768 columns of 197 rows (few outputs, long reductions) is scheduled as stock DLight does."""
    x = relax.Var("x", relax.TensorType((197, 768), "float32"))
    mod = _module(lambda bb: bb.emit(relax.op.nn.softmax(x, axis=-1)), [x])
    stock, ours = _block_counts(_stock(mod)), _block_counts(stages.lower(mod, SM90))
    assert ours == stock and any(197 in ns for ns in ours.values())


def test_a_3x3_average_pool_also_gets_a_thread_per_output():
    """An average pool is a sum and a division: stock DLight gives each of its 150,528 outputs a block; ours does
    not (inception_v3's and nasnetalarge's pools that stay on TVM's kernels)."""
    x = relax.Var("x", relax.TensorType((1, 192, 28, 28), "float32"))
    mod = _module(lambda bb: bb.emit(relax.op.nn.avg_pool2d(x, (3, 3), (1, 1), (1, 1, 1, 1))), [x])
    outputs = 192 * 28 * 28
    stock = [n for ns in _block_counts(_stock(mod)).values() for n in ns]
    ours = [n for ns in _block_counts(stages.lower(mod, SM90)).values() for n in ns]
    assert stock == [outputs]
    assert ours and max(ours) <= -(-outputs // THREADS)


def test_the_stock_schedule_is_one_variable_away_for_experiments(monkeypatch):
    """NIMBLE_STOCK_REDUCTION_SCHEDULES gives the stock block per output back (an A/B for GPU experiments)."""
    from tvm_nimble.relay_passes import schedules

    x = relax.Var("x", relax.TensorType((1, 192, 28, 28), "float32"))
    mod = _module(lambda bb: bb.emit(relax.op.nn.avg_pool2d(x, (3, 3), (1, 1), (1, 1, 1, 1))), [x])
    assert _block_counts(stages.lower(mod, SM90)) != _block_counts(_stock(mod))  # scheduled with the guard on
    monkeypatch.setenv(schedules.STOCK_REDUCTIONS_ENV, "1")  # the same kernel again: not the guarded schedule
    assert _block_counts(stages.lower(mod, SM90)) == _block_counts(_stock(mod))
    from tvm_nimble.compiler.timing_cache import context_of  # and its measurements are kept apart

    with_stock = context_of(SM90)
    monkeypatch.delenv(schedules.STOCK_REDUCTIONS_ENV)
    assert with_stock == {**context_of(SM90), "stock_schedules": ["reductions"]}


def _two_branches(bb, x, w):
    """Two depthwise convolutions of one input, each accumulating in fp32 and rounded to fp16 (the precision
    policy's form): independent kernels a multi-stream plan runs side by side."""
    outs = []
    for _ in range(2):
        y = bb.emit(relax.op.nn.conv2d(x, w, padding=[2, 2, 2, 2], groups=168, data_layout="NHWC",
                                       kernel_layout="OHWI", out_dtype="float32"))
        outs.append(bb.emit(relax.op.astype(y, "float16")))
    return bb.emit(relax.Tuple(outs))


def _passes_split_at_the_schedule():
    from tvm_nimble.relay_passes.pipeline import kernel_passes

    passes = kernel_passes(SM90, None, True, False)
    at = [i for i, p in enumerate(passes) if "ApplyDefaultSchedule" in p.info.name][0]
    return passes[:at], passes[at + 1:]


def test_a_short_reduction_with_its_epilogue_is_one_kernel_with_the_sum_in_a_register():
    """DLight's Fallback, which the guard used to leave these to, makes a reduction fused with its rounding cast two
    kernels with the fp32 sum in a global buffer between them, which TVM takes from its stream-unaware workspace
    pool (nasnetalarge's multi-stream CUDA graph read another kernel's sums: NaN). The pipeline's schedule is one
    kernel per function, nothing in global memory."""
    from tvm.s_tir import dlight as dl

    from tvm_nimble.relay_passes.schedules import allocates_global_buffers

    x = relax.Var("x", relax.TensorType((1, 42, 42, 168), "float16"))
    w = relax.Var("w", relax.TensorType((168, 5, 5, 1), "float16"))
    mod = _module(lambda bb: _two_branches(bb, x, w), [x, w])
    lowered = stages.lower(mod, SM90)
    convs = {gv.name_hint: f for gv, f in lowered.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint}
    assert convs and all(len(ns) == 1 for name, ns in _block_counts(lowered).items() if name in convs)
    assert not any(allocates_global_buffers(f) for f in convs.values())
    before, _ = _passes_split_at_the_schedule()
    with SM90:
        fused = tvm.transform.Sequential(before)(mod)
    fallback = [dl.gpu.Fallback().apply(f, SM90, False).mod["main"] for gv, f in fused.functions.items()
                if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint]
    assert fallback and all(allocates_global_buffers(f) for f in fallback)  # what the test guards against


def test_kernels_that_take_tvms_workspace_are_ordered_one_after_another():
    """Where a kernel still keeps an intermediate in global memory (Fallback's form), the plan must not run two of
    them at once: the lowered program orders them in program order although no data flows between them."""
    from tvm.s_tir import dlight as dl

    from tvm_nimble.relay_passes.lowered_ir import read_lowered_function

    x = relax.Var("x", relax.TensorType((1, 42, 42, 168), "float16"))
    w = relax.Var("w", relax.TensorType((168, 5, 5, 1), "float16"))
    mod = _module(lambda bb: _two_branches(bb, x, w), [x, w])
    before, after = _passes_split_at_the_schedule()

    def lowered_with(schedule):
        with SM90:
            return tvm.transform.Sequential(before + [schedule] + after)(mod)

    ours = read_lowered_function(stages.lower(mod, SM90))
    theirs = read_lowered_function(lowered_with(dl.ApplyDefaultSchedule(dl.gpu.Fallback())))
    conv = [k.index for k in theirs.kernels if "conv2d" in k.func]
    assert len(conv) == 2 and all(theirs.kernels[i].tvm_workspace for i in conv)
    assert (conv[0], conv[1]) in theirs.dependency_edges()
    mine = [k.index for k in ours.kernels if "conv2d" in k.func]
    assert not any(ours.kernels[i].tvm_workspace for i in mine)
    assert (mine[0], mine[1]) not in ours.dependency_edges()  # independent branches stay free to overlap


def test_a_pool_with_its_residual_add_is_one_kernel_too():
    """NASNet's ``avg_pool(x) + y`` in fp16: the pool's sum, its division, the casts and the add (TVM fuses them into
    one function) computed by one thread per output, in one kernel."""
    from tvm_nimble.relay_passes.schedules import allocates_global_buffers

    x = relax.Var("x", relax.TensorType((1, 42, 42, 168), "float16"))
    y = relax.Var("y", relax.TensorType((1, 42, 42, 168), "float16"))

    def body(bb):
        p = bb.emit(relax.op.nn.avg_pool2d(x, (3, 3), (1, 1), (1, 1, 1, 1), layout="NHWC", count_include_pad=False))
        return bb.emit(relax.op.add(p, y))

    lowered = stages.lower(_module(body, [x, y]), SM90)
    pools = {gv.name_hint: f for gv, f in lowered.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and "pool" in gv.name_hint}
    assert pools and all(len(_block_counts(lowered)[name]) == 1 for name in pools)
    assert not any(allocates_global_buffers(f) for f in pools.values())


def _vectorized(mod) -> dict[str, bool]:
    """Whether each scheduled kernel of ``mod`` has a vectorized loop, by PrimFunc name."""
    return {gv.name_hint: "T.vectorized" in func.script() for gv, func in mod.functions.items()
            if isinstance(func, tvm.tirx.PrimFunc)}


def _sources(module) -> list[str]:
    """The source of ``module`` and of every module it imports, recursively."""
    return [module.inspect_source()] + [s for m in module.imports for s in _sources(m)]


def test_a_large_element_wise_kernel_loads_and_stores_four_elements_a_thread():
    """A 16-bit decoder's SiLU-multiply ([512, 9728] in, [512, 4864] out), in each dtype, and as a model at batch 1 has
    it ([1, 512, 9728]: a unit axis the analysis drops from the loops): stock DLight gives each output a thread (2-byte
    accesses); ours gives each thread four consecutive outputs, and TVM's CUDA code loads and stores them as one
    half4 / nv_bfloat164 / float4."""
    from elementwise_modules import silu_multiply

    for dtype, vector, lead in (("float16", "half4", ()), ("bfloat16", "nv_bfloat164", ()), ("float32", "float4", ()),
                                ("float16", "half4", (1,)), ("bfloat16", "nv_bfloat164", (1,))):
        mod = silu_multiply(dtype, lead=lead)
        lowered = stages.lower(mod, SM90)
        assert list(_vectorized(lowered).values()) == [True], (dtype, lead)
        assert not any(_vectorized(_stock(mod)).values())
        assert list(_block_counts(lowered).values()) == [[512 * 4864 // (4 * THREADS)]]
        with cuda_compile.fatbin_compilation(tvm.target.Target(SM90)):  # nvcc for sm_90: no GPU needed
            cuda = [s for s in _sources(tvm.compile(lowered, target=SM90).mod) if "__global__" in s]
        assert len(cuda) == 1 and cuda[0].count(f"*({vector}*)(") == 3, (dtype, lead)  # two loads and the store


def test_a_rotary_embeddings_branch_taken_by_the_whole_vector_is_vectorized():
    """A decoder's rotary embedding (rotate-half: a concatenation of two halves, one negated) over [1, 16, 512, 64]: the
    half boundary (32) is a multiple of the four lanes, so each vector takes one side of the branch; TVM's CUDA code
    tests the condition once per thread and loads the side taken as one half4 / float4 (no per-element loop). With
    the boundary at 30 a vector would straddle it: DLight's schedule."""
    from elementwise_modules import rotary

    # vector accesses of the dtype: x, the two sides' loads and the store (and the float32 cos and sin in float32)
    for dtype, vector, accesses in (("float16", "half4", 4), ("float32", "float4", 6)):
        mod = rotary(dtype)
        lowered = stages.lower(mod, SM90)
        assert list(_vectorized(lowered).values()) == [True], dtype
        with cuda_compile.fatbin_compilation(tvm.target.Target(SM90)):
            cuda = [s for s in _sources(tvm.compile(lowered, target=SM90).mod) if "__global__" in s]
        body = cuda[0][cuda[0].rindex("__global__"):]
        assert f"{vector} condval;" in body and "for (" not in body, dtype
        assert body.count(f"*({vector}*)(") == accesses, dtype
    mod = rotary(split_at=30)
    assert not any(_vectorized(stages.lower(mod, SM90)).values())
    assert _block_counts(stages.lower(mod, SM90)) == _block_counts(_stock(mod))


def test_what_a_vector_could_misread_keeps_dlights_schedule():
    """A gate starting two columns in (a vector would straddle its alignment), a last axis not a multiple of four, too
    few outputs, and a select whose unchosen side could lie outside its buffer: scheduled as stock DLight does."""
    from elementwise_modules import silu_multiply

    for mod in (silu_multiply(gate_at=2), silu_multiply(width=4862), silu_multiply(rows=4, width=128),
                silu_multiply(gate_at=2, lead=(1,))):
        assert _block_counts(stages.lower(mod, SM90)) == _block_counts(_stock(mod))
        assert not any(_vectorized(stages.lower(mod, SM90)).values())
    x = relax.Var("x", relax.TensorType((512, 4864), "float16"))
    mod = _module(lambda bb: bb.emit(relax.op.where(relax.op.less(x, relax.const(0, "float16")),
                                                    relax.op.negative(x), x)), [x])
    lowered = stages.lower(mod, SM90)
    assert not any(_vectorized(lowered).values()) and _block_counts(lowered) == _block_counts(_stock(mod))


def test_the_stock_element_wise_schedule_is_one_variable_away(monkeypatch):
    """NIMBLE_STOCK_ELEMENTWISE_SCHEDULES gives DLight's Fallback back (the A/B of the vectorized schedule), and the
    timing cache keeps its measurements apart."""
    from elementwise_modules import silu_multiply
    from tvm_nimble.compiler.timing_cache import context_of
    from tvm_nimble.relay_passes import schedules

    mod = silu_multiply("float16")
    monkeypatch.setenv(schedules.STOCK_ELEMENTWISE_ENV, "1")
    assert _block_counts(stages.lower(mod, SM90)) == _block_counts(_stock(mod))
    with_stock = context_of(SM90)
    monkeypatch.delenv(schedules.STOCK_ELEMENTWISE_ENV)
    assert with_stock == {**context_of(SM90), "stock_schedules": ["elementwise"]}
    assert any(_vectorized(stages.lower(mod, SM90)).values())


def test_the_row_threads_switch_gives_normalizations_of_many_rows_t_threads_a_row(monkeypatch):
    """RMSNorm of a 0.5B decoder's 512 tokens (896 wide), GPT-2's LayerNorm (768) and a softmax over 256 keys of 1536
    rows: DLight gives each row a block of up to 512 threads; with ``NIMBLE_ROW_THREADS=T`` a block of T threads a row
    (a warp a row, two rows a block, for 32), and TVM's CUDA code sums a warp's lanes with shuffles. Few rows (197:
    ViT's tokens) or a row narrower than T keep DLight's; the switch is in the timing cache's context."""
    from elementwise_modules import row_norm
    from tvm_nimble.compiler.timing_cache import context_of

    cases = (("rms_norm", 512, 896), ("layer_norm", 512, 768), ("softmax", 1536, 256))
    stock = {case: _threads(stages.lower(row_norm(*case), SM90)) for case in cases + (("rms_norm", 197, 768),)}
    for case in stock:
        (bindings,) = stock[case].values()
        assert ("threadIdx.y", 2) not in bindings and max(n for axis, n in bindings if axis == "threadIdx.x") >= 256
    for threads in (32, 128, 512):
        monkeypatch.setenv("NIMBLE_ROW_THREADS", str(threads))
        assert context_of(SM90)["stock_schedules"] == [f"rows={threads}"]
        for kind, rows, width in cases:
            lowered = stages.lower(row_norm(kind, rows, width), SM90)
            (ours,) = _threads(lowered).values()
            if width < threads:
                assert [ours] == list(stock[kind, rows, width].values()), (kind, threads)
                continue
            per_block = 2 if threads == 32 else 1
            head = [("blockIdx.x", rows // per_block)] + [("threadIdx.y", 2)] * (per_block == 2)
            assert ours[:len(head) + 1] == head + [("threadIdx.x", threads)], (kind, threads)
            assert {n for axis, n in ours if axis == "threadIdx.x"} == {threads}, (kind, threads)
            with cuda_compile.fatbin_compilation(tvm.target.Target(SM90)):
                (cuda,) = [s for s in _sources(tvm.compile(lowered, target=SM90).mod) if "__global__" in s]
            assert "__shfl_down_sync" in cuda, (kind, threads)
        assert _threads(stages.lower(row_norm("rms_norm", 197, 768), SM90)) == stock["rms_norm", 197, 768]


def test_a_row_threads_value_that_is_no_block_size_is_one_line(monkeypatch):
    from tvm_nimble import env
    from tvm_nimble.errors import NimbleError

    for value in ("48", "2048", "x"):
        monkeypatch.setenv("NIMBLE_ROW_THREADS", value)
        with pytest.raises(NimbleError, match="NIMBLE_ROW_THREADS"):
            env.stock_schedules()
