"""What one replica does with a batch of requests (no Ray here: the deployment calls it).

A request is ``{input name: array}``. A bucketed artifact takes any number of rows per request (the
leading dimension of every input), so a batch of requests runs as ONE executor call on their rows
stacked in arrival order, and each request gets back exactly its own rows of every output. A plain
artifact has one fixed shape, so each request of the batch is its own call.

Each request gets its own answer or its own error: a request that cannot be stacked (its inputs
disagree on the rows, or it misses one) runs alone, and when the stacked call fails (one request's
dtype, row shape or index values are wrong), every request of the batch runs alone, so the bad one
gets the executor's one-line error and the others their outputs.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from tvm_nimble.errors import NimbleError
from tvm_nimble.runtime.executor import InputError
from tvm_nimble.runtime.loading import NimbleExecutor

#: The HTTP request body, as the error for a malformed one shows it.
REQUEST_FORMAT = '{"inputs": {"<input name>": <nested list of numbers>, ...}}'


@dataclasses.dataclass(frozen=True)
class Slot:
    """One model input: its name, dtype and shape (a bucketed model's largest bucket)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def _slots(plan, ids) -> tuple[Slot, ...]:
    return tuple(Slot(plan.tensors[t].name, plan.tensors[t].dtype, tuple(plan.tensors[t].shape)) for t in ids)


def decode_json(body: bytes, inputs: tuple[Slot, ...]) -> dict[str, np.ndarray]:
    """A request from an HTTP body in :data:`REQUEST_FORMAT`, each input cast to the model's dtype (JSON
    has no dtypes); an :class:`InputError` naming the format for anything else. Names are not checked
    here: the executor names a missing or unknown input."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"the request body is not JSON ({err}); send {REQUEST_FORMAT}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
        raise InputError(f"the request body has no \"inputs\" object; send {REQUEST_FORMAT}")
    dtypes = {s.name: s.dtype for s in inputs}
    out = {}
    for name, value in doc["inputs"].items():
        try:
            out[name] = np.asarray(value, dtype=dtypes.get(name))
        except (ValueError, TypeError) as err:
            raise InputError(f"input {name!r} is not a nested list of numbers of one shape ({err}); "
                             f"send {REQUEST_FORMAT}") from None
    return out


def encode_outputs(outputs: list[np.ndarray]) -> list[list]:
    """The outputs, in the model's order, as JSON values (nested lists)."""
    return [value.tolist() for value in outputs]


class ReplicaModel:
    """One executor of an artifact and the batching rule of the module docstring.

    Loading warms it (a bucketed executor runs every bucket once, so no request pays a first use).
    """

    def __init__(self, artifact: str):
        self.executor = NimbleExecutor(artifact)
        plan = self.executor.plan
        self.bucketed = getattr(self.executor, "batch_sizes", None) is not None  # rows that stack
        self.inputs = _slots(plan, plan.inputs)
        if self.bucketed:
            self.executor.warm()

    def run_batch(self, requests: list[dict]) -> list[list[np.ndarray] | NimbleError]:
        """Each request's outputs (in the model's order), or the error it alone caused, in order."""
        results: list = [None] * len(requests)
        rows = [self._rows(r) for r in requests]
        stack = [i for i, n in enumerate(rows) if n]
        if self.bucketed and len(stack) > 1:
            try:
                outs = self._run({s.name: np.concatenate([requests[i][s.name] for i in stack]) for s in self.inputs})
            except (NimbleError, ValueError):  # one request spoils the stack: each runs alone below
                pass
            else:
                bounds = np.cumsum([rows[i] for i in stack])[:-1]
                parts = [np.split(out, bounds) for out in outs]
                for k, i in enumerate(stack):
                    results[i] = [part[k] for part in parts]
        for i, request in enumerate(requests):
            if results[i] is None:
                try:
                    results[i] = self._run(request)
                except NimbleError as err:
                    results[i] = err
        return results

    def _rows(self, request: dict) -> int | None:
        """The rows of a request that can be stacked with others (every input named, each with the same
        leading dimension), else None."""
        if not isinstance(request, dict) or set(request) != {s.name for s in self.inputs}:
            return None
        try:
            leads = {np.shape(v)[0] if np.ndim(v) else 0 for v in request.values()}
        except ValueError:  # a ragged nested list: the executor names it when the request runs alone
            return None
        return leads.pop() if len(leads) == 1 else None

    def _run(self, named: dict) -> list[np.ndarray]:
        if not isinstance(named, dict) or not all(isinstance(k, str) for k in named):
            raise InputError(f"a request is a dict of input name -> array; the model's inputs are "
                             f"{[s.name for s in self.inputs]}")
        # views of the output buffers, read before the next run: a replica runs one batch at a time
        outs = self.executor(**named, copy=False)
        return [out.numpy() for out in outs]

    def close(self) -> None:
        self.executor.close()
