"""The GPU issue sequence as data: built once, executed by cuda_graph.issue, checked and simulated on CPU.

Dropping any wait, the fork or the join from the sequence must make the static checker and the
race simulator report it; the CUDA issue path itself runs here against a fake CUDA runtime that
logs every call, so the executor's GPU modes are exercised without a GPU.
"""
import contextlib
import copy

import numpy as np
import pytest
import tvm

from tvm_nimble.runtime import cuda_graph
from tvm_nimble.runtime.issue import LAUNCH, RECORD, WAIT, Op, check_sequence, event_count, issue_sequence
from tvm_nimble.runtime.module import NimbleModule
from tvm_nimble.runtime.plan import Launch, Plan, Storage, TensorSlot
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


# ---- the CUDA issue path on a fake CUDA runtime ----------------------------------------------------

class FakeCuda:
    """Enough of cuda.bindings.runtime for cuda_graph: logs calls; a captured graph replays its kernels."""

    class cudaError_t:  # noqa: N801 (the CUDA spelling)
        cudaSuccess = 0

    class cudaStreamCaptureMode:  # noqa: N801
        cudaStreamCaptureModeRelaxed = 2

    cudaStreamNonBlocking = 1
    cudaEventDisableTiming = 2
    cudaEventDefault = 0
    cudaEventRecordExternal = 1

    def __init__(self):
        self.log, self.next_handle, self.current = [], 100, None
        self.capturing, self.captured, self.graphs = None, None, {}

    def _new(self):
        self.next_handle += 1
        return self.next_handle

    def cudaGetErrorName(self, err):
        return 0, b"cudaErrorFake"

    def cudaStreamCreate(self):
        return 0, self._new()

    def cudaStreamCreateWithFlags(self, flags):
        return 0, self._new()

    def cudaStreamDestroy(self, s):
        return (0,)

    def cudaEventCreateWithFlags(self, flags):
        return 0, self._new()

    def cudaEventDestroy(self, e):
        return (0,)

    def _emit(self, entry):
        (self.captured if self.capturing is not None else self.log).append(entry)

    def cudaEventRecord(self, e, s):
        self._emit(("record", e, s))
        return (0,)

    def cudaEventRecordWithFlags(self, e, s, flags):
        self._emit(("timing", e, s))
        return (0,)

    def cudaStreamWaitEvent(self, s, e, flags):
        self._emit(("wait", s, e))
        return (0,)

    def launch(self, name, fn, args):
        entry = ("launch", name, self.current)
        if self.capturing is not None:
            self.captured.append(entry + ((fn, args),))
        else:
            self.log.append(entry)
            fn(*args)

    def cudaStreamBeginCapture(self, s, mode):
        self.capturing, self.captured = s, []
        return (0,)

    def cudaStreamEndCapture(self, s):
        assert s == self.capturing
        graph = self._new()
        self.graphs[graph], self.capturing = self.captured, None
        return 0, graph

    def cudaGraphInstantiate(self, graph, flags):
        return 0, graph

    def cudaGraphLaunch(self, graph, s):
        self.log.append(("graph", graph, s))
        for entry in self.graphs[graph]:
            if entry[0] == "launch":
                fn, args = entry[3]
                fn(*args)
        return (0,)

    def cudaGraphExecDestroy(self, g):
        return (0,)

    def cudaGraphDestroy(self, g):
        return (0,)

    def cudaStreamSynchronize(self, s):
        self.log.append(("sync", s))
        return (0,)

    def cudaEventElapsedTime(self, a, b):
        return 0, 0.0

    @contextlib.contextmanager
    def use_raw_stream(self, device, handle):
        before, self.current = self.current, handle
        try:
            yield
        finally:
            self.current = before


def _translate(ops, plan, streams, events):
    """The CUDA calls ``ops`` stand for, in the fake's log format."""
    out = []
    for op in ops:
        s = int(streams[op.stream])
        if op.kind == LAUNCH:
            out.append(("launch", plan.launches[op.launch].kernel, s))
        elif op.kind == WAIT:
            out.append(("wait", s, events[op.event]))
        else:
            out.append(("record", events[op.event], s))
    return out


@pytest.fixture
def fake_cuda(monkeypatch):
    import tvm_ffi

    fake = FakeCuda()
    monkeypatch.setattr(cuda_graph, "_rt", lambda: fake)
    monkeypatch.setattr(tvm_ffi, "use_raw_stream", fake.use_raw_stream)
    monkeypatch.setattr("tvm_nimble.runtime.executor.device_for", lambda target, device=None: tvm.cpu(0))
    return fake


def _cuda_module(b, fake):
    """The llvm build of ``b`` posing as a CUDA artifact whose kernels launch through the fake."""
    plan = copy.deepcopy(b.module.plan)
    plan.target = {"kind": "cuda", "arch": "sm_90"}
    names = {l.kernel for l in plan.launches}
    kernels = {n: (lambda fn, n: lambda *a: fake.launch(n, fn, a))(b.module.kernels[n], n) for n in names}
    return NimbleModule(plan, kernels, b.module.params)


def test_cuda_issue_executes_exactly_the_sequence(fake_cuda):
    b = _built("nasnet")
    plan = b.module.plan
    ops = issue_sequence(plan)
    module = _cuda_module(b, fake_cuda)
    streams = cuda_graph.StreamSet(plan.num_streams)
    events = cuda_graph.create_events(event_count(plan))
    funcs = [module.kernels[l.kernel] for l in plan.launches]
    from tvm_nimble.runtime.device import Workspace

    ws = Workspace(plan, b.module.params, tvm.cpu(0))
    cuda_graph.issue(ops, funcs, ws.launch_args(), tvm.cpu(0), streams, events)
    assert fake_cuda.log == _translate(ops, plan, streams.streams, events)
    # with timing events every launch is bracketed on its own stream
    fake_cuda.log.clear()
    pairs = [(1000 + 2 * i, 1001 + 2 * i) for i in range(len(plan.launches))]
    cuda_graph.issue(ops, funcs, ws.launch_args(), tvm.cpu(0), streams, events, timing_events=pairs, in_capture=True)
    k = next(i for i, e in enumerate(fake_cuda.log) if e[0] == "launch")
    assert fake_cuda.log[k - 1] == ("timing", pairs[0][0], streams.streams[plan.launches[0].stream])
    assert fake_cuda.log[k + 1] == ("timing", pairs[0][1], streams.streams[plan.launches[0].stream])
    assert [e for e in fake_cuda.log if e[0] != "timing"] == _translate(ops, plan, streams.streams, events)


@pytest.mark.parametrize("mode", ["cuda-graph", "single-stream", "streams"])
def test_executor_gpu_modes_on_a_fake_cuda_runtime(fake_cuda, mode):
    from tvm_nimble import NimbleExecutor

    b = _built("nasnet")
    module = _cuda_module(b, fake_cuda)
    plan = module.plan
    single = mode == "single-stream"
    with NimbleExecutor(module, mode=mode) as ex:
        expected = _translate(issue_sequence(plan, single_stream=single), plan, ex._streams.streams, ex._events)
        live = fake_cuda.log[:len(expected)]
        assert live == expected  # the warm-up run before the capture
        if mode != "streams":
            assert [e[:3] for e in fake_cuda.graphs[ex._graph.graph]] == expected  # the graph holds exactly that
        fake_cuda.log.clear()
        out = [o.numpy() for o in ex(*b.inputs.values())]
        np.testing.assert_allclose(out[0], b.reference[0], rtol=1e-4, atol=1e-4)
        calls = [e for e in fake_cuda.log if e[0] != "sync"]
        if mode == "streams":
            assert calls == expected
        else:
            assert calls == [("graph", ex._graph.exec, ex._streams.streams[0])]  # a run is one graph launch
        if mode != "single-stream":
            rows = ex.profile()
            assert [r[:3] for r in rows] == [(l.idx, l.stream, l.kernel) for l in plan.launches]
