"""What an executor takes as an input, and the checks every input passes before it reaches a kernel.

Both executors (one plan, :mod:`.executor`; batch buckets, :mod:`.bucketed`) take their inputs through
:class:`InputRules`, so a wrong input gives the same one-line :class:`InputError` (or
:class:`~tvm_nimble.errors.ShapeError`) from either: the input's name or index, its shape, its dtype, an
index out of its table's range (``check_inputs``, on by default, as ONNX Runtime does), and a NaN or an
infinity (``check_finite``, off by default: the kernels do not promise to propagate them; on llvm a ReLU
turns a NaN into 0, where ONNX Runtime and PyTorch give NaN).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_nimble.errors import NimbleError, ShapeError


class InputError(NimbleError):
    """An input does not match what the model was built for."""


def as_input(value, name: str, device):
    """``value`` (numpy array, TVM tensor or any DLPack tensor) as a C-contiguous numpy array or a TVM
    tensor on the host or on ``device``; one line naming what cannot be taken."""
    import tvm

    if isinstance(value, np.ndarray):
        return np.asarray(value, order="C")  # (ascontiguousarray would turn 0-d into 1-d)
    if isinstance(value, tvm.runtime.Tensor):
        tensor = value
    elif hasattr(value, "__dlpack__"):
        on_host = hasattr(value, "__dlpack_device__") and int(value.__dlpack_device__()[0]) == 1
        try:
            if on_host:  # numpy accepts any host DLPack tensor (strided, unaligned): copied in
                return np.asarray(np.from_dlpack(value), order="C")
            tensor = tvm.runtime.from_dlpack(value)  # device tensor: no copy through the host
        except Exception as err:
            raise InputError(f"input {name!r}: cannot take it through DLPack ({str(err).splitlines()[0]}); "
                             "pass a contiguous tensor or a numpy array") from None
    else:
        try:
            arr = np.asarray(value, order="C")
        except Exception:
            arr = None
        if arr is None or arr.dtype.kind in "OUSV":
            raise InputError(f"input {name!r}: expected a numpy array, TVM tensor or DLPack tensor, "
                             f"got {type(value).__name__}")
        return arr
    if not tensor.is_contiguous():
        raise InputError(f"input {name!r} is not contiguous; call .contiguous() (torch) or np.ascontiguousarray")
    dev = tensor.device
    if dev.dlpack_device_type() not in (1, device.dlpack_device_type()):
        raise InputError(f"input {name!r} is on {dev}, the executor runs on {device}")
    return tensor


def _host(src) -> np.ndarray:
    return src if isinstance(src, np.ndarray) else src.numpy()


@dataclass(frozen=True)
class InputRules:
    """How an executor of ``plan`` takes its inputs. ``buckets`` (a bucketed executor's
    :class:`~tvm_nimble.runtime.buckets.BucketSpace`): any extent of the bucketed axes, the others as in ``plan``;
    None: exactly the plan's shapes."""

    plan: object  # tvm_nimble.contract.plan.Plan
    device: object
    check_inputs: bool = True
    check_finite: bool = False
    buckets: object = None

    @property
    def names(self) -> list[str]:
        return self.plan.input_names

    def index(self, key) -> int:
        """The position of input ``key`` (a name or an index)."""
        names = self.names
        if isinstance(key, str):
            if key not in names:
                raise InputError(f"unknown input {key!r}; the model's inputs are {names}")
            return names.index(key)
        if not 0 <= key < len(names):
            raise InputError(f"input index {key} out of range: the model has {len(names)} input(s) {names}")
        return key

    def prepare(self, key, value) -> tuple[int, object]:
        """(index, value as :func:`as_input` gives it) of input ``key``, every check passed."""
        i = self.index(key)
        slot = self.plan.tensors[self.plan.inputs[i]]
        src = as_input(value, slot.name, self.device)
        shape = list(src.shape)
        if self.buckets is not None:
            self.buckets.check_shape(i, slot.name, shape, slot.shape)
        elif shape != slot.shape:
            raise ShapeError(f"input {slot.name!r} has shape {shape}, the model was built for {slot.shape}")
        if str(src.dtype) != slot.dtype:
            raise InputError(f"input {slot.name!r} has dtype {src.dtype}, the model expects {slot.dtype}; cast it first")
        if self.check_inputs and slot.name in self.plan.index_bounds:
            _check_indices(slot.name, _host(src), self.plan.index_bounds[slot.name])
        if self.check_finite:
            refuse_non_finite(slot.name, _host(src))
        return i, src

    def prepare_all(self, inputs: tuple, named: dict) -> list:
        """Every input, in the model's order, from positional ``inputs`` and ``named`` ones, each prepared."""
        names = self.names
        if len(inputs) + len(named) != len(names):
            raise InputError(f"the model takes {len(names)} input(s) {names}, got {len(inputs) + len(named)}")
        prepared = [self.prepare(i, v) for i, v in enumerate(inputs)]
        prepared += [self.prepare(k, v) for k, v in named.items()]
        if len({i for i, _ in prepared}) != len(names):
            raise InputError(f"input(s) given twice: the model's inputs are {names}")
        return [src for _, src in sorted(prepared, key=lambda p: p[0])]


def _check_indices(name: str, values: np.ndarray, size: int) -> None:
    if values.size and (values.min() < -size or values.max() >= size):
        bad = values[(values < -size) | (values >= size)].flat[0]
        raise InputError(f"input {name!r} indexes a table of {size} rows but holds {bad}; valid indices are "
                         f"{-size}..{size - 1}")


def refuse_non_finite(name: str, values: np.ndarray) -> None:
    """One :class:`InputError` naming input ``name`` and the element when ``values`` holds a NaN or an infinity."""
    if np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_:
        return
    finite = np.isfinite(values)  # (ml_dtypes' bfloat16 and float8 arrays too)
    if not finite.all():
        where = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise InputError(f"input {name!r} holds {values[where]} at {list(where)}; the model's kernels need not "
                         "carry NaN or infinity through (a ReLU may turn NaN into 0): pass finite values, or "
                         "check_finite=False to run it anyway")


class ChecksInputs:
    """The input side both executors share: what they check (their ``_rules``, an :class:`InputRules`) and how
    ``set_input`` takes a value under the thread rules (their ``_lock`` and ``_turns``)."""

    _rules: InputRules

    def _take_input(self, key, value, keep) -> None:
        """Check ``value`` for input ``key`` and hand it to ``keep(index, checked value)``, as this thread's."""
        from threading import current_thread

        self._check_open()
        i, src = self._rules.prepare(key, value)
        me = current_thread()
        with self._lock:
            self._turns.claim(me, "set_input")
            keep(i, src)
            self._turns.input_set(i, me)

    @property
    def check_inputs(self) -> bool:
        return self._rules.check_inputs

    @property
    def check_finite(self) -> bool:
        return self._rules.check_finite
