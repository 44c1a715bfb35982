"""The launch plan: everything the executor needs to replay a model, as plain data.

A :class:`Plan` is a dataclass with a versioned JSON form (never pickle). It lists the
tensors (each a view at offset 0 of a storage block, as in TVM's own memory planner), the
storage blocks, and the ordered kernel launches with their stream, the events they wait on
and the events they record. The launch list is a topological order; each stream runs its
launches in list order.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from tvm_nimble.errors import NimbleError

from .vendor_abi import VENDOR_PREFIXES

#: Byte alignment of a view that starts inside its storage (see :func:`tvm_nimble.runtime.device.tensor_at`)
SLICE_ALIGN = 64

PLAN_FORMAT = "tvm-nimble-plan"
PLAN_VERSION = 1

# What a tensor is to the model (``TensorSlot.kind``) ...
INPUT = "input"
OUTPUT = "output"
CONST = "const"
INTERMEDIATE = "intermediate"
#: state: memory that outlives a run, which the kernels read and update in place (a decoder's KV cache); the
#: executor allocates it zeroed and never copies it in or out
STATE = "state"
TENSOR_KINDS = (INPUT, OUTPUT, CONST, INTERMEDIATE, STATE)
# ... and what its storage is (``Storage.kind``): inputs, outputs and constants have their own, the
# intermediates share the pool blocks the memory plan proves safe
POOL = "pool"
STORAGE_KINDS = (INPUT, OUTPUT, CONST, POOL, STATE)


class PlanError(NimbleError):
    """A plan (or its JSON) is malformed or inconsistent."""


@dataclass
class TensorSlot:
    """A tensor the kernels read or write: a typed view of a storage block."""

    id: int
    name: str
    shape: list[int]
    dtype: str
    kind: str  # one of TENSOR_KINDS
    storage: int
    offset: int = 0
    view_of: int | None = None  # a reshape view shares the memory of this tensor

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * _dtype_bytes(self.dtype)


@dataclass
class Storage:
    """A device allocation; several tensors may share it when the memory plan proves it safe."""

    id: int
    nbytes: int
    kind: str  # one of STORAGE_KINDS


@dataclass
class Launch:
    """One kernel launch: ``kernel(*call args)``, the call args being the tensors ``args`` with each
    literal ``[position, [ints]]`` of ``literals`` inserted at its position as a shape (the attributes
    of a vendor call, e.g. a convolution's strides and padding)."""

    idx: int
    kernel: str
    args: list[int]
    writes: list[int]
    stream: int
    waits: list[int] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    literals: list = field(default_factory=list)


@dataclass
class Plan:
    target: dict
    num_streams: int
    num_events: int
    tensors: list[TensorSlot]
    storages: list[Storage]
    launches: list[Launch]
    inputs: list[int]
    outputs: list[int]
    constants: list[int]
    output_is_tuple: bool = False
    memory: dict = field(default_factory=dict)
    #: input name -> size of the table its values index (Gather/take), for ``check_inputs``
    index_bounds: dict = field(default_factory=dict)
    #: per stream, 1 where the stream runs ahead of the others when both have work ready (a CUDA stream
    #: priority: the streams that carry the critical path); empty: all streams equal
    stream_priority: list = field(default_factory=list)
    #: the state tensors (kind ``state``), in the order of the function's parameters
    states: list = field(default_factory=list)
    #: whether the plan's TVM kernels (every launch but the vendor calls) begin by waiting for the kernels they
    #: depend on (``griddepcontrol.wait``: built so for sm_90+, ``codegen.dependent_launch``): a CUDA graph of the
    #: plan may then launch each of them as a programmatic dependent of the kernel before it
    dependent_launch: bool = False
    version: int = PLAN_VERSION

    # ---- queries -----------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [self.tensors[i].name for i in self.inputs]

    @property
    def state_names(self) -> list[str]:
        return [self.tensors[i].name for i in self.states]

    @property
    def vendor_kernels(self) -> set[str]:
        """The vendor functions the plan calls: what its vendor extension must define."""
        return {l.kernel for l in self.launches if l.kernel.startswith(VENDOR_PREFIXES)}

    @property
    def uses_vendor_kernels(self) -> bool:
        return bool(self.vendor_kernels)

    @property
    def dependent_launches(self) -> set[int]:
        """The launches a CUDA graph may make programmatic dependents of the kernels before them: with
        ``dependent_launch``, every TVM kernel (a vendor call launches its own kernels, ours with the attribute)."""
        if not self.dependent_launch:
            return set()
        return {l.idx for l in self.launches if not l.kernel.startswith(VENDOR_PREFIXES)}

    def stream_launches(self, stream: int) -> list[Launch]:
        return [l for l in self.launches if l.stream == stream]

    def root(self, tid: int) -> int:
        """The tensor that owns ``tid``'s memory (views resolve to their base)."""
        while self.tensors[tid].view_of is not None:
            tid = self.tensors[tid].view_of
        return tid

    def region(self, tid: int) -> tuple[int, int, int]:
        """(root, first byte, end byte) of ``tid`` within its root tensor's memory."""
        r = self.root(tid)
        start = self.tensors[tid].offset - self.tensors[r].offset
        return r, start, start + self.tensors[tid].nbytes

    def read_after_write(self) -> list[tuple[int, int]]:
        """(writer, reader) launch pairs: see :func:`read_after_write`."""
        return read_after_write(((l.idx, l.args, l.writes) for l in self.launches), self.region)

    def recorder_of_event(self) -> dict[int, int]:
        """event id -> index of the launch that records it."""
        return {e: l.idx for l in self.launches for e in l.records}

    # ---- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        if not self.states:  # a stateless plan's JSON is what it was before states existed
            del d["states"]
        if not self.dependent_launch:  # likewise
            del d["dependent_launch"]
        d["format"] = PLAN_FORMAT
        return d

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Plan":
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as err:
            raise PlanError(f"plan JSON is not valid JSON ({err}); rebuild the artifact") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise PlanError("not a tvm-nimble plan (missing format tag); rebuild the artifact")
        if data.get("version") != PLAN_VERSION:
            raise PlanError(f"plan format version {data.get('version')} is not supported by this "
                            f"tvm-nimble (expects {PLAN_VERSION}); rebuild the artifact with this version")
        try:
            plan = cls(
                target=dict(data["target"]),
                num_streams=_int(data["num_streams"]),
                num_events=_int(data["num_events"]),
                tensors=[TensorSlot(**t) for t in data["tensors"]],
                storages=[Storage(**s) for s in data["storages"]],
                launches=[Launch(**l) for l in data["launches"]],
                inputs=[_int(i) for i in data["inputs"]],
                outputs=[_int(i) for i in data["outputs"]],
                constants=[_int(i) for i in data["constants"]],
                output_is_tuple=bool(data.get("output_is_tuple", False)),
                memory=dict(data.get("memory", {})),
                index_bounds={str(k): _int(v) for k, v in data.get("index_bounds", {}).items()},
                stream_priority=[_int(p) for p in data.get("stream_priority", [])],
                states=[_int(i) for i in data.get("states", [])],
                dependent_launch=bool(data.get("dependent_launch", False)),
            )
        except (KeyError, TypeError) as err:
            raise PlanError(f"plan JSON is missing or has a malformed field ({err}); rebuild the artifact") from None
        plan.validate()
        return plan

    def validate(self) -> None:
        """Check every cross-reference, so a corrupted plan fails here and not in a kernel."""
        nt, ns = len(self.tensors), len(self.storages)
        for i, t in enumerate(self.tensors):
            _check(t.id == i, f"tensor {i} has id {t.id}")
            _check(t.kind in TENSOR_KINDS, f"tensor {i} has unknown kind {t.kind!r}")
            _check(0 <= t.storage < ns, f"tensor {i} refers to missing storage {t.storage}")
            _check(all(isinstance(d, int) and d >= 0 for d in t.shape), f"tensor {i} has a bad shape {t.shape}")
            _dtype_bytes(t.dtype)
            _check(t.view_of is None or 0 <= t.view_of < i, f"tensor {i} is a view of a missing tensor")
            _check(t.offset >= 0 and t.offset + t.nbytes <= self.storages[t.storage].nbytes,
                   f"tensor {i} ({t.nbytes} bytes at offset {t.offset}) overflows storage {t.storage}")
            _check(t.offset % SLICE_ALIGN == 0, f"tensor {i} starts at byte {t.offset}, not a multiple of {SLICE_ALIGN}")
        for i, s in enumerate(self.storages):
            _check(s.id == i and s.nbytes >= 0, f"storage {i} is malformed")
            _check(s.kind in STORAGE_KINDS, f"storage {i} has unknown kind {s.kind!r}")
        _check(self.num_streams >= 1 or not self.launches, "num_streams must be >= 1")
        _check(not self.stream_priority or (len(self.stream_priority) == self.num_streams
                                            and set(self.stream_priority) <= {0, 1}),
               f"stream_priority must be empty or one 0/1 per stream, got {self.stream_priority}")
        recorded = set()
        recorder = {}
        for l in self.launches:
            for e in l.records:
                recorder.setdefault(e, l.idx)
        for i, l in enumerate(self.launches):
            _check(l.idx == i, f"launch {i} has idx {l.idx}")
            _check(0 <= l.stream < max(self.num_streams, 1), f"launch {i} uses stream {l.stream} of {self.num_streams}")
            _check(all(0 <= a < nt for a in l.args + l.writes), f"launch {i} refers to a missing tensor")
            _check(set(l.writes) <= set(l.args), f"launch {i} writes a tensor it does not take")
            for e in l.waits:
                # a wait binds to the event's last record issued before it: a later record is not waited for
                _check(e in recorded or e not in recorder,
                       f"launch {i} waits on event {e}, which only launch {recorder.get(e)} records, "
                       f"{'the same launch' if recorder.get(e) == i else 'a later one'} (a wait binds to a record "
                       "issued before it: this one would not wait)")
                _check(e in recorded, f"launch {i} waits on event {e} that no earlier launch records")
            for e in l.records:
                _check(0 <= e < self.num_events and e not in recorded, f"launch {i} records event {e} twice or out of range")
                recorded.add(e)
        for name, ids in (("input", self.inputs), ("output", self.outputs), ("constant", self.constants),
                          ("state", self.states)):
            _check(all(0 <= i < nt for i in ids), f"an {name} refers to a missing tensor")
        for i in self.states:
            _check(self.tensors[i].kind == STATE and self.storages[self.tensors[i].storage].kind == STATE,
                   f"state tensor {i} is not of kind state in a state storage")

    # ---- human-readable ---------------------------------------------------------------
    def format_table(self) -> str:
        """One line per launch: idx, stream, kernel, waits, records, args."""
        rows = [("idx", "stream", "kernel", "waits", "records", "args (tensor:storage)")]
        for l in self.launches:
            args = " ".join(f"{'*' if a in l.writes else ''}t{a}:s{self.tensors[a].storage}" for a in l.args)
            rows.append((str(l.idx), str(l.stream), l.kernel, _ids(l.waits), _ids(l.records), args))
        widths = [max(len(r[c]) for r in rows) for c in range(5)]
        lines = ["  ".join(r[c].ljust(widths[c]) for c in range(5)) + "  " + r[5] for r in rows]
        lines.append(f"{len(self.launches)} launches on {self.num_streams} stream(s), {self.num_events} event(s); "
                     "*t = written by the launch")
        return "\n".join(lines)


def _ids(ids: list[int]) -> str:
    return ",".join(f"e{e}" for e in ids) or "-"


def _int(x) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        raise PlanError(f"expected an integer in the plan, got {x!r}; rebuild the artifact")
    return x


def read_after_write(launches, region) -> list[tuple[int, int]]:
    """(writer, reader) pairs, sorted and deduplicated: ``reader`` reads bytes that ``writer``, earlier
    in the list, wrote.

    ``launches`` yields (index, args, writes) in program order; ``region(t)`` gives tensor ``t``'s
    (root, first byte, end byte). Every tensor is written once (destination passing), but one root may
    be written in disjoint slices by several launches (a concatenation built in place): a reader of
    the whole root depends on every slice's writer, a reader of one slice only on that slice's."""
    written: dict[int, list[tuple[int, int, int]]] = {}
    edges: set[tuple[int, int]] = set()
    for idx, args, writes in launches:
        for a in args:
            if a in writes:
                continue
            root, start, end = region(a)
            for ws, we, w in written.get(root, ()):
                if ws < end and start < we and w != idx:
                    edges.add((w, idx))
        for a in writes:
            root, start, end = region(a)
            written.setdefault(root, []).append((start, end, idx))
    return sorted(edges)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise PlanError(f"invalid plan: {msg}; rebuild the artifact")


_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
                "int32": 4, "int64": 8, "bool": 1, "uint32": 4, "uint16": 2, "uint64": 8}


def _dtype_bytes(dtype: str) -> int:
    if dtype not in _DTYPE_BYTES:
        raise PlanError(f"unsupported dtype {dtype!r} in plan")
    return _DTYPE_BYTES[dtype]
