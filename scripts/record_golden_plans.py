"""Record the plans and outputs of tests/golden_cases.py's builds into tests/data/ (run on the commit before a
restructuring; tests/test_golden_plans.py then checks every later commit against them).

    python scripts/record_golden_plans.py [--out tests/data]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import numpy as np  # noqa: E402

from golden_cases import CASES, build_case, normalized, output_key  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "data"))
    args = parser.parse_args()
    plans, outputs = {}, {}
    with tempfile.TemporaryDirectory() as cache:
        for case in CASES:
            plan, outs = build_case(case, cache)
            plans[case[0]] = normalized(plan)
            for i, o in enumerate(outs or []):
                outputs[output_key(case[0], i)] = o
            print(f"{case[0]}: {len(plan['launches'])} launches")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "golden_plans.json"), "w") as f:
        json.dump(plans, f, sort_keys=True, separators=(",", ":"))
    np.savez_compressed(os.path.join(args.out, "golden_outputs.npz"), **outputs)


if __name__ == "__main__":
    main()
