"""What the harness times: one system (Nimble, stock TVM, PyTorch, ONNX Runtime, ...) on one model, and how
long it took to get it ready (``build_s``: results.csv's column)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class System:
    name: str
    run: object  # callable: one inference
    sync: object  # callable: wait for completion
    outputs: object  # callable -> list[np.ndarray]
    #: seconds from the model to a system ready to run: a build, torch.compile's compile (its first calls),
    #: an ONNX Runtime session's creation; None where nothing was timed
    build_s: float | None = None
