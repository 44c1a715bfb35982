"""The launch plan: JSON round trip, validation of corrupted plans, the human-readable table."""
import json

import pytest

from tvm_nimble.contract.plan import Plan, PlanError


def test_json_round_trip(zoo_built):
    plan = zoo_built.module.plan
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert json.loads(again.to_json()) == json.loads(plan.to_json())


def test_table_has_one_line_per_launch(inception_built):
    plan = inception_built.module.plan
    table = plan.format_table().splitlines()
    assert len(table) == len(plan.launches) + 2
    for launch, line in zip(plan.launches, table[1:]):
        assert line.split()[:3] == [str(launch.idx), str(launch.stream), launch.kernel]


def _corrupt(plan, edit):
    data = json.loads(plan.to_json())
    edit(data)
    return json.dumps(data)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d.update(format="something"), "not a tvm-nimble plan"),
    (lambda d: d["tensors"][3].update(storage=10**6), "missing storage"),
    (lambda d: d["tensors"][3].update(shape=[10**9]), "overflows storage"),
    (lambda d: d["tensors"][3].update(dtype="float7"), "unsupported dtype"),
    (lambda d: d["launches"][0].update(stream=99), "stream 99"),
    (lambda d: d.update(num_streams="4"), "expected an integer"),
    (lambda d: d.pop("launches"), "missing or has a malformed field"),
    (lambda d: d.update(stream_priority=[1]), "stream_priority must be empty or one 0/1 per stream"),
    (lambda d: d.update(stream_priority=[2] * d["num_streams"]), "stream_priority must be empty"),
])
def test_corrupted_plan_is_rejected_with_a_clear_error(inception_built, edit, message):
    with pytest.raises(PlanError, match=message):
        Plan.from_json(_corrupt(inception_built.module.plan, edit))


def test_wait_before_record_is_rejected(inception_built):
    plan = inception_built.module.plan
    waiting = next(l for l in plan.launches if l.waits)

    def edit(d):
        d["launches"][waiting.idx]["waits"] = [plan.num_events - 1 + 1000]
    with pytest.raises(PlanError, match="no earlier launch records"):
        Plan.from_json(_corrupt(plan, edit))


def test_wait_on_an_event_recorded_only_by_a_later_launch_is_rejected(inception_built):
    """CUDA binds a wait to the event's last record issued before it: a later record is not waited for."""
    plan = inception_built.module.plan
    recorder = plan.recorder_of_event()
    waiting = next(l for l in plan.launches if l.waits)
    later = next(e for e, j in sorted(recorder.items()) if j > waiting.idx)

    def edit(d):
        d["launches"][waiting.idx]["waits"] = [later]
    with pytest.raises(PlanError, match=rf"launch {waiting.idx} waits on event {later}, which only launch "
                                        rf"{recorder[later]} records, a later one") as e:
        Plan.from_json(_corrupt(plan, edit))
    assert "\n" not in str(e.value)
    own = next(l for l in plan.launches if l.records)

    def edit_own(d):
        d["launches"][own.idx]["waits"] = [own.records[0]]
    with pytest.raises(PlanError, match="the same launch"):
        Plan.from_json(_corrupt(plan, edit_own))


def test_not_json():
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.from_json("{nope")


def test_stream_priorities_survive_the_round_trip(inception_built):
    import dataclasses

    plan = inception_built.module.plan
    marked = dataclasses.replace(plan, stream_priority=[i % 2 for i in range(plan.num_streams)])
    assert Plan.from_json(marked.to_json()).stream_priority == marked.stream_priority
    data = json.loads(plan.to_json())
    data.pop("stream_priority")  # plans written before the field: all streams equal
    assert Plan.from_json(json.dumps(data)).stream_priority == []


def test_another_schedule_of_the_same_program_reuses_its_constants(inception_built):
    """The stream choice plans a lowered model once per stream cap: each plan hands back the constants of the plan
    it was rescheduled from (the same arrays, not the weights copied out of the module again), equal to a plan made
    from scratch; constants of another program (other shapes) are not taken."""
    import numpy as np

    from tvm_nimble.codegen.lower_plan import build_plan
    from tvm_nimble.compiler.stream_choice import rescheduled

    result = inception_built.module
    assert result.plan.num_streams > 1 and result.params
    one = rescheduled(result, 1)
    assert one.plan.num_streams == 1 and one.plan.constants == result.plan.constants
    assert all(one.params[name] is array for name, array in result.params.items())
    _, fresh = build_plan(one.annotated_mod, one.plan.target)
    assert fresh.keys() == one.params.keys()
    assert all(fresh[n] is not one.params[n] and np.array_equal(fresh[n], one.params[n]) for n in fresh)
    wrong = {name: np.zeros((*array.shape, 2), array.dtype) for name, array in result.params.items()}
    _, rebuilt = build_plan(one.annotated_mod, one.plan.target, constants_of=wrong)
    assert all(np.array_equal(rebuilt[n], fresh[n]) and rebuilt[n] is not wrong[n] for n in fresh)
