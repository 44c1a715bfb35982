"""Fuzz: random operator DAGs through assignment -> plan -> static checker -> race simulator."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx.reference import ReferenceEvaluator

from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.codegen.checker import check_plan
from tvm_nimble.runtime.race_check import check_races


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=10_000), num_ops=st.integers(min_value=4, max_value=16),
       max_streams=st.sampled_from([None, 1, 2, 3]))
def test_random_dags_are_race_free_and_correct(seed, num_ops, max_streams):
    model = zoo.random_dag(num_ops=num_ops, seed=seed)
    inputs = zoo.random_inputs(model, seed=seed)
    reference = ReferenceEvaluator(model).run(None, inputs)
    module = build(model, "llvm", max_streams=max_streams)
    if max_streams:
        assert module.plan.num_streams <= max_streams
    assert check_plan(module.plan) == []
    assert check_races(module, inputs, reference, seeds=range(8)) == []
    out = NimbleExecutor(module)(**inputs)[0].numpy()
    np.testing.assert_allclose(out, reference[0], rtol=1e-4, atol=1e-4)
