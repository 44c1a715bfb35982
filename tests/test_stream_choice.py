"""max_streams='auto' and memory_budget on CPU: candidates, the budget, the one-line errors.

Measuring needs a GPU (tests/gpu checks the measured choice); without one, auto keeps the widest
schedule that fits the budget, which is what is checked here against schedules built with each cap.
"""
import subprocess
import sys

import pytest

from tvm_nimble import zoo
from tvm_nimble.compiler.build import build
from tvm_nimble.errors import NimbleError


def _pool(model, cap):
    return build(model, "llvm", max_streams=cap, compile_kernels=False).plan.memory["pool_bytes"]


@pytest.mark.parametrize("name", ["inception", "nasnet"])
def test_auto_keeps_the_widest_schedule_that_fits_the_budget(name):
    model = zoo.get_model(name)
    widest = build(model, "llvm", max_streams=None, compile_kernels=False)
    auto = build(model, "llvm", compile_kernels=False)
    assert auto.plan.num_streams == widest.plan.num_streams and widest.plan.num_streams > 2
    record = auto.report.stream_choice
    assert record.how.startswith("widest") and record.chosen == widest.plan.num_streams
    pools = {c.max_streams: c.pool_bytes for c in record.candidates}
    assert pools[1] == _pool(model, 1) and pools[2] == _pool(model, 2)  # candidates are the capped schedules
    budget = min(pools.values())
    fitting = [cap for cap, b in pools.items() if b <= budget]
    chosen = build(model, "llvm", compile_kernels=False, memory_budget=budget)
    assert chosen.plan.memory["pool_bytes"] <= budget
    assert chosen.report.stream_choice.chosen == max(fitting)


def test_budgets_that_nothing_fits_are_one_clear_error():
    model = zoo.get_model("inception")
    with pytest.raises(NimbleError, match="no schedule's memory pool fits the budget of 16 bytes.*--memory-budget"):
        build(model, "llvm", compile_kernels=False, memory_budget=16)
    with pytest.raises(NimbleError, match="over the budget of 16: use max_streams='auto'"):
        build(model, "llvm", max_streams=2, compile_kernels=False, memory_budget=16)
    with pytest.raises(NimbleError, match="max_streams must be an integer >= 1, None or 'auto'"):
        build(model, "llvm", max_streams="fast", compile_kernels=False)


def test_cli_memory_budget_and_max_streams(tmp_path):
    path = zoo.save(zoo.get_model("inception"), tmp_path / "incept.onnx")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tvm_nimble.cli", *args], capture_output=True, text=True, timeout=600)

    r = cli("explain", path, "--memory-budget", "1K")
    assert r.returncode == 1 and "no schedule's memory pool fits the budget of 1024 bytes" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("explain", path, "--max-streams", "0")
    assert r.returncode == 2 and "expected a positive integer, 'max' or 'auto'" in r.stderr
    r = cli("explain", path, "--max-streams", "1")
    assert r.returncode == 0 and "streams: 1" in r.stdout
    r = cli("explain", path, "--memory-budget", "1G")
    assert r.returncode == 0 and "stream cap: " in r.stdout
