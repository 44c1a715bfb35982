"""The zoo nets' plans, kernels and outputs are those recorded before the compile side was restructured
(tests/golden_cases.py; recorded by scripts/record_golden_plans.py at the commit before the change), or since re-recorded
by a change meant to change plans whose outputs stayed the same (the gathers fused with their neighbours: ViT's
position-embedding lookups; a one-row 16-bit classifier head writing its float32 output itself, one cast launch
fewer)."""
import json
import os

import numpy as np
import pytest

from golden_cases import CASES, build_case, normalized, output_key

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.fixture(scope="module")
def recorded():
    with open(os.path.join(DATA, "golden_plans.json")) as f:
        plans = json.load(f)
    outputs = np.load(os.path.join(DATA, "golden_outputs.npz"))
    return plans, outputs


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plan_and_outputs_unchanged(case, recorded, tmp_path):
    plans, outputs = recorded
    plan, outs = build_case(case, str(tmp_path))
    want = plans[case[0]]
    got = normalized(plan)
    for field in sorted(set(want) | set(got)):
        assert got.get(field) == want.get(field), f"{case[0]}: plan field {field!r} differs from the recorded plan"
    for i, o in enumerate(outs or []):
        ref = outputs[output_key(case[0], i)]
        assert o.dtype == ref.dtype and o.shape == ref.shape
        np.testing.assert_allclose(o, ref, rtol=1e-5, atol=1e-6, err_msg=f"{case[0]} output {i}")
