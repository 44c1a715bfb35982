"""tvm-nimble: ahead-of-time, multi-stream GPU task scheduling for Apache TVM.

Layers (each imports only the ones before it):
  ``tvm_nimble.relay_passes`` (stage 1, Relax passes: stream assignment, annotation)
  ``tvm_nimble.codegen``      (stage 2: launch plan, concurrency-safe memory plan, kernels)
  ``tvm_nimble.runtime``      (stage 3: executor; needs only the TVM runtime)
  ``tvm_nimble.compiler``     (the compile API wiring 1 -> 2, the TVM pipeline, tuning)
  ``tvm_nimble.bench`` and ``tvm_nimble.cli`` on top; the library never imports them.
The runtime API is imported eagerly; the compiler API on first use, so ``import tvm_nimble``
works where only the TVM runtime is installed.
"""
import os as _os

# The one path exception: the card keeps stages 1 and 2 at the repository root (relay_passes/,
# codegen/), where a reader sees them; an installed wheel puts them inside tvm_nimble/ (see
# pyproject.toml's package-dir). In a source checkout this makes the same names resolve.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "relay_passes", "__init__.py")) and _root not in __path__:
    __path__.append(_root)

__version__ = "0.1.0"

from .errors import ModelError, NimbleError, ShapeError, UnsupportedOperatorError  # noqa: E402
from .runtime.bucketed import BucketedExecutor  # noqa: E402
from .runtime.executor import ConcurrentUseError, Executor, NotReadyError  # noqa: E402
from .runtime.generator import Generator, GeneratorModule, Sampling  # noqa: E402
from .runtime.inputs import InputError  # noqa: E402
from .runtime.loading import NimbleExecutor, load  # noqa: E402
from .runtime.module import NimbleModule  # noqa: E402
from .runtime.pool import NimblePool  # noqa: E402

_LAZY = {
    "build": ("tvm_nimble.compiler.build", "build"),
    "build_training": ("tvm_nimble.compiler.training", "build_training"),
    "build_generator": ("tvm_nimble.compiler.generate", "build_generator"),
    "generate": ("tvm_nimble.compiler.generate", "generate"),
    "BuildResult": ("tvm_nimble.compiler.build", "BuildResult"),
    "from_onnx": ("tvm_nimble.compiler.frontend", "from_onnx"),
    "assign_streams": ("tvm_nimble.relay_passes.stream_assignment", "assign_streams"),
    "AnnotateStreams": ("tvm_nimble.relay_passes.annotate", "AnnotateStreams"),
    "explain_model": ("tvm_nimble.compiler.explain", "explain_model"),
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
    from .compiler.tvm_pipeline import register

    register()


_register_with_tvm()

__all__ = ["NimbleExecutor", "Executor", "BucketedExecutor", "InputError", "NimblePool", "NimbleModule", "load", "ConcurrentUseError", "NotReadyError", "build", "BuildResult", "from_onnx", "assign_streams", "AnnotateStreams",
           "explain_model", "NimbleError", "ModelError", "ShapeError", "UnsupportedOperatorError"]
