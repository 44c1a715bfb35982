"""The zoo builds whose plans, kernels and outputs are recorded (``tests/data/golden_plans.json``,
``tests/data/golden_outputs.npz``) so that a restructuring of the compile side can show it changed none of them.

Recorded by ``python scripts/record_golden_plans.py`` (on the commit before a change, never by a test): each case is
a build on llvm (plan and outputs on seeded inputs) or a CUDA plan built here without a GPU (``kernels="vendor"``,
kernels not compiled: which provider runs each operator, the streams, events and memory plan).
"""
from __future__ import annotations

import numpy as np

CUDA = {"kind": "cuda", "arch": "sm_90"}

#: (case id, zoo model, target, build options); llvm cases also record their outputs
CASES = [
    *[(f"llvm-{name}", name, "llvm", {}) for name in
      ("inception", "nasnet", "resnet", "mobilenet", "random_dag", "densenet", "vit")],
    ("llvm-inception-bf16", "inception", "llvm", {"precision": "bf16"}),
    ("llvm-vit-fp16", "vit", "llvm", {"precision": "fp16"}),
    *[(f"cuda-{name}-{prec}", name, CUDA, {"kernels": "vendor", "precision": prec, "compile_kernels": False})
      for name in ("inception", "nasnet", "mobilenet", "densenet", "vit") for prec in ("fp32", "fp16")],
]


def build_case(case, cache_dir=None):
    """(plan as a dict, outputs on the zoo's seeded inputs or None for a CUDA plan) of one case."""
    from tvm_nimble import NimbleExecutor, build, zoo

    _, name, target, options = case
    model = zoo.get_model(name)
    result = build(model, target, timing_cache=cache_dir or "off", **options)
    outputs = None
    if target == "llvm":
        inputs = zoo.random_inputs(model, seed=0)
        outputs = [o.numpy() for o in NimbleExecutor(result)(*inputs.values())]
    return result.plan.to_dict(), outputs


def normalized(plan: dict) -> dict:
    """A plan dict as JSON would give it back (tuples as lists)."""
    import json

    return json.loads(json.dumps(plan))


def output_key(case_id: str, i: int) -> str:
    return f"{case_id}/{i}"


def as_arrays(outputs) -> list[np.ndarray]:
    return [np.asarray(o) for o in outputs]
