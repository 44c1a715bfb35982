"""What the harness times: one system (Nimble, stock TVM, PyTorch, ONNX Runtime, ...) on one model."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class System:
    name: str
    run: object  # callable: one inference
    sync: object  # callable: wait for completion
    outputs: object  # callable -> list[np.ndarray]
