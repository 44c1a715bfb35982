"""State carried from one run to the next without a copy: an output that is the next run's input.

A training step returns new parameters that the next step takes as inputs. Copying them back
every step costs a pass over every parameter; instead the output buffer and the input buffer
trade roles each run (ping-pong): even runs read the input buffers and write the output buffers,
odd runs the other way round. Inputs and outputs have their own storages in a plan (never the
shared pool), and no launch writes an input, so swapping two such storages in every launch's
arguments is the whole trick: the executor keeps one set of launch arguments (and, on a GPU, one
captured CUDA graph) per parity and alternates them.
"""
from __future__ import annotations

from tvm_nimble.errors import NimbleError


class CarryError(NimbleError):
    """A ``carry`` mapping names an output/input pair that cannot trade buffers."""


def storage_swap(plan, carry: dict) -> dict[int, int]:
    """``carry`` (output index -> input index or name) as a symmetric storage -> storage map.

    Refuses pairs whose tensors differ in shape or dtype, an output that is not a buffer of its own
    (a view of an input, or sharing its storage with another output), an input that some launch
    writes, and an input or output named twice."""
    names = plan.input_names
    swap: dict[int, int] = {}
    written = {plan.tensors[t].storage for l in plan.launches for t in l.writes}
    for out_idx, inp in carry.items():
        if not 0 <= out_idx < len(plan.outputs):
            raise CarryError(f"carry: output index {out_idx} out of range, the model has {len(plan.outputs)} output(s)")
        if isinstance(inp, str):
            if inp not in names:
                raise CarryError(f"carry: unknown input {inp!r}; the model's inputs are {names}")
            inp = names.index(inp)
        if not 0 <= inp < len(plan.inputs):
            raise CarryError(f"carry: input index {inp} out of range, the model has {len(plan.inputs)} input(s)")
        o, i = plan.tensors[plan.outputs[out_idx]], plan.tensors[plan.inputs[inp]]
        if (o.shape, o.dtype) != (i.shape, i.dtype):
            raise CarryError(f"carry: output {out_idx} is {o.dtype}{o.shape} but input {i.name!r} is {i.dtype}{i.shape}")
        so, si = plan.storages[o.storage], plan.storages[i.storage]
        if so.kind != "output" or si.kind != "input":
            raise CarryError(f"carry: output {out_idx} is not a buffer of its own (it lives in a {so.kind} storage); "
                             "it cannot trade places with an input")
        if si.id in written:
            raise CarryError(f"carry: input {i.name!r} is written by a kernel, so it cannot become an output buffer")
        if so.id in swap or si.id in swap:
            raise CarryError(f"carry: output {out_idx} or input {i.name!r} is named twice")
        swap[so.id], swap[si.id] = si.id, so.id
    return swap
