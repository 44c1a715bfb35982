"""Serving an artifact on Ray Serve: replicas across GPUs (or CPU processes), HTTP and Python clients.

    from tvm_nimble import serve
    client = serve.start(serve.ServeOptions("model.nimble", replicas=2), port=8000)
    y = client(input=x)[0]                            # through the deployment handle, from any thread
    # or: POST http://127.0.0.1:8000/ with {"inputs": {"input": [[...]]}} -> {"outputs": [[[...]]], ...}
    serve.shutdown()

Each replica is a Ray actor holding one executor of the artifact (one GPU each for a CUDA artifact:
``ray_actor_options={"num_gpus": 1}``). Serve's ``@serve.batch`` gathers requests; a bucketed artifact
runs a batch as one call on the requests' rows stacked, a plain one a call per request
(:mod:`tvm_nimble.serve.replica`). A bad request gets its own one-line error (HTTP 400); a replica that
dies is restarted by Serve, and :class:`NimbleClient` retries a request that was in flight on it once.

Layers: :mod:`.options` and :mod:`.replica` need no Ray; :mod:`.deployment` imports Ray, and
:func:`application` / :func:`start` import it on first use, so ``import tvm_nimble.serve`` works without
it. This package sits on the runtime and never imports the compiler.
"""
from __future__ import annotations

from .client import NimbleClient, ServeError
from .options import NEEDS_RAY, ServeOptions, max_ongoing_requests, require_ray

__all__ = ["ServeOptions", "NimbleClient", "ServeError", "application", "start", "shutdown", "require_ray",
           "NEEDS_RAY", "max_ongoing_requests"]


def application(options: ServeOptions):
    """The Serve application (a bound deployment) of ``options``; ``ray.serve.run`` deploys it."""
    from .deployment import application as bound

    return bound(options)


def start(options: ServeOptions, host: str = "127.0.0.1", port: int = 8000, timeout_s: float = 30.0) -> NimbleClient:
    """Deploy ``options`` on Ray Serve (starting a local Ray unless ``ray.init`` ran) with HTTP on
    ``host:port``; returns once every replica has loaded, with a client of ``timeout_s`` a call (HTTP
    requests time out after ``timeout_s`` too). Serve's HTTP options are set by the first start in a Ray
    cluster; later ones keep them."""
    _, serve = require_ray()
    app = application(options)  # reads the artifact first: a bad path fails before Ray starts
    serve.start(http_options={"host": host, "port": port, "request_timeout_s": timeout_s})
    handle = serve.run(app, name=options.name, route_prefix=options.route_prefix)
    return NimbleClient(handle, timeout_s=timeout_s)


def shutdown() -> None:
    """Stop Serve (every application and its replicas); Ray itself keeps running."""
    _, serve = require_ray()
    serve.shutdown()
