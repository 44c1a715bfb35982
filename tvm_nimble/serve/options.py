"""What a served model is: the artifact, its replicas and how requests are batched (no Ray needed here)."""
from __future__ import annotations

import dataclasses
import os

from tvm_nimble.errors import NimbleError
from tvm_nimble.runtime.artifact import read_manifest

#: The line a missing Ray answers with.
NEEDS_RAY = "serving needs Ray Serve, which is not installed: pip install 'tvm-nimble[serve]' (ray[serve]>=2.60)"


def require_ray():
    """``ray`` and ``ray.serve``, imported on first use (``import tvm_nimble`` never needs Ray); a
    :class:`NimbleError` naming the extra to install when they are missing."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise NimbleError(NEEDS_RAY) from None
    return ray, serve


def one_line(err: BaseException) -> str:
    """An error's first line (the whole message of a NimbleError), or its type's name."""
    text = str(err)
    return text.splitlines()[0] if text else type(err).__name__


def _number(name: str, value, minimum: float, integer: bool = False):
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or value < minimum:
        kind = "an integer" if integer else "a number"
        raise NimbleError(f"{name} must be {kind} >= {minimum:g}, got {value!r}")
    return value


def max_ongoing_requests(batch: int) -> int:
    """A replica's ``max_ongoing_requests`` for batches of up to ``batch`` rows: a batch running, the next one
    gathering. A client that keeps more than this times the replicas in flight makes the rest wait in Serve's
    router (with its back-off), not in the replica's batch."""
    return 2 * batch


@dataclasses.dataclass(frozen=True)
class ArtifactFacts:
    """What the driver reads from an artifact's manifest without loading its kernels (a CUDA artifact
    loads only where a GPU is): its target kind and, for a bucketed one, its batch sizes."""

    path: str
    target_kind: str
    batch_sizes: tuple[int, ...] | None

    @classmethod
    def read(cls, path: str) -> "ArtifactFacts":
        manifest = read_manifest(path)  # one line (ArtifactError) for a path that is no artifact
        buckets = manifest.get("buckets")
        sizes = tuple(sorted(int(b["batch"]) for b in buckets)) if buckets and "bucket_space" not in manifest else None
        return cls(os.path.abspath(path), str(manifest.get("target", {}).get("kind", "llvm")), sizes)

    @property
    def bucketed(self) -> bool:
        return self.batch_sizes is not None


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """One served model.

    ``replicas``: Serve replicas, each a process with its own executor (on GPUs, one GPU each).
    ``max_batch_size``: the most requests ``@serve.batch`` gathers into one executor call (default: the
    largest bucket of a bucketed artifact, else 8; a plain artifact still runs one call per request).
    ``batch_wait_ms``: how long the first request of a batch waits for others.
    ``num_gpus`` / ``num_cpus``: each replica's Ray resources (``num_gpus`` default: 1 for a CUDA artifact,
    0 for a CPU one). ``name`` / ``route_prefix``: the Serve application and its HTTP path.
    """

    artifact: str
    replicas: int = 1
    max_batch_size: int | None = None
    batch_wait_ms: float = 2.0
    num_gpus: float | None = None
    num_cpus: float = 1.0
    name: str = "nimble"
    route_prefix: str = "/"

    def __post_init__(self):
        _number("replicas", self.replicas, 1, integer=True)
        if self.max_batch_size is not None:
            _number("max_batch_size", self.max_batch_size, 1, integer=True)
        _number("batch_wait_ms", self.batch_wait_ms, 0)
        _number("num_cpus", self.num_cpus, 0)
        if self.num_gpus is not None:
            _number("num_gpus", self.num_gpus, 0)
        if not self.route_prefix.startswith("/"):
            raise NimbleError(f"route_prefix must start with '/', got {self.route_prefix!r}")

    def facts(self) -> ArtifactFacts:
        return ArtifactFacts.read(self.artifact)

    def batch_size(self, facts: ArtifactFacts) -> int:
        if self.max_batch_size is not None:
            return self.max_batch_size
        return facts.batch_sizes[-1] if facts.bucketed else 8

    def gpus(self, facts: ArtifactFacts) -> float:
        if self.num_gpus is not None:
            return self.num_gpus
        return 1 if facts.target_kind == "cuda" else 0
