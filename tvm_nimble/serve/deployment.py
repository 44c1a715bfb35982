"""The Ray Serve deployment: one :class:`~tvm_nimble.serve.replica.ReplicaModel` per replica, requests
gathered by ``@serve.batch``, reachable over HTTP and through a deployment handle.

Importing this module imports Ray (a :class:`NimbleError` naming the extra when it is missing).
"""
from __future__ import annotations

import asyncio
import gc
import json

from tvm_nimble.errors import NimbleError

from .options import ServeOptions, max_ongoing_requests, one_line, require_ray
from .replica import ReplicaModel, decode_json, encode_outputs

ray, serve = require_ray()

from starlette.requests import Request  # noqa: E402  (installed with ray[serve])
from starlette.responses import Response  # noqa: E402


class NimbleDeployment:
    """A replica: loads the artifact once, then serves.

    ``infer({name: array})`` (the handle's method) answers the list of outputs (numpy arrays, in the
    model's order), or raises the executor's error for this request alone. An HTTP POST of
    ``{"inputs": {name: nested list}}`` answers ``{"outputs": [nested list, ...], "replica": id}`` (200), or
    ``{"error": one line}`` (400) for a bad request; the replica keeps serving either way.
    """

    def __init__(self, artifact: str, max_batch_size: int, batch_wait_s: float):
        self.model = ReplicaModel(artifact)
        self.run_batch.set_max_batch_size(max_batch_size)
        self.run_batch.set_batch_wait_timeout_s(batch_wait_s)
        self.replica = serve.get_replica_context().replica_id.unique_id
        # the loaded model's objects never die: keep Python's full collections from walking them (a
        # GIL pause for every request in flight)
        gc.freeze()

    @serve.batch
    async def run_batch(self, requests: list[dict]) -> list:
        # in a worker thread, so that the next batch gathers while this one runs; Serve runs one batch
        # at a time per replica (max_concurrent_batches=1), which the executor's output views rely on
        return await asyncio.to_thread(self.model.run_batch, requests)

    async def infer(self, inputs: dict) -> list:
        result = await self.run_batch(inputs)
        if isinstance(result, NimbleError):
            raise result
        return result

    async def __call__(self, request: Request) -> Response:
        try:
            outputs = await self.infer(decode_json(await request.body(), self.model.inputs))
        except NimbleError as err:
            return _json({"error": one_line(err)}, 400)
        return _json({"outputs": encode_outputs(outputs), "replica": self.replica}, 200)

    def __del__(self):
        model = getattr(self, "model", None)
        if model is not None:
            model.close()


def _json(doc: dict, status: int) -> Response:
    # json.dumps, not JSONResponse: an output's inf or nan is written (as Python's json reads it), not a 500
    return Response(json.dumps(doc), status_code=status, media_type="application/json")


def application(options: ServeOptions):
    """The Serve application of ``options``: ``serve.run(application(options))`` deploys it."""
    facts = options.facts()
    batch = options.batch_size(facts)
    deployment = serve.deployment(
        NimbleDeployment, name="NimbleDeployment", num_replicas=options.replicas,
        ray_actor_options={"num_gpus": options.gpus(facts), "num_cpus": options.num_cpus},
        max_ongoing_requests=max_ongoing_requests(batch))
    return deployment.bind(facts.path, batch, options.batch_wait_ms / 1000)
