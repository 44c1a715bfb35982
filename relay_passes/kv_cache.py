"""The KV cache as state: a decoder exported with past key/values becomes one step of generation over a cache that
lives on the device and is updated in place.

A decoder exported as optimum and ONNX Runtime GenAI export them takes ``input_ids``, ``attention_mask``,
``position_ids`` and, per layer, ``past_key_values.N.key`` / ``.value`` ([batch, kv heads, past, head dim]), and
returns ``logits`` and ``present.N.key`` / ``.value``: each present is ``Concat(past, new, axis=2)``, which the
attention then reads. Run as it is, every step copies the whole cache in and out. :func:`cache_step` rewrites the
imported Relax function so that the cache is *state*: a parameter of ``[batch, kv heads, max_length, head dim]``
that a kernel writes in place (``R.call_tir_inplace`` of :func:`kv_write`, which writes each new position's key and
value at the slot its ``position_ids`` entry names, read from device memory) and the attention reads. The plan
keeps such a parameter in storage of its own that outlives a run (``relay_passes.lowered_ir``: an input a kernel
writes in place is state), so one captured graph serves every step. Two steps come out of one export:

- ``decode`` (past length ``max_length - 1``, one new token): ``Concat(past, new)`` becomes the cache with ``new``
  written at ``position_ids``; the attention reads all ``max_length`` slots, masked by ``attention_mask``
  (``[batch, max_length]``, 1 where a slot holds a token). The exported causal mask is trivially true there: the
  query sits at the last slot.
- ``prefill`` (past length 1, a prompt bucket of new tokens): the past is one zero slot, masked by
  ``attention_mask[:, 0] = 0``, so the exported causal mask is the prompt's own; the prompt's keys and values are
  written into the cache at ``position_ids`` besides.

Either step returns ``(next_ids, logits)``: the argmax over the vocabulary at every position (greedy decoding
reads a few integers, not the logits) and the logits. The presents are no longer outputs; the prefill's cache
writes are returned after them, so that nothing removes them as dead code (the plan does not return a state).
The cache's dtype is the step's compute dtype (a reduced-precision build keeps its cache in 16 bits).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from tvm_nimble.contract.generation import STATE_NAME, STEP_INPUTS
from tvm_nimble.contract.markers import IN_PLACE_ATTR
from tvm_nimble.errors import ModelError

from .providers.chains import Substitute, operator_of

#: an exported past key/value input, as TVM's ONNX importer names it (dots become underscores)
PAST_INPUT = re.compile(r"past_key_values[._](\d+)[._](key|value)")
ROLES = ("prefill", "decode")


class KvCacheError(ModelError):
    """The model is not a decoder exported with past key/values the rewrite can take."""


@dataclass(frozen=True)
class KvCacheSpec:
    """Which step to make of a with-past export: ``role`` (``prefill`` or ``decode``), the cache's ``max_length``
    (slots per sequence), ``dtype`` (None: the dtype the present's concatenation computes in) and whether the
    cache write and the greedy argmax are GPU kernels (``gpu``: scheduled here, see :func:`kv_write` and
    :func:`greedy_ids`)."""

    role: str
    max_length: int
    dtype: str | None = None
    gpu: bool = False

    def __post_init__(self):
        if self.role not in ROLES:
            raise KvCacheError(f"kv cache role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.max_length, int) or self.max_length < 2:
            raise KvCacheError(f"kv cache max_length must be an integer >= 2, got {self.max_length!r}")

    def past_length(self) -> int:
        """The past length the export is imported at for this step."""
        return self.max_length - 1 if self.role == "decode" else 1


def past_inputs(names) -> dict[str, tuple[int, str]]:
    """input name -> (layer, "key"|"value") of the past key/value inputs among ``names`` (ONNX or Relax spelling)."""
    found = {}
    for n in names:
        m = PAST_INPUT.fullmatch(n)
        if m:
            found[n] = (int(m.group(1)), m.group(2))
    return found


def step_inputs(names) -> dict[str, tuple[int, str]]:
    """:func:`past_inputs` of a with-past export's input ``names``; one line when they are not a generation step's
    (no past key/values, or one of :data:`STEP_INPUTS` missing)."""
    past = past_inputs(names)
    if not past:
        raise KvCacheError("the model has no past key/value inputs (past_key_values.N.key / .value): export the "
                           "decoder with its cache (optimum's 'text-generation-with-past', or torch.onnx.export with "
                           "past_key_values inputs and present outputs); the full-sequence form is not supported yet")
    missing = [n for n in STEP_INPUTS if n not in names]
    if missing:
        raise KvCacheError(f"the with-past model has no {missing[0]!r} input: a generation step needs "
                           f"{', '.join(STEP_INPUTS)} (export position_ids as an input)")
    return past


#: threads per block of the GPU cache write
KV_WRITE_THREADS = 256


def kv_write(cache_shape, new_len: int, dtype: str, gpu: bool = False, heads_first=True) -> tvm.tirx.PrimFunc:
    """``cache[b, h, pos[b, s], :] = new[b, h, s, :]`` for every new position ``s``, in place (argument 0), a position
    outside the cache writing nothing (the kernel stays in bounds whatever its input holds: a measurement's random
    inputs, another step's leftovers in a shared buffer). ``heads_first=False``: ``new`` is [b, s, h, :], as the
    projection gives it before the exporter's transpose (which then costs no kernel). With ``gpu``, scheduled a
    thread per element (DLight's rules do not take a write at a position read from memory).

    ``heads_first`` a tuple of n flags: n caches of the same shape written by one kernel (a layer's key and value:
    one launch instead of two), arguments ``cache_0 .. cache_{n-1}, new_0 .. new_{n-1}, pos``, the caches in place."""
    flags = (heads_first,) if isinstance(heads_first, bool) else tuple(bool(f) for f in heads_first)
    n = len(flags)
    b, h, length, d = (int(x) for x in cache_shape)
    cache_type = f'T.Buffer((T.int64({b}), T.int64({h}), T.int64({length}), T.int64({d})), "{dtype}")'

    def new_type(first: bool) -> str:
        dims = f"T.int64({b}), T.int64({h}), T.int64({new_len})" if first else \
            f"T.int64({b}), T.int64({new_len}), T.int64({h})"
        return f'T.Buffer(({dims}, T.int64({d})), "{dtype}")'

    def at(first: bool) -> str:
        return "ib, ih, is_, id_" if first else "ib, is_, ih, id_"

    params = [f"cache_{i}: {cache_type}" for i in range(n)] + [f"new_{i}: {new_type(f)}" for i, f in enumerate(flags)]
    reads = ", ".join(f"new_{i}[{at(f)}]" for i, f in enumerate(flags))
    writes = ", ".join(f"cache_{i}[ib, ih, T.int64(0):T.int64({length}), id_]" for i in range(n))
    stores = "\n".join(f"                cache_{i}[ib, ih, pos[ib, is_], id_] = new_{i}[{at(f)}]"
                       for i, f in enumerate(flags))
    text = f'''
@T.prim_func(private=True, s_tir=True)
def kv_write({", ".join(params)}, pos: T.Buffer((T.int64({b}), T.int64({new_len})), "int64")):
    T.func_attr({{"tirx.noalias": True, "{IN_PLACE_ATTR}": {list(range(n))}}})
    for vb, vh, vs, vd in T.grid(T.int64({b}), T.int64({h}), T.int64({new_len}), T.int64({d})):
        with T.sblock("kv_write"):
            ib, ih, is_, id_ = T.axis.remap("SSSS", [vb, vh, vs, vd])
            T.reads({reads}, pos[ib, is_])
            T.writes({writes})
            if pos[ib, is_] >= T.int64(0) and pos[ib, is_] < T.int64({length}):
{stores}
'''
    func = tvm.script.from_source(text)
    if not gpu:
        return func
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    fused = sch.fuse(*sch.get_loops(sch.get_sblock("kv_write")))
    bx, tx = sch.split(fused, [None, KV_WRITE_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


#: threads of a block of the GPU argmax: one block per row, each thread a strided share of the vocabulary
ARGMAX_THREADS = 1024


def greedy_ids(logits_shape, dtype: str, gpu: bool = False) -> tvm.tirx.PrimFunc:
    """``argmax(logits, axis=-1)`` (the first index of the largest value) as TVM's operator legalizes it; with
    ``gpu`` scheduled a block per row: each thread reduces a strided share of the vocabulary, its loads unrolled
    so that they are in flight together, then TVM's cross-thread reduction (which keeps the lower index on a tie).
    TVM's default GPU schedule reduced a decode step's 50,257 logits in one thread's serial loop (40 us on an
    H100, more than the step's LayerNorms together)."""
    bb = relax.BlockBuilder()
    x = relax.Var("logits", relax.TensorType([int(d) for d in logits_shape], dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.argmax(x, axis=-1)))
        bb.emit_func_output(out)
    legalized = relax.transform.LegalizeOps()(bb.get())
    func = next(f for f in legalized.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    if not gpu:
        return func
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    reduce = sch.get_sblock("logits_red_temp")
    *rows, vocab = sch.get_loops(reduce)
    row = sch.fuse(*rows)
    serial, thread = sch.split(vocab, [None, ARGMAX_THREADS])
    sch.bind(row, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    sch.unroll(serial)
    sch.reverse_compute_at(sch.get_sblock("logits_red"), row)
    sch.set_scope(reduce, 0, "local")
    sch.set_scope(reduce, 1, "local")
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _tensor(ty) -> tuple[list[int], str]:
    return [int(x) for x in ty.shape.values], str(ty.dtype)


def _through_identity(expr, bound: dict):
    """``expr`` with one-field concatenations and float casts looked through (what the exporter and the precision
    pass put between a past input and its Concat)."""
    while isinstance(expr, relax.Var) and expr in bound:
        value = bound[expr]
        if operator_of(value) == "relax.concat" and len(value.args[0].fields) == 1:
            expr = value.args[0].fields[0]
        elif operator_of(value) == "relax.astype":
            expr = value.args[0]
        else:
            break
    return expr


def cache_step(mod: tvm.IRModule, spec: KvCacheSpec, func_name: str = "main") -> tvm.IRModule:
    """``mod`` (a with-past export imported at ``spec.past_length()``) as one step over an in-place KV cache (see
    the module docstring); a :class:`KvCacheError` of one line when it is not such an export."""
    func = mod[func_name]
    params = {p.name: p for p in func.params}
    past = step_inputs(params)
    if not isinstance(func.body, relax.SeqExpr) or len(func.body.blocks) != 1:
        raise KvCacheError("the imported model is not one dataflow block; cannot place its KV cache")
    block = func.body.blocks[0]
    bound = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
    uses: dict = {}
    for b in block.bindings:
        for v in relax.analysis.free_vars(b.value) if isinstance(b.value, relax.Expr) else ():
            uses.setdefault(v, []).append(b)
    outputs = set(relax.analysis.free_vars(func.body.body))

    bb = relax.BlockBuilder(tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != func_name}))
    states: dict[str, relax.Var] = {}  # by past input name
    kernels: dict[tuple, relax.GlobalVar] = {}
    writes: list[relax.Var] = []
    var_map: dict[relax.Var, relax.Expr] = {}
    emitted: dict[relax.Var, relax.Expr] = {}  # what each emitted var is bound to
    presents: set = set()

    def state_for(name: str, new_shape, dtype) -> relax.Var:
        if name not in states:
            layer, kind = past[name]
            shape = [new_shape[0], new_shape[1], spec.max_length, new_shape[3]]
            states[name] = relax.Var(STATE_NAME.format(layer=layer, kind=kind), relax.TensorType(shape, dtype))
        return states[name]

    def source(new: relax.Expr, dtype: str, values: dict) -> tuple[relax.Expr, bool]:
        """What a cache write reads for ``new`` (the concatenation's new keys or values, bound in ``values``), and
        whether it is [B, H, S, D]: the new keys/values where they were before the exporter's transpose to
        [B, H, S, D] and the precision pass's exact widening for the concatenation (those become dead, and cost no
        kernel)."""
        value = values.get(new)
        if operator_of(value) == "relax.astype" and _tensor(value.args[0].ty)[1] == dtype:
            new, value = value.args[0], values.get(value.args[0])
        heads_first = not (operator_of(value) == "relax.permute_dims" and value.attrs.axes is not None
                           and [int(a) for a in value.attrs.axes] == [0, 2, 1, 3])
        return (new if heads_first else value.args[0]), heads_first

    def write(entries: list[tuple[relax.Var, relax.Expr, bool]], new_len: int, dtype: str) -> list[relax.Expr]:
        """The caches of ``entries`` ((state, what to write, whether it is [B, H, S, D]): one, or a layer's key and
        value, of one shape) written by one kernel; the written caches, in order."""
        shape, _ = _tensor(entries[0][0].ty)
        news = [new if _tensor(new.ty)[1] == dtype else bb.emit(relax.op.astype(new, dtype)) for _, new, _ in entries]
        flags = tuple(first for _, _, first in entries)
        key = (tuple(shape), new_len, dtype, flags)
        if key not in kernels:
            kernels[key] = bb.add_func(kv_write(shape, new_len, dtype, spec.gpu, flags), "kv_write")
        out = relax.TensorType(shape, dtype)
        args = [state for state, _, _ in entries] + news + [position_ids]
        if len(entries) == 1:
            return [bb.emit(relax.call_tir_inplace(kernels[key], args, [0], out))]
        both = bb.emit(relax.call_tir_inplace(kernels[key], args, list(range(len(entries))), [out] * len(entries)))
        return [bb.emit(relax.TupleGetItem(both, i)) for i in range(len(entries))]

    # the concatenations of a past input with the new keys or values: binding index -> the past input's name
    concats = {}
    for i, b in enumerate(block.bindings):
        v = b.value
        if operator_of(v) == "relax.concat" and len(v.args[0].fields) == 2:
            past_var = _through_identity(v.args[0].fields[0], bound)
            if isinstance(past_var, relax.Var) and past_var.name in past:
                concats[i] = past_var.name

    def concat_of(i: int) -> tuple[str, relax.Expr, str, str]:
        """Concatenation ``i``'s past input name, its new keys or values (as imported), the cache's and the concat's
        dtype."""
        binding = block.bindings[i]
        concat_dtype = _tensor(binding.var.ty)[1]
        return concats[i], binding.value.args[0].fields[1], spec.dtype or concat_dtype, concat_dtype

    # a layer's key and value concatenations, both caches written by one kernel where what the second writes is
    # computed before the first concatenation (a fused QKV projection's split, merged projections): one launch less
    index = {b.var: i for i, b in enumerate(block.bindings)}
    by_layer: dict[int, list[int]] = {}
    for i, name in concats.items():
        by_layer.setdefault(past[name][0], []).append(i)
    partner_of = {}  # the first concatenation's binding index -> (the second's, what it writes, [B, H, S, D]?)
    for first, *rest in (sorted(v) for v in by_layer.values()):
        if len(rest) != 1 or past[concats[first]][1] == past[concats[rest[0]]][1]:
            continue
        _, new_first, dtype_first, _ = concat_of(first)
        _, new_second, dtype_second, _ = concat_of(rest[0])
        src, heads_first = source(new_second, dtype_second, bound)
        if dtype_first == dtype_second and _tensor(new_first.ty)[0] == _tensor(new_second.ty)[0] and \
                isinstance(src, relax.Var) and index.get(src, -1) < first:
            partner_of[first] = (rest[0], src, heads_first)
    paired: dict[int, relax.Expr] = {}  # the second concatenation's binding index -> its cache, written already

    new_params = [p for p in func.params if p.name not in past]
    with bb.function(func_name, new_params, attrs=dict(func.attrs) if func.attrs else None):
        with bb.dataflow():
            position_ids = params["position_ids"]
            if _tensor(position_ids.ty)[1] != "int64":
                position_ids = bb.emit(relax.op.astype(position_ids, "int64"))
            for i, binding in enumerate(block.bindings):
                value = Substitute(var_map).visit_expr(binding.value) if var_map else binding.value
                if i in concats:
                    name, _, dtype, concat_dtype = concat_of(i)
                    new = value.args[0].fields[1]
                    new_shape = _tensor(new.ty)[0]
                    state = state_for(name, new_shape, dtype)
                    presents.add(binding.var)
                    if i in paired:
                        cache = paired.pop(i)
                    else:
                        entries = [(state, *source(new, dtype, emitted))]
                        if i in partner_of:
                            second, src, heads_first = partner_of[i]
                            other = state_for(concats[second], new_shape, dtype)
                            entries.append((other, Substitute(var_map).visit_expr(src), heads_first))
                        cache, *others = write(entries, new_shape[2], dtype)
                        if others:
                            paired[partner_of[i][0]] = others[0]
                    if spec.role == "decode":
                        if dtype != concat_dtype and not _moved_then_cast(binding.var, dtype, uses, outputs):
                            cache = bb.emit(relax.op.astype(cache, concat_dtype))
                        var_map[binding.var] = cache
                        continue
                    writes.append(cache)
                    # the prefill's past: one zero slot, masked by attention_mask[:, 0] = 0
                    zero_shape = _tensor(binding.value.args[0].fields[0].ty)[0]
                    zero = relax.const(np.zeros(zero_shape, concat_dtype), concat_dtype)
                    value = relax.op.concat([zero, new], axis=int(value.attrs.axis))
                if operator_of(value) == "relax.astype" and _tensor(value.args[0].ty)[1] == str(value.attrs.dtype):
                    var_map[binding.var] = value.args[0]  # a cast to the dtype its input has now (the cache's)
                    continue
                var_map[binding.var] = bb.emit(value, name_hint=binding.var.name)
                emitted[var_map[binding.var]] = value
            logits = _first_output(func.body.body, bound, presents, var_map)
            shape, dtype = _tensor(logits.ty)
            ids = bb.emit(relax.call_tir(bb.add_func(greedy_ids(shape, dtype, spec.gpu), "greedy_ids"), [logits],
                                         relax.TensorType(shape[:-1], "int64")))
            out = bb.emit_output(relax.Tuple([ids, logits, *writes]))
        bb.emit_func_output(out)
    unused = sorted(set(past) - set(states))
    if unused:
        raise KvCacheError(f"past input {unused[0]!r} does not feed a Concat along the sequence axis, as a with-past "
                           "export's present does; cannot place its cache")
    new_mod = bb.finalize()
    func = new_mod[func_name]
    # the states come after the model's own inputs, layer by layer, key before value
    ordered = [states[n] for n in sorted(states, key=lambda n: (past[n][0], past[n][1] != "key"))]
    func = relax.Function(list(func.params) + ordered, func.body, func.ret_ty, func.is_pure, func.attrs)
    new_mod[func_name] = func
    # the substitutions leave var-to-var bindings (a logits var bound to the head's result): folded, so that the
    # providers see the head's cast to the float32 logits right after it (one launch fewer a step)
    return relax.transform.DeadCodeElimination([func_name])(relax.transform.CanonicalizeBindings()(new_mod))


#: data movement that keeps values as they are (its dtype follows its input's)
_MOVES = ("relax.expand_dims", "relax.broadcast_to", "relax.reshape", "relax.permute_dims")


def _moved_then_cast(var, dtype: str, uses: dict, outputs: set, depth: int = 0) -> bool:
    """Whether every reader of ``var`` (the present a precision pass left in float32) only moves it and then casts it
    to ``dtype`` (the attention's Q·Kᵀ and P·V operands), or returns it: then the cache, already in ``dtype``, can
    stand for it with no cast of the whole cache to float32 and back at every step (what a fused-attention match
    needs, and a GQA decoder's repeated K/V read in place)."""
    readers = uses.get(var, [])
    if depth > 8 or (not readers and var not in outputs):
        return False
    for b in readers:
        v = b.value
        if operator_of(v) == "relax.astype" and str(v.attrs.dtype) == dtype:
            continue
        if not (operator_of(v) in _MOVES
                and v.args[0].same_as(var) and _moved_then_cast(b.var, dtype, uses, outputs, depth + 1)):
            if not isinstance(v, relax.Tuple):  # the function's output tuple (the present) is dropped
                return False
    return True


def _first_output(body, bound: dict, presents: set, var_map: dict) -> relax.Expr:
    """The function's first output that is not a present (the logits), in the rewritten function's terms."""
    result = body
    while isinstance(result, relax.Var) and result in bound and isinstance(bound[result], (relax.Var, relax.Tuple)):
        result = bound[result]
    fields = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    logits = [f for f in fields if not (isinstance(f, relax.Var) and _through_identity(f, bound) in presents)]
    if not logits:
        raise KvCacheError("the with-past model returns only its presents: a generation step needs the logits")
    first = logits[0]
    return var_map.get(first, first)
