"""The names the compiler leaves in a Relax module and the runtime looks up: the stream markers in ``main``
and the two functions a ``relax_pipeline="nimble"`` executable embeds.

``relay_passes.annotate`` writes the markers, ``relay_passes.lowered_ir`` reads them back,
``compiler.tvm_pipeline`` embeds the plan and constants, and ``runtime.executable`` registers the markers as
no-ops for the Relax VM and reads the plan out of the executable.
"""
from __future__ import annotations

#: ``nimble.set_stream(s)``: the next kernel runs on stream ``s``.
SET_STREAM = "nimble.set_stream"
#: ``nimble.wait_event(e)``: the next kernel waits for event ``e``.
WAIT_EVENT = "nimble.wait_event"
#: ``nimble.record_event(e)``: the previous kernel records event ``e``.
RECORD_EVENT = "nimble.record_event"
MARKERS = (SET_STREAM, WAIT_EVENT, RECORD_EVENT)
#: ``nimble.slice_view(base, byte_offset, shape, dtype)``: a tensor over bytes of ``base``, left in ``main``
#: by ``relay_passes.concat_in_place`` and ``merge_siblings`` where a kernel writes its slice of a concatenation
SLICE_VIEW = "nimble.slice_view"
#: the attribute of a PrimFunc that writes some of its arguments in place: their indices (``relay_passes.kv_cache``
#: writes it, ``lowered_ir`` reads it: an input written in place is state; vendor kernels: ``vendor_abi.IN_PLACE``)
IN_PLACE_ATTR = "nimble.in_place"


def in_place_args(func) -> list[int]:
    """The argument indices a PrimFunc writes in place (:data:`IN_PLACE_ATTR`), or []."""
    attrs = getattr(func, "attrs", None)
    if attrs is None or IN_PLACE_ATTR not in attrs:
        return []
    return [int(i) for i in attrs[IN_PLACE_ATTR]]

#: The Relax function of an executable that returns the plan's JSON.
PLAN_FUNC = "__nimble_plan__"
#: The Relax function of an executable that returns the plan's constants.
PARAMS_FUNC = "__nimble_params__"
