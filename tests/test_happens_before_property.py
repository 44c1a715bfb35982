"""codegen.happens_before against an independent transitive closure (networkx), on random plans;
and the runtime's issue sequence against both: it orders launches exactly as the plan says."""
import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_nimble.codegen.happens_before import happens_before, plan_happens_before
from tvm_nimble.runtime.issue import LAUNCH, ancestors, check_sequence, issue_sequence
from tvm_nimble.contract.plan import Launch, Plan, Storage, TensorSlot


@st.composite
def schedules(draw, max_launches=14, max_streams=4):
    """Launches on random streams; each may wait on events recorded earlier (possibly re-recorded)."""
    n = draw(st.integers(1, max_launches))
    num_streams = draw(st.integers(1, max_streams))
    num_events = draw(st.integers(0, 6))
    streams, waits, records = [], [], []
    recorded: set[int] = set()
    for _ in range(n):
        streams.append(draw(st.integers(0, num_streams - 1)))
        waits.append(sorted(draw(st.sets(st.sampled_from(sorted(recorded)), max_size=3))) if recorded else [])
        recs = sorted(draw(st.sets(st.integers(0, num_events - 1), max_size=2))) if num_events else []
        records.append(recs)
        recorded.update(recs)
    return streams, waits, records


def closure_reference(streams, waits, records) -> list[set[int]]:
    """Launches that happen before each launch: networkx's transitive closure of stream order plus
    record -> wait edges (a wait binds to the event's latest record issued before it)."""
    g = nx.DiGraph()
    g.add_nodes_from(range(len(streams)))
    last_on_stream, last_record = {}, {}
    for i, s in enumerate(streams):
        if s in last_on_stream:
            g.add_edge(last_on_stream[s], i)
        for e in waits[i]:
            g.add_edge(last_record[e], i)
        last_on_stream[s] = i
        for e in records[i]:
            last_record[e] = i
    tc = nx.transitive_closure_dag(g)
    return [set(tc.predecessors(i)) for i in range(len(streams))]


def _bits(mask: int) -> set[int]:
    return {i for i in range(mask.bit_length()) if mask >> i & 1}


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_happens_before_equals_networkx_transitive_closure(schedule):
    streams, waits, records = schedule
    got = [_bits(m) for m in happens_before(streams, waits, records)]
    assert got == closure_reference(streams, waits, records)


def _plan(streams, waits, records) -> Plan:
    """A valid Plan with this schedule (each event recorded once, as Plan.validate requires)."""
    first: dict[int, int] = {}
    recs = []
    for i, r in enumerate(records):
        recs.append([e for e in r if e not in first])
        for e in recs[-1]:
            first[e] = i
    waits = [[e for e in w if e in first and first[e] < i] for i, w in enumerate(waits)]
    n = len(streams)
    tensors = [TensorSlot(i, f"t{i}", [1], "float32", "intermediate", 0) for i in range(n)]
    launches = [Launch(i, "k", [i], [i], streams[i], waits[i], recs[i]) for i in range(n)]
    plan = Plan(target={"kind": "llvm"}, num_streams=max(streams) + 1, num_events=max([e + 1 for e in first] or [0]),
                tensors=tensors, storages=[Storage(0, 4, "pool")], launches=launches, inputs=[], outputs=[],
                constants=[])
    plan.validate()
    return plan


@settings(max_examples=200, deadline=None)
@given(schedules())
def test_issue_sequence_orders_launches_exactly_as_the_plan(schedule):
    plan = _plan(*schedule)
    ops = issue_sequence(plan)
    assert check_sequence(plan, ops) == []
    anc = ancestors(ops)
    pos = {op.launch: k for k, op in enumerate(ops) if op.kind == LAUNCH}
    seq = [{j for j, p in pos.items() if anc[pos[i]] >> p & 1} for i in range(len(plan.launches))]
    assert seq == [_bits(m) for m in plan_happens_before(plan)]
