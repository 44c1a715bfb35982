"""DLight's default schedules from worker processes (``relay_passes.schedule_pool``): the very functions this
process's rules give, names included (the CUDA source, and so the compiled-kernel cache's keys, must not depend on
where a kernel was scheduled), and a worker that fails costs time, never a kernel. Kernels only (lowered for
sm_90, no GPU); the reference is DLight's rules applied in this process."""
import psutil
import pytest
import tvm

from tvm_nimble import zoo
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.compiler.stages import apply_precision, lower
from tvm_nimble.relay_passes import schedule_pool
from tvm_nimble.relay_passes.pipeline import default_schedule_rules, fusion_passes, run_passes
from tvm_nimble.relay_passes.schedules import PROCESS_SCHEDULES, ScheduleCache

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


def _fused_kernels(model, precision: str) -> list:
    """The model's fused, unscheduled kernels for sm_90 in ``precision``."""
    mod = apply_precision(from_onnx(model), BuildOptions(target=CUDA, precision=precision))
    mod = run_passes(fusion_passes(CUDA), mod, CUDA)
    return [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def _rules():
    return default_schedule_rules(CUDA, ())


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None
                                         and tvm.ir.save_json(a) == tvm.ir.save_json(b))


@pytest.fixture(scope="module")
def pool():
    p = schedule_pool.SchedulePool(2)
    yield p
    p.close()


@pytest.mark.parametrize("name,precision", [("densenet", "fp32"), ("bert", "fp16")])
def test_the_workers_schedule_every_kernel_as_this_process_does(pool, name, precision):
    """A CNN in fp32 and a transformer in fp16 (DLight tensorizes its matmuls): every kernel the pool scheduled is
    the function DLight's guarded rules make here, JSON for JSON, and each distinct kernel is scheduled once."""
    funcs = _fused_kernels(getattr(zoo, name)(), precision)
    assert len(funcs) >= schedule_pool.MIN_PARALLEL
    rules, key = _rules()
    here = ScheduleCache().schedule_all(funcs, CUDA, rules, key)
    cache = ScheduleCache()
    there = cache.schedule_all(funcs, CUDA, rules, key, pool=pool)
    assert not pool.closed
    assert all(_same(a, b) for a, b in zip(here, there, strict=True))
    assert sum(a is not None for a in there) > len(funcs) // 2
    distinct = {tvm.ir.save_json(f) for f in funcs}
    assert cache.scheduled == len(distinct) and cache.reused == len(funcs) - len(distinct)


def test_a_worker_that_fails_costs_time_not_kernels(caplog):
    """A request the workers refuse (rules this process does not have) is a WorkerError; workers killed before a
    module's kernels: this process schedules them all, the same kernels, and says so. Either way the pool is closed
    for good."""
    funcs = _fused_kernels(zoo.densenet(), "fp32")
    rules, key = _rules()
    here = ScheduleCache().schedule_all(funcs, CUDA, rules, key)

    refusing = schedule_pool.SchedulePool(2)
    with pytest.raises(schedule_pool.WorkerError, match="rules"):
        refusing.schedule([tvm.ir.save_json(f) for f in funcs], CUDA, ("NotARule",), ())
    assert refusing.failed

    killed = schedule_pool.SchedulePool(2)
    killed.warm()
    workers = psutil.Process().children()
    assert len(workers) >= 2
    for w in workers:
        if schedule_pool.WORKER_MODULE in w.cmdline():
            w.kill()
    with caplog.at_level("WARNING", logger="tvm_nimble"):
        again = ScheduleCache().schedule_all(funcs, CUDA, rules, key, pool=killed)
    assert killed.failed
    assert "DLight's schedules in this process from now on" in caplog.text  # said once, in one line
    assert all(_same(a, b) for a, b in zip(here, again, strict=True))


def test_a_build_with_a_process_pool_lowers_the_module_a_serial_one_does(monkeypatch):
    """The pipeline's schedule pass with the process's pool (TVM_NIMBLE_JOBS=3: two workers) gives the lowered
    module the pass gives without one (TVM_NIMBLE_JOBS=1), script for script."""
    model = zoo.inception()
    monkeypatch.setenv("TVM_NIMBLE_JOBS", "1")
    PROCESS_SCHEDULES.clear()
    assert schedule_pool.pool_size() == 0
    serial = lower(from_onnx(model), CUDA)
    monkeypatch.setenv("TVM_NIMBLE_JOBS", "3")
    PROCESS_SCHEDULES.clear()
    pool = schedule_pool.process_pool()
    assert pool is not None and pool.workers == 2
    try:
        pooled = lower(from_onnx(model), CUDA)
        assert not pool.failed and PROCESS_SCHEDULES.scheduled >= schedule_pool.MIN_PARALLEL
    finally:
        pool.close()
        PROCESS_SCHEDULES.clear()
    assert pooled.script() == serial.script()
