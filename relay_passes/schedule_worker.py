"""A worker of the schedule pool (:mod:`.schedule_pool`), run as ``python -m tvm_nimble.relay_passes.schedule_worker``:
DLight's default rules, guarded as the pipeline guards them (:func:`.schedules.guarded_rules`), applied to the
PrimFuncs each request sends.

A request is one line of JSON on stdin: ``target`` (a Target's JSON), ``rules`` (the names the caller's rules go by),
``stock`` (``NIMBLE_STOCK_REDUCTION_SCHEDULES`` there) and ``funcs`` (PrimFunc JSONs). The answer is one line on
stdout: ``funcs`` (each scheduled and marked so, as JSON, or null where no rule applies), or ``error`` (one line:
the caller then schedules those kernels itself, and meets the error there). The worker ends when stdin does.
"""
from __future__ import annotations

import json
import os
import sys

import tvm

from .pipeline import DEFAULT_SCHEDULE, backend_for
from .schedules import guarded_rules, schedule_with
from .tvm_compat import import_tensor_intrinsics


def _rules(target: tvm.target.Target, stock: bool, cache: dict) -> tuple[list, tuple]:
    """(the guarded rules of ``target``'s pipeline, their key), made once per (target, stock) in ``cache``."""
    key = (str(target), stock)
    if key not in cache:
        with target:
            passes = [p for p in backend_for(target).legalize_passes(target) if p.info.name == DEFAULT_SCHEDULE]
        if len(passes) != 1:
            raise RuntimeError(f"{len(passes)} {DEFAULT_SCHEDULE} passes in the pipeline of {target.kind.name}")
        cache[key] = guarded_rules(passes[0], stock)
    return cache[key]


def serve(stdin, stdout) -> None:
    """Answer each request line of ``stdin`` on ``stdout`` (see the module's docstring) until ``stdin`` ends."""
    import_tensor_intrinsics()  # what DLight's Matmul rule imports for its first half-precision matmul
    cache: dict = {}
    for line in stdin:
        try:
            request = json.loads(line)
            target = tvm.target.Target(request["target"])
            rules, rules_key = _rules(target, request["stock"], cache)
            if list(rules_key) != request["rules"]:
                raise RuntimeError(f"the worker's rules {rules_key} are not the caller's {request['rules']}")
            answer = []
            with target:
                for text in request["funcs"]:
                    after = schedule_with(tvm.ir.load_json(text), target, rules)
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
