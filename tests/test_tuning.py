"""Tiny MetaSchedule runs on CPU: a database is written, resumed and applied; trials go to the heaviest task."""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper

from tvm_nimble import NimbleExecutor, build
from tvm_nimble.cli.tune import OVERRUN_EXIT_CODE
from tvm_nimble.compiler.tuning.rounds import plan_round, trials_that_fit
from tvm_nimble.compiler.tuning.tasks import extract_tuning_tasks
from tvm_nimble.compiler.tuning.tune import tune


def one_kernel_model():
    """Conv + Relu: a single fused kernel, so the tiny tuning run has exactly one task."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.2).astype("float32"), "w")
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["output"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 8, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_then_transpose_model():
    """A large Conv and a Transpose that does not fuse into it: two kernels, one far heavier."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype("float32"), "w")
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["output"], perm=[0, 2, 3, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 16, 32, 32])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 32, 32, 16])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


_KW = dict(trials_per_round=1, strategy="replay-trace", cost_model="random", progress=False)


def _records(db) -> list[str]:
    return open(os.path.join(db, "database_tuning_record.json")).read().splitlines()


@pytest.fixture(scope="module")
def tiny_tuning(tmp_path_factory):
    """:func:`one_kernel_model` tuned in two runs, one trial, then a budget of two (the second continues from the
    database): (the first run's report, the records after it, the second run's report, the database). Each run
    starts MetaSchedule's builder workers (most of its ~20 s on a 2-core machine), so the tests that need such a
    database share these; each works on a copy of it."""
    db = str(tmp_path_factory.mktemp("tiny") / "db")
    first = tune(one_kernel_model(), "llvm", db, trials_per_task=1, **_KW)
    after_first = _records(db)
    second = tune(one_kernel_model(), "llvm", db, trials_per_task=2, **_KW)
    return first, after_first, second, db


def _copy_of(db: str, tmp_path) -> str:
    return shutil.copytree(db, str(tmp_path / "db"))


def test_tiny_tuning_resumes_and_is_applied(tiny_tuning, tmp_path):
    model = one_kernel_model()
    first, records, second, shared_db = tiny_tuning
    assert first.trials_this_run == 1 and first.tuned == len(first.tasks) == 1
    assert len(records) == 1
    # a second run with a larger budget continues from the database: only the missing trial runs
    assert second.trials_this_run == 1 and second.tasks[0]["trials"] == 2
    assert second.tasks[0]["best_us"] is not None, "no trial was measured successfully"
    db = _copy_of(shared_db, tmp_path)
    assert len(_records(db)) == 2
    # a run whose budget is already met does no work
    assert tune(model, "llvm", db, trials_per_task=2, **_KW).trials_this_run == 0
    summary = json.load(open(os.path.join(db, "tuning_summary.json")))
    assert summary["tasks"][0]["trials"] == 2

    default = build(model, "llvm")
    tuned = build(model, "llvm", tuning_db=db)
    kernel = default.plan.launches[0].kernel
    assert not tvm_ffi.structural_equal(default.annotated_mod[kernel], tuned.annotated_mod[kernel])
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype("float32")
    np.testing.assert_allclose(NimbleExecutor(tuned)(x)[0].numpy(), NimbleExecutor(default)(x)[0].numpy(),
                               rtol=1e-4, atol=1e-4)


def test_trials_go_to_the_heaviest_task_first(tmp_path):
    from tvm.s_tir.analysis import estimate_tir_flops

    model = conv_then_transpose_model()
    _, tasks = extract_tuning_tasks(model, "llvm")
    assert len(tasks) >= 2
    cost = {t.task_name: t.weight * estimate_tir_flops(t.dispatched[0]) for t in tasks}  # calls x FLOPs
    heaviest = max(cost, key=cost.get)
    assert "conv" in heaviest and sorted(cost.values())[-2] < cost[heaviest] / 100

    db = str(tmp_path / "db")
    kw = dict(trials_per_iter=1, strategy="replay-trace", cost_model="random", progress=False)
    # a budget of one trial in all: it goes to the heaviest task
    first = tune(model, "llvm", db, trials_per_task=2, total_trials=1, **kw)
    assert first.trials_this_run == 1 and first.stopped_for_trials
    assert {t["name"]: t["trials"] for t in first.tasks} == {n: int(n == heaviest) for n in cost}
    share = {t["name"]: t["share"] for t in first.tasks}
    assert max(share, key=share.get) == heaviest and abs(sum(share.values()) - 1) < 1e-6
    # the next run tunes the rest, several tasks per MetaSchedule call, and never passes a task's cap
    second = tune(model, "llvm", db, trials_per_task=2, **kw)
    assert second.trials_this_run == 2 * len(cost) - 1 and not second.stopped_for_trials
    assert all(t["trials"] == 2 for t in second.tasks)
    assert "share" in second.summary()


def test_round_planning():
    """Round sizes: a round holds the heaviest tasks, honours each task's cap and fits the time left."""
    tasks, q = plan_round([2, 1, 0], remaining=[64, 64, 64], trials_per_iter=8, room=16)
    assert tasks == [2, 1] and q == 8
    tasks, q = plan_round([2, 0, 1], remaining=[3, 64, 64], trials_per_iter=8, room=16)
    assert tasks == [2, 0] and q == 3  # one call shares one per-task cap
    tasks, q = plan_round([0, 1], remaining=[64, 64], trials_per_iter=64, room=10)
    assert tasks == [0] and q == 10
    # a round is predicted no cheaper than any past round, and proportionally longer when larger
    assert trials_that_fit(125, [(10, 8), (20, 64)]) == 80  # 100 s after the safety margin: 10 x (10 s, 8)
    assert trials_that_fit(20, [(10, 8), (20, 64)]) == 0
    assert 0 < trials_that_fit(300, []) < trials_that_fit(600, [])  # before any round: the prior


def test_an_empty_database_builds_the_default_kernels(tmp_path):
    """A slice that measured nothing leaves empty database files; stock TVM and Nimble still build from them
    (regression: an empty MetaSchedule Database is falsy, and the stock pipeline then ran without it)."""
    from tvm_nimble.compiler.target import resolve_target
    from tvm_nimble.compiler.tuning.database import open_tuning_database
    from tvm_nimble.compiler.frontend import from_onnx
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm

    import tvm

    db_dir = tmp_path / "db"
    db_dir.mkdir()
    for name in ("database_workload.json", "database_tuning_record.json"):
        (db_dir / name).write_text("")
    model = one_kernel_model()
    x = np.random.default_rng(2).standard_normal((1, 4, 8, 8)).astype("float32")
    t = resolve_target("llvm")
    vm = StockVM(build_stock_vm(from_onnx(model), t, tuning_database=open_tuning_database(str(db_dir))),
                 tvm.cpu(0), [x])
    vm()
    ref = StockVM(build_stock_vm(from_onnx(model), t), tvm.cpu(0), [x])
    ref()
    nimble = NimbleExecutor(build(model, "llvm", tuning_db=str(db_dir)))(x)[0].numpy()
    np.testing.assert_allclose(vm.outputs()[0], ref.outputs()[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nimble, ref.outputs()[0], rtol=1e-5, atol=1e-5)


def test_bench_compares_tuned_with_untuned_in_one_run(tiny_tuning, tmp_path):
    """`bench --tuning-db DB --with-untuned`: two runs whose rows carry the kernels and the database's trial
    count as columns, and a tuning table whose ratios are those of the CSV's medians."""
    import csv

    import onnx

    from tvm_nimble.cli.bench import main as bench_main

    model = one_kernel_model()
    path = str(tmp_path / "one.onnx")
    onnx.save(model, path)
    db = _copy_of(tiny_tuning[3], tmp_path)  # the model tuned with two trials (the tiny tuning's database)
    out = tmp_path / "bench"
    bench_main(["--onnx", path, "--models", "", "--target", "llvm", "--rounds", "1", "--iters", "3",
                "--tuning-db", db, "--with-untuned", "--out", str(out)])
    rows = list(csv.DictReader(open(out / "results.csv")))
    by = {(r["kernels"], r["system"]): float(r["median_ms"]) for r in rows}
    assert {(r["model"], r["kernels"], r["db_trials"]) for r in rows} == {("one.onnx", "tvm-default", "2"),
                                                                         ("one.onnx", "tvm-tuned", "2")}
    md = (out / "RESULTS.md").read_text()
    line = next(l for l in md.splitlines() if l.startswith("| ") and "| one.onnx | 1 | float32 | 2 |" in l)
    cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
    u_tvm, t_tvm = by[("tvm-default", "tvm-vm")], by[("tvm-tuned", "tvm-vm")]
    t_nimble = by[("tvm-tuned", "nimble-aot-cpu")]
    assert cells[5:7] == [f"{u_tvm:.3f}", f"{t_tvm:.3f}"]
    assert cells[9] == f"{u_tvm / t_tvm:.2f}x" and cells[10] == f"{t_tvm / t_nimble:.2f}x"


def test_with_untuned_needs_a_database():
    from tvm_nimble.cli.bench import main as bench_main

    with pytest.raises(SystemExit) as e:
        bench_main(["--models", "incept6", "--with-untuned"])
    assert e.value.code == 2


_STUCK = """
import sys, time
from tvm_nimble.cli.tune import overrun_watchdog
with overrun_watchdog(time.time() + 1.0, grace_s=1.0, work_dir="DB"):
    time.sleep(float(sys.argv[1]))  # a round that does not return in time (or does)
time.sleep(3.0)  # past deadline + grace: the watchdog must be disarmed once the block has ended
print("finished")
"""


@pytest.mark.parametrize("round_s, stuck", [(60.0, True), (0.1, False)])
def test_overrun_watchdog_ends_only_a_stuck_run(round_s, stuck):
    """The CLI's backstop for a MetaSchedule call that ignores the time budget: exit code 3 with a message
    naming the database, instead of hanging; a run whose rounds return in time is left alone."""
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", _STUCK, str(round_s)], capture_output=True, text=True, timeout=120)
    if stuck:
        assert r.returncode == OVERRUN_EXIT_CODE, r.stderr
        assert "past the time budget" in r.stderr and "committed in DB" in r.stderr
        assert "finished" not in r.stdout and time.time() - t0 < round_s
    else:
        assert r.returncode == 0 and r.stdout.strip() == "finished", r.stderr
