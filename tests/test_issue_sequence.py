"""The GPU issue sequence as data: built once, executed by cuda_graph.issue, checked and simulated on CPU.

Dropping any wait, the fork or the join from the sequence must make the static checker and the
race simulator report it. ``cuda_graph.issue`` only executes this list; the real CUDA path is
tested on a GPU (tests/gpu, every executor mode against the ONNX reference).
"""
import numpy as np
import pytest

from tvm_nimble.runtime.issue import LAUNCH, RECORD, WAIT, Op, check_sequence, event_count, issue_sequence
from tvm_nimble.runtime.module import NimbleModule
from tvm_nimble.contract.plan import Launch, Plan, Storage, TensorSlot
from tvm_nimble.runtime.race_check import check_races

MULTI_STREAM = ["inception", "nasnet", "random_dag"]


def _built(name):
    from conftest import built

    return built(name)


def _first_bad_seed(b, ops, limit=300):
    for seed in range(limit):
        if check_races(b.module, b.inputs, b.reference, seeds=[seed], ops=ops):
            return seed
    return None


def test_every_zoo_sequence_implements_its_plan(zoo_built):
    plan = zoo_built.module.plan
    assert check_sequence(plan, issue_sequence(plan)) == []
    assert check_sequence(plan, issue_sequence(plan, single_stream=True), single_stream=True) == []
    assert check_races(zoo_built.module, zoo_built.inputs, zoo_built.reference, seeds=range(6)) == []


def test_sequence_layout_fork_launches_join():
    plan = _built("nasnet").module.plan
    ops = issue_sequence(plan)
    helpers = sorted({l.stream for l in plan.launches} - {0})
    fork = event_count(plan) - 1
    assert ops[0] == Op(RECORD, 0, fork, -1, "fork")
    assert ops[1:1 + len(helpers)] == [Op(WAIT, s, fork, -1, "fork") for s in helpers]
    join = ops[-2 * len(helpers):]
    assert join[0::2] == [Op(RECORD, s, plan.num_events + j, -1, "join") for j, s in enumerate(helpers)]
    assert join[1::2] == [Op(WAIT, 0, plan.num_events + j, -1, "join") for j in range(len(helpers))]
    body = ops[1 + len(helpers):-2 * len(helpers)]
    expected = []
    for l in plan.launches:
        expected += [Op(WAIT, l.stream, e, l.idx, "sync") for e in l.waits]
        expected += [Op(LAUNCH, l.stream, -1, l.idx)]
        expected += [Op(RECORD, l.stream, e, l.idx, "sync") for e in l.records]
    assert body == expected
    assert max(op.event for op in ops) < event_count(plan)
    single = issue_sequence(plan, single_stream=True)
    assert single == [Op(LAUNCH, 0, -1, l.idx) for l in plan.launches]


@pytest.mark.parametrize("name", MULTI_STREAM)
def test_dropping_any_wait_is_reported_by_checker_and_simulator(name):
    b = _built(name)
    plan = b.module.plan
    ops = issue_sequence(plan)
    waits = [k for k, op in enumerate(ops) if op.kind == WAIT and op.role == "sync"]
    assert waits
    for k in waits:
        dropped = ops[k]
        mutated = ops[:k] + ops[k + 1:]
        problems = check_sequence(plan, mutated)
        assert any(f"launch {dropped.launch} may start before" in p and "wait is missing" in p for p in problems), \
            (dropped, problems)
        assert _first_bad_seed(b, mutated) is not None, f"the simulator missed the dropped {dropped}"


@pytest.mark.parametrize("name", ["nasnet", "random_dag"])  # their output is written on a helper stream
def test_dropping_the_join_is_reported_by_checker_and_simulator(name):
    b = _built(name)
    plan = b.module.plan
    ops = issue_sequence(plan)
    for mutated in ([op for op in ops if op.role != "join"],
                    [op for op in ops if not (op.role == "join" and op.kind == WAIT)]):
        problems = check_sequence(plan, mutated)
        assert any("is not joined into the main stream" in p for p in problems), problems
        assert _first_bad_seed(b, mutated) is not None


def test_dropping_one_join_wait_is_reported():
    b = _built("nasnet")
    plan = b.module.plan
    ops = issue_sequence(plan)
    out_stream = next(l.stream for l in plan.launches if plan.outputs[0] in l.writes)
    assert out_stream != 0
    k = max(i for i, op in enumerate(ops) if op.role == "join" and op.kind == RECORD and op.stream == out_stream)
    mutated = ops[:k + 1] + ops[k + 2:]  # the main stream no longer waits on the output's stream
    assert any(f"stream {out_stream} is not joined" in p for p in check_sequence(plan, mutated))
    assert _first_bad_seed(b, mutated) is not None


def test_a_wait_issued_before_its_record_waits_for_nothing():
    plan = _built("inception").module.plan
    ops = issue_sequence(plan)
    k = next(i for i, op in enumerate(ops) if op.kind == WAIT and op.role == "sync")
    rec = max(i for i in range(k) if ops[i].kind == RECORD and ops[i].event == ops[k].event)
    mutated = ops[:rec] + [ops[k]] + ops[rec:k] + ops[k + 1:]  # the wait moved before the record in host order
    problems = check_sequence(plan, mutated)
    assert any("before any record of it is issued" in p for p in problems)
    assert any("wait is missing" in p for p in problems)


def test_a_launch_on_the_wrong_stream_or_missing_is_reported():
    plan = _built("inception").module.plan
    ops = issue_sequence(plan)
    k = next(i for i, op in enumerate(ops) if op.kind == LAUNCH and op.stream == 1)
    moved = ops[:k] + [ops[k]._replace(stream=2)] + ops[k + 1:]
    assert any("the plan puts it on 1" in p for p in check_sequence(plan, moved))
    assert any("is never issued" in p for p in check_sequence(plan, ops[:k] + ops[k + 1:]))


# ---- a two-branch plan whose helper stream reads the input and writes an output ----------------------

def _py_kernel(fn):
    def kernel(*args):
        *ins, out = args
        out.copyfrom(fn(*[t.numpy() for t in ins]).astype(out.dtype))
    return kernel


def _two_branch_module():
    """x -> relu -> y0 on the main stream, x -> neg -> y1 on stream 1: nothing but the fork orders
    stream 1 after the input copy, nothing but the join orders the host's read after it."""
    t = [TensorSlot(0, "x", [4, 8], "float32", "input", 0), TensorSlot(1, "y0", [4, 8], "float32", "output", 1),
         TensorSlot(2, "y1", [4, 8], "float32", "output", 2)]
    plan = Plan(target={"kind": "llvm"}, num_streams=2, num_events=0, tensors=t,
                storages=[Storage(i, 128, k) for i, k in enumerate(("input", "output", "output"))],
                launches=[Launch(0, "relu", [0, 1], [1], 0), Launch(1, "neg", [0, 2], [2], 1)],
                inputs=[0], outputs=[1, 2], constants=[])
    plan.validate()
    kernels = {"relu": _py_kernel(lambda x: np.maximum(x, 0)), "neg": _py_kernel(lambda x: -x)}
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(4, 8)
    return NimbleModule(plan, kernels, {}), {"x": x}, [np.maximum(x, 0), -x]


def test_dropping_the_fork_or_the_join_of_a_helper_stream_that_reads_inputs():
    module, inputs, reference = _two_branch_module()
    plan = module.plan
    ops = issue_sequence(plan)
    assert check_sequence(plan, ops) == []
    assert check_races(module, inputs, reference, seeds=range(30)) == []
    no_fork = [op for op in ops if op.role != "fork"]
    assert any("launch 1 (stream 1) may start before the run begins" in p for p in check_sequence(plan, no_fork))
    assert check_races(module, inputs, reference, seeds=range(30), ops=no_fork) != []
    no_join = [op for op in ops if op.role != "join"]
    assert any("stream 1 is not joined" in p for p in check_sequence(plan, no_join))
    assert check_races(module, inputs, reference, seeds=range(30), ops=no_join) != []
