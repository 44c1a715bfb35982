"""Read a Nimble plan out of a ``tvm.compile(..., relax_pipeline="nimble")`` executable.

The ``nimble`` pipeline embeds the launch plan and the constants in the executable as two
extra Relax functions, and leaves ``nimble.*`` marker calls in ``main``. This module is the
runtime side of that contract: the names, no-op markers for the Relax VM, and the loader.
It needs only the TVM runtime, so a ``.so`` built elsewhere loads on a deploy machine.
"""
from __future__ import annotations

import numpy as np
import tvm_ffi

from tvm_nimble.errors import NimbleError

from .module import NimbleModule
from .plan import Plan

#: Marker calls the stream annotation leaves in ``main`` (see ``relay_passes.annotate``).
SET_STREAM = "nimble.set_stream"
WAIT_EVENT = "nimble.wait_event"
RECORD_EVENT = "nimble.record_event"
MARKERS = (SET_STREAM, WAIT_EVENT, RECORD_EVENT)

PLAN_FUNC = "__nimble_plan__"
PARAMS_FUNC = "__nimble_params__"


def register_markers() -> None:
    """Make the markers callable: in the Relax VM kernels run in program order on one stream."""
    names = set(tvm_ffi.registry.list_global_func_names())
    for name in MARKERS:
        if name not in names:
            tvm_ffi.register_global_func(name, lambda *args: None)


def module_from_executable(executable) -> NimbleModule:
    """A :class:`NimbleModule` from an executable built with ``relax_pipeline="nimble"``."""
    import tvm

    register_markers()
    lib = executable.mod if hasattr(executable, "mod") and not isinstance(executable, tvm.runtime.Module) else executable
    try:
        # The plan and constants live in the VM's constant pool; a host VM reads them back.
        vm = tvm.runtime.vm.VirtualMachine(lib, tvm.cpu(0))
        plan_json = str(vm[PLAN_FUNC]())
        consts = vm[PARAMS_FUNC]()
    except Exception:
        raise NimbleError("this executable was not built with relax_pipeline='nimble' (no embedded plan); "
                          "rebuild it with tvm.compile(mod, target, relax_pipeline='nimble')") from None
    plan = Plan.from_json(plan_json)
    params = {f"c{c}": np.asarray(t.numpy()) for c, t in zip(plan.constants, consts)}
    kernels = lib.imports[0] if len(lib.imports) else lib
    return NimbleModule(plan, kernels, params, None, {"source": "relax_pipeline=nimble"})
