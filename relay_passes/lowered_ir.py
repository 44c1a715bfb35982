"""Read a lowered Relax function (after ``CallTIRRewrite``) as a list of kernel launches.

After TVM's ``CallTIRRewrite`` every kernel is an explicit destination-passing call
``prim_func(inputs..., outputs...)`` whose outputs come from ``R.builtin.alloc_tensor``.
That form is what both stages need: the stream pass builds its operator DAG from it, and
codegen turns it into a launch plan. Bindings that launch nothing (aliases, reshapes,
tuples) become views or aliases, never stream nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.ir.expr import Constant

from tvm_nimble.contract.markers import RECORD_EVENT, SET_STREAM, SLICE_VIEW, WAIT_EVENT, in_place_args
from tvm_nimble.contract.plan import read_after_write
from tvm_nimble.contract import vendor_abi
from tvm_nimble.contract.vendor_abi import VENDOR_PREFIXES
from tvm_nimble.errors import NimbleError

from .schedules import allocates_global_buffers

_VIEW_OPS = {"relax.reshape", "relax.memory.view"}


class LoweredIRError(NimbleError):
    """The lowered Relax function has a construct the launch plan cannot express."""


@dataclass
class Value:
    """A tensor value of the lowered function: an input, a constant, an allocation or a view."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input" | "const" | "alloc" | "view"
    base: int | None = None  # for views: the value whose memory this one reinterprets
    constant: object | None = None  # Constant for kind == "const"
    offset: int = 0  # for views: where in ``base`` this one starts, in bytes (slices of an in-place concat)

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * tvm.runtime.DataType(self.dtype).bits // 8


@dataclass
class Kernel:
    """One kernel launch: a call of a compiled PrimFunc in destination-passing style."""

    index: int
    func: str
    args: list[int]
    writes: list[int]
    reads: list[int]
    stream: int | None = None
    waits: list[int] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    literals: list = field(default_factory=list)  # [position, [ints]]: shape arguments of a vendor call
    #: its PrimFunc keeps an intermediate in global memory, which TVM allocates from its stream-unaware workspace
    #: pool at every call (``schedules.allocates_global_buffers``): such kernels must not overlap
    tvm_workspace: bool = False


@dataclass
class LoweredProgram:
    values: list[Value]
    kernels: list[Kernel]
    inputs: list[int]
    input_names: list[str]
    outputs: list[int]
    output_is_tuple: bool
    #: the inputs a kernel writes in place (``contract.markers.in_place_args``, ``vendor_abi.IN_PLACE``): state,
    #: which outlives a run; not in ``inputs``
    states: list[int] = field(default_factory=list)

    def root(self, vid: int) -> int:
        """The value that owns the memory of ``vid`` (views resolve to their base)."""
        while self.values[vid].base is not None:
            vid = self.values[vid].base
        return vid

    def region(self, vid: int) -> tuple[int, int, int]:
        """(root, first byte, end byte) of ``vid`` within the memory of its root."""
        return _region(self.values, vid)

    def dependency_edges(self) -> list[tuple[int, int]]:
        """Read-after-write edges between kernels (writer -> reader), deduplicated, and an edge from each kernel that
        takes memory from TVM's workspace pool to the next one (program order): the pool hands the same bytes to
        both, so they must not run at once on two streams."""
        edges = read_after_write(((k.index, k.args, k.writes) for k in self.kernels), self.region)
        pool = [k.index for k in self.kernels if k.tvm_workspace]
        return sorted(set(edges) | set(zip(pool, pool[1:])))


def _region(values: list[Value], vid: int) -> tuple[int, int, int]:
    start, v = 0, vid
    while values[v].base is not None:
        start += values[v].offset
        v = values[v].base
    return v, start, start + values[vid].nbytes


def static_shape(ty, what: str) -> tuple[tuple[int, ...], str]:
    """(dims, dtype) of the tensor type ``ty``; a LoweredIRError naming ``what`` unless every dim is static."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise LoweredIRError(f"{what} is not a tensor of known shape ({ty}); Nimble needs static shapes")
    dims = []
    for d in ty.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            raise LoweredIRError(
                f"{what} has a symbolic dimension '{d}'; Nimble needs static shapes: "
                "give every input a fixed shape (shape_dict) before building")
        dims.append(int(d.value))
    return tuple(dims), str(ty.dtype)


def op_name(call: relax.Call) -> str:
    """The name of what ``call`` calls: a global function's name, an extern's symbol, an operator's name."""
    op = call.op
    if isinstance(op, relax.GlobalVar):
        return op.name_hint
    if isinstance(op, relax.ExternFunc):
        return str(op.global_symbol)
    if isinstance(op, tvm.ir.Op):
        return op.name
    return type(op).__name__


def is_vendor_call(call) -> bool:
    """A call of a vendor-kernel global function (cuDNN / cuBLASLt), emitted by ``vendor_offload``."""
    return (isinstance(call, relax.Call) and isinstance(call.op, relax.ExternFunc)
            and str(call.op.global_symbol).startswith(VENDOR_PREFIXES))


def _marker_args(call: relax.Call) -> list[int]:
    return [int(getattr(a.value, "value", a.value)) for a in call.args]


def read_lowered_function(mod: tvm.IRModule, func_name: str = "main") -> LoweredProgram:
    """Parse ``mod[func_name]`` (lowered by ``CallTIRRewrite``) into a :class:`LoweredProgram`."""
    if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise LoweredIRError(f"the module has no function '{func_name}'")
    func = mod[func_name]
    prim_funcs = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    values: list[Value] = []
    var_to_value: dict[object, int] = {}
    const_ids: list[tuple[object, int]] = []
    tuples: dict[object, list[int]] = {}
    written: dict[int, list[tuple[int, int]]] = {}  # root -> byte ranges some kernel wrote
    kernels: list[Kernel] = []
    workspace: dict[str, bool] = {}  # PrimFunc name -> whether it takes memory from TVM's workspace pool
    in_place_roots: set[int] = set()
    pending_stream: int | None = None
    pending_waits: list[int] = []

    def new_value(name, ty, kind, base=None, constant=None, offset=0) -> int:
        shape, dtype = static_shape(ty, f"tensor '{name}'")
        values.append(Value(len(values), name, shape, dtype, kind, base, constant, offset))
        return len(values) - 1

    def value_of(expr, where: str) -> int:
        if isinstance(expr, relax.Var):
            if expr in var_to_value:
                return var_to_value[expr]
            raise LoweredIRError(f"{where}: '{expr.name}' is not a tensor the plan knows")
        if isinstance(expr, Constant):
            for c, vid in const_ids:
                if c.same_as(expr):
                    return vid
            vid = new_value(f"const{len(const_ids)}", expr.ty, "const", constant=expr)
            const_ids.append((expr, vid))
            return vid
        raise LoweredIRError(f"{where}: unsupported argument {type(expr).__name__}")

    for p in func.params:
        var_to_value[p] = new_value(p.name, p.ty, "input")
    inputs = list(range(len(values)))

    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise LoweredIRError(f"unsupported binding {type(binding).__name__} (match_cast needs dynamic shapes)")
            var, val = binding.var, binding.value
            where = f"binding '{var.name}'"
            if isinstance(val, relax.Var):
                if val in tuples:
                    tuples[var] = tuples[val]
                else:
                    var_to_value[var] = value_of(val, where)
            elif isinstance(val, Constant):
                var_to_value[var] = value_of(val, where)
            elif isinstance(val, relax.Tuple):
                tuples[var] = [value_of(f, where) for f in val.fields]
            elif isinstance(val, relax.TupleGetItem):
                if val.tuple_value not in tuples:
                    raise LoweredIRError(f"{where}: tuple of unknown origin")
                var_to_value[var] = tuples[val.tuple_value][val.index]
            elif isinstance(val, relax.Call):
                name = op_name(val)
                if name == "relax.builtin.alloc_tensor":
                    var_to_value[var] = new_value(var.name, var.ty, "alloc")
                elif name in _VIEW_OPS:
                    base = value_of(val.args[0], where)
                    var_to_value[var] = new_value(var.name, var.ty, "view", base=base)
                elif name == SLICE_VIEW:
                    base = value_of(val.args[0], where)
                    offset = int(val.args[1].value)
                    var_to_value[var] = new_value(var.name, var.ty, "view", base=base, offset=offset)
                elif name == SET_STREAM:
                    pending_stream = _marker_args(val)[0]
                elif name == WAIT_EVENT:
                    pending_waits.append(_marker_args(val)[0])
                elif name == RECORD_EVENT:
                    if not kernels:
                        raise LoweredIRError("record_event marker before any kernel")
                    kernels[-1].records.append(_marker_args(val)[0])
                elif (isinstance(val.op, relax.GlobalVar) and name in prim_funcs) or is_vendor_call(val):
                    literals = []
                    if is_vendor_call(val):  # attributes travel as shape arguments
                        literals = [[i, [int(d) for d in a.values]] for i, a in enumerate(val.args)
                                    if isinstance(a, relax.ShapeExpr)]
                    elif any(isinstance(a, relax.ShapeExpr) for a in val.args):
                        raise LoweredIRError(f"kernel {name} takes symbolic shape arguments; static shapes only")
                    args = [value_of(a, f"call of {name}") for a in val.args if not isinstance(a, relax.ShapeExpr)]
                    # destination passing: the first kernel to take an allocation's bytes writes them
                    # (a kernel writing one slice of an in-place concat leaves the others unwritten)
                    writes, reads = [], []
                    in_place = {args[i] for i in (in_place_args(prim_funcs[name]) if name in prim_funcs
                                                  else vendor_abi.IN_PLACE.get(name, ()))}
                    for a in args:
                        root, start, end = _region(values, a)
                        if a in in_place:  # written in place: its root (an input) is state
                            writes.append(a)
                            in_place_roots.add(root)
                            continue
                        taken = written.setdefault(root, [])
                        if values[root].kind == "alloc" and not any(s < end and start < e for s, e in taken):
                            writes.append(a)
                            taken.append((start, end))
                        else:
                            reads.append(a)
                    if name in prim_funcs and name not in workspace:
                        workspace[name] = allocates_global_buffers(prim_funcs[name])
                    kernels.append(Kernel(len(kernels), name, args, writes, reads,
                                          pending_stream, pending_waits, literals=literals,
                                          tvm_workspace=workspace.get(name, False)))
                    pending_stream, pending_waits = None, []
                else:
                    raise LoweredIRError(
                        f"{where}: operation '{name}' is not supported by the Nimble launch plan "
                        "(supported: compiled TIR kernels, vendor kernels, alloc_tensor, reshape views, tuples)")
            else:
                raise LoweredIRError(f"{where}: unsupported expression {type(val).__name__}")

    body = func.body.body
    if isinstance(body, relax.Var) and body in tuples:
        outputs, is_tuple = tuples[body], True
    elif isinstance(body, relax.Tuple):
        outputs, is_tuple = [value_of(f, "return") for f in body.fields], True
    else:
        outputs, is_tuple = [value_of(body, "return")], False
    for r in in_place_roots:
        if values[r].kind != "input":
            raise LoweredIRError(f"a kernel writes '{values[r].name}' in place, which is not an input: only state "
                                 "(an input that outlives the run) is written in place")
    states = [i for i in inputs if i in in_place_roots]
    inputs = [i for i in inputs if i not in in_place_roots]
    # a state returned (to keep its in-place writes alive through the passes) is not an output of the plan
    outputs = [o for o in outputs if _region(values, o)[0] not in in_place_roots]
    return LoweredProgram(values, kernels, inputs, [values[i].name for i in inputs], outputs, is_tuple, states)
