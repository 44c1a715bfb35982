"""A worker of the schedule pool (:mod:`.schedule_pool`), run as ``python -m tvm_nimble.relay_passes.schedule_worker``:
DLight's default rules, guarded as the pipeline guards them (:func:`.schedules.guarded_rules`), applied to the
PrimFuncs each request sends.

A request is one line of JSON on stdin: ``target`` (a Target's JSON), ``rules`` (the names the caller's rules go by),
``stock`` (the names of our schedules swapped for DLight's there: ``tvm_nimble.env.stock_schedules``) and ``funcs`` (PrimFunc JSONs). The answer is one line on
stdout: ``funcs`` (each scheduled and marked so, as JSON, or null where no rule applies), or ``error`` (one line:
the caller then schedules those kernels itself, and meets the error there). The worker ends when stdin does.
"""
from __future__ import annotations

import json
import os
import sys

import tvm
from tvm_ffi.serialization import from_json_graph_str

from .pipeline import default_schedule_rules
from .schedules import schedule_with
from .tvm_compat import import_tensor_intrinsics


def serve(stdin, stdout) -> None:
    """Answer each request line of ``stdin`` on ``stdout`` (see the module's docstring) until ``stdin`` ends."""
    import_tensor_intrinsics()  # what DLight's Matmul rule imports for its first half-precision matmul
    rules_of: dict = {}  # (target JSON, stock) -> (rules, key)
    for line in stdin:
        try:
            request = json.loads(line)
            target = tvm.target.Target(request["target"])
            key = (request["target"], tuple(request["stock"]))
            if key not in rules_of:
                rules_of[key] = default_schedule_rules(target, key[1])
            rules, rules_key = rules_of[key]
            if list(rules_key) != request["rules"]:
                raise RuntimeError(f"the worker's rules {rules_key} are not the caller's {request['rules']}")
            answer = []
            with target:
                for text in request["funcs"]:
                    # the caller's TVM is this one: no schema upgrade (see schedule_pool's reading of the answers)
                    after = schedule_with(from_json_graph_str(text), target, rules)
                    answer.append(None if after is None else tvm.ir.save_json(after))
            reply = {"funcs": answer}
        except Exception as e:  # noqa: BLE001  (the caller schedules these kernels itself, and sees the error there)
            reply = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


if __name__ == "__main__":
    answers = os.fdopen(os.dup(1), "w")  # the answers get fd 1 to themselves; anything else printed goes to stderr
    os.dup2(2, 1)
    serve(sys.stdin, answers)
