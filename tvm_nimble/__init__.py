"""tvm-nimble: ahead-of-time, multi-stream GPU task scheduling for Apache TVM.

Stages: ``tvm_nimble.relay_passes`` (stream assignment on Relax) -> ``tvm_nimble.codegen``
(launch plan, memory plan, artifact) -> ``tvm_nimble`` executor (replay).
"""
import os as _os

# In a source checkout relay_passes/ and codegen/ sit at the repository root (the three stages
# are visible in the tree); an installed wheel puts them inside tvm_nimble/. Make both work.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "relay_passes", "__init__.py")) and _root not in __path__:
    __path__.append(_root)

__version__ = "0.1.0"

from .errors import ModelError, NimbleError, ShapeError, UnsupportedOperatorError  # noqa: E402
from .runtime.executor import NimbleExecutor  # noqa: E402
from .runtime.module import NimbleModule, load  # noqa: E402

_LAZY = {
    "build": ("tvm_nimble.builder", "build"),
    "from_onnx": ("tvm_nimble.frontend", "from_onnx"),
    "assign_streams": ("tvm_nimble.relay_passes.stream_assignment", "assign_streams"),
    "AnnotateStreams": ("tvm_nimble.relay_passes.annotate", "AnnotateStreams"),
    "explain_model": ("tvm_nimble.explain_model", "explain_model"),
    "zoo": ("tvm_nimble.zoo", None),
}


def __getattr__(name):
    """Compiler-side API is imported on first use, so runtime-only TVM installs can still load artifacts."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module 'tvm_nimble' has no attribute {name!r}")


def _register_with_tvm():
    try:
        import tvm.relax  # noqa: F401  (absent when only the TVM runtime is installed)
    except Exception:  # ImportError, or OSError for a missing compiler library
        return
    from .tvm_integration import register

    register()


_register_with_tvm()

__all__ = ["NimbleExecutor", "NimbleModule", "load", "build", "from_onnx", "assign_streams", "AnnotateStreams",
           "explain_model", "NimbleError", "ModelError", "ShapeError", "UnsupportedOperatorError"]
