"""Calls to a served model through its deployment handle: a timeout on every call, one retry when the
replica died with the request in flight, and the executor's one-line error for a bad request."""
from __future__ import annotations

from tvm_nimble.errors import NimbleError

from .options import one_line, require_ray


class ServeError(NimbleError):
    """A served model gave no answer: it timed out, or its replica died (twice)."""


class NimbleClient:
    """``client({name: array})`` (or ``client(input=x)``), from any thread: the list of outputs (numpy
    arrays, in the model's order).

    Every attempt waits at most ``timeout_s`` (then :class:`ServeError`; the request is cancelled). A
    request whose replica died meanwhile is sent once more (inference has no side effects), which Serve
    routes to a live replica; a second death is a :class:`ServeError`. A bad request raises the
    executor's error (an ``InputError`` or another :class:`NimbleError`) in one line.
    """

    def __init__(self, handle, timeout_s: float = 30.0, retries: int = 1):
        self.handle = handle
        self.timeout_s = timeout_s
        self.retries = retries

    def __call__(self, inputs: dict | None = None, /, **named) -> list:
        ray, _ = require_ray()
        request = {**(inputs or {}), **named}
        for attempt in range(self.retries + 1):
            response = self.handle.infer.remote(request)
            try:
                return response.result(timeout_s=self.timeout_s)
            except TimeoutError:
                response.cancel()
                raise ServeError(f"no answer within {self.timeout_s:g} s: the replicas are overloaded or stuck; "
                                 "add replicas or raise timeout_s") from None
            except ray.exceptions.RayActorError as err:  # the replica died with this request in flight
                if attempt == self.retries:
                    raise ServeError(f"the replica died while serving this request ({one_line(err)}), "
                                     f"{attempt + 1} time(s); Serve restarts it: try again") from None
            except ray.exceptions.RayTaskError as err:  # the replica raised: a bad request
                if isinstance(err.cause, NimbleError):
                    raise err.cause from None
                raise
        raise AssertionError("unreachable")

    def __repr__(self) -> str:
        return f"NimbleClient(timeout_s={self.timeout_s:g}, retries={self.retries})"
