"""Read a Nimble plan out of a ``tvm.compile(..., relax_pipeline="nimble")`` executable.

The ``nimble`` pipeline embeds the launch plan and the constants in the executable as two
extra Relax functions, and leaves ``nimble.*`` marker calls in ``main``. This module is the
runtime side of that contract (the names are :mod:`tvm_nimble.contract.markers`): no-op markers for the
Relax VM, and the loader.
It needs only the TVM runtime, so a ``.so`` built elsewhere loads on a deploy machine.
"""
from __future__ import annotations

import numpy as np
import tvm_ffi

from tvm_nimble.contract.markers import MARKERS, PARAMS_FUNC, PLAN_FUNC, SLICE_VIEW
from tvm_nimble.contract.plan import Plan
from tvm_nimble.errors import NimbleError

from .module import NimbleModule


def _slice_view(base, offset, shape, dtype):
    from .device import tensor_at

    return tensor_at(base, shape, str(dtype), int(offset))


def register_markers() -> None:
    """Make the markers callable (in the Relax VM kernels run in program order on one stream, so they
    do nothing there) and the slice views they run beside."""
    names = set(tvm_ffi.registry.list_global_func_names())
    for name in MARKERS:
        if name not in names:
            tvm_ffi.register_global_func(name, lambda *args: None)
    if SLICE_VIEW not in names:
        tvm_ffi.register_global_func(SLICE_VIEW, _slice_view)


def _holds_cuda(module) -> bool:
    """Whether ``module`` or anything it imports is a CUDA module."""
    stack, seen = [module], set()
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        try:
            if m.kind == "cuda":
                return True
            stack.extend(m.imports)
        except Exception:
            continue
    return False


def _has_plan(lib) -> bool | None:
    """Whether the executable defines the embedded plan (None: cannot tell without starting a VM)."""
    try:
        if lib.implements_function("as_text"):
            return PLAN_FUNC in str(lib["as_text"]())
    except Exception:
        pass
    return None


def module_from_executable(executable) -> NimbleModule:
    """A :class:`NimbleModule` from an executable built with ``relax_pipeline="nimble"``."""
    import tvm

    from .module import resolve_kernels

    register_markers()
    lib = executable.mod if hasattr(executable, "mod") and not isinstance(executable, tvm.runtime.Module) else executable
    not_nimble = ("this executable was not built with relax_pipeline='nimble' (no embedded plan); "
                  "rebuild it with tvm.compile(mod, target, relax_pipeline='nimble')")
    has_plan = _has_plan(lib)
    if has_plan is False:
        raise NimbleError(not_nimble)
    try:
        # The plan and constants live in the VM's constant pool; a host VM reads them back.
        vm = tvm.runtime.vm.VirtualMachine(lib, tvm.cpu(0))
        plan_json = str(vm[PLAN_FUNC]())
        consts = vm[PARAMS_FUNC]()
    except Exception as err:
        why = (str(err).strip().splitlines() or [type(err).__name__])[-1]
        if _holds_cuda(lib):
            raise NimbleError(f"this executable holds CUDA kernels that this process cannot load ({why}): "
                              "export it with ex.export_library('model.so') and load it with "
                              "tvm.runtime.load_module('model.so') on a machine with an NVIDIA GPU and driver, "
                              "or build it for llvm") from None
        if has_plan is None:
            raise NimbleError(not_nimble) from None
        raise NimbleError(f"cannot read the Nimble plan out of this executable ({why}); rebuild it with "
                          "tvm.compile(mod, target, relax_pipeline='nimble')") from None
    plan = Plan.from_json(plan_json)
    params = {f"c{c}": np.asarray(t.numpy()) for c, t in zip(plan.constants, consts)}
    kernels = lib.imports[0] if len(lib.imports) else lib
    resolve_kernels(plan, kernels)
    return NimbleModule(plan, kernels, params, None, {"source": "relax_pipeline=nimble"})
