"""Opening a model to run: what a path or object holds, loaded, and the executor that runs it.

``tvm_nimble.NimbleExecutor(model)`` is :func:`NimbleExecutor` here: a factory function (as
``threading.Lock`` is one), not a class. It loads ``model`` once (:func:`load_module`) and returns

- an :class:`~tvm_nimble.runtime.executor.Executor` for a model built for one batch size, or
- a :class:`~tvm_nimble.runtime.bucketed.BucketedExecutor` (one ``Executor`` per bucket, sharing the
  weights) for a model built with ``batch_sizes``, which takes any batch.

Both have the same API (``set_input``/``run``/``get_output``, ``ex(*inputs)``, ``profile``, ``close``,
context manager) and the same input checks; ``isinstance`` checks name the two classes.
"""
from __future__ import annotations

from tvm_nimble.errors import NimbleError

from .bucketed import BucketedExecutor
from .executor import Executor
from .generator import GeneratorModule, is_generator_artifact, load_generator
from .module import BucketedModule, NimbleModule
from .module import load as load_model


def load(path: str) -> NimbleModule | GeneratorModule:
    """Load an artifact with the TVM runtime only: a model's (:class:`~tvm_nimble.runtime.module.NimbleModule`, a
    :class:`~tvm_nimble.runtime.module.BucketedModule` for one built with buckets) or a generator's
    (:class:`~tvm_nimble.runtime.generator.GeneratorModule`)."""
    if is_generator_artifact(path):
        return load_generator(path)
    return load_model(path)


def load_module(module_or_artifact) -> NimbleModule:
    """The :class:`~tvm_nimble.runtime.module.NimbleModule` (a
    :class:`~tvm_nimble.runtime.module.BucketedModule` for a model built with ``batch_sizes``) that an
    executor of ``module_or_artifact`` runs: a module as it is, an artifact directory loaded, or the plan
    read out of an executable built with ``relax_pipeline="nimble"``. Load once to share the kernels among
    several executors (a pool)."""
    if isinstance(module_or_artifact, NimbleModule):
        return module_or_artifact
    if isinstance(module_or_artifact, str) or hasattr(module_or_artifact, "__fspath__"):
        return load_model(str(module_or_artifact))
    if hasattr(module_or_artifact, "export_library") or type(module_or_artifact).__name__ in ("Module", "Executable"):
        from .executable import module_from_executable  # built with relax_pipeline="nimble"

        return module_from_executable(module_or_artifact)
    raise TypeError(f"NimbleExecutor takes a NimbleModule (tvm_nimble.build), an artifact path or an executable "
                    f"from tvm.compile(..., relax_pipeline='nimble'), "
                    f"not {type(module_or_artifact).__name__}")


def NimbleExecutor(module_or_artifact, device=None, mode: str | None = None, check_inputs: bool = True,  # noqa: N802
                   carry: dict | None = None, check_finite: bool = False) -> Executor | BucketedExecutor:
    """The executor of ``module_or_artifact`` (see the module docstring; the options are
    :class:`~tvm_nimble.runtime.executor.Executor` 's). ``carry`` applies to a model of one batch size only."""
    module = load_module(module_or_artifact)
    if isinstance(module, BucketedModule):
        if carry:
            raise NimbleError("carry does not apply to a model with batch buckets; build it for one batch size")
        return BucketedExecutor(module, device, mode, check_inputs, check_finite)
    return Executor(module, device, mode, check_inputs, carry, check_finite)
