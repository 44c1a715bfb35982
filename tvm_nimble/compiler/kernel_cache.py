"""The compiled-kernel cache: a warm build loads its lowered module and kernel library instead of making them.

With every measurement in the timing cache (:mod:`.timing_cache`), what a second build of a model still
spent its time on was TVM's lowering (legalization, fusion, DLight or tuned schedules: the "lower" phase)
and code generation (TIR passes, CUDA and host code, nvcc: "generate"): 7 s each for densenet121 on an
H200, the same work every time. Like torch.compile's FX-graph cache, the build keeps both, under the build
session's key of kind ``kernels`` (:meth:`.session.BuildSession.key`): the structural hash of the Relax module
that goes into lowering (its kernels already chosen, providers' calls and weights in it), the tuning database's
contents, the lowering options (concatenations in place, split views), and the context (this format, TVM's
version, a digest of tvm-nimble's sources, the target with its arch). The kernels do not depend on the GPU, so an
entry serves every GPU of the target's arch. An entry is a folder beside the timing cache's GPUs; its weights are
kept once for every entry that has them, by content:

    <timing cache>/kernels/<key digest>/lowered.json   the lowered module (tvm.ir.save_json), its weights
                                                       as placeholders
                                       /kernels.so     the kernel library (export_library)
                                       /entry.json     {"format", "key", "files": {name: sha256},
                                                        "weights": {placeholder: blob sha256}}
                          /weights/<sha256>            one weight, named by its sha256: a JSON line (dtype,
                                                       shape), then its bytes, read straight into the
                                                       buffer that becomes its tensor

The buckets of a bucketed model, the steps of a generator and the builds of one model by changed code lower the
same weights into different entries: each weight is written once, and each entry's store hashes what it would
have written. Within a session a weight is loaded once (every bucket's module holds the same tensor).

It is written into a temporary folder beside its place and renamed there, so a build running at once sees
a whole entry or none. An entry whose files do not match the sha256 recorded, that does not parse or load,
or whose key is not the one asked for, is one note and a rebuild (which replaces it), never a failed build.
Only the user's build (``build``'s last one, also where it reuses the model check's compile) is kept, not
the kernel choice's probes, and the folder is kept under :data:`MAX_BYTES` by dropping the least recently
used entries, and with the last entry that names a weight, the weight.

TVM cannot export a shared library it loaded, so the library a build loads from here exports by copying
``kernels.so`` (its ``export_library``), wherever the build's kernels go (an artifact, a module of the
caller's). Storing costs the library's export (LLVM's code generation of the host code: seconds for
densenet121), once per model.

The build report's ``kernel_cache`` says what the build did: "hit" (loaded from here), "stored" (compiled and kept),
"present" (compiled by the model check, and an entry was there already) or "miss" (compiled, not kept);
the session's :class:`~.session.CacheMemory` counts loads, misses and writes. ``kernel_cache=False`` (or
``timing_cache="off"``) turns it off.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass

import tvm
from tvm_ffi.serialization import from_json_graph_str

from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes.host_arrays import aligned_empty, as_numpy, as_tensor
from tvm_nimble.runtime.artifact import file_sha256


#: bumped when an entry's layout or meaning changes (3: weights as a header line and raw bytes, where 2 kept them as
#: tvm.runtime.save_param_dict's, slow to parse back: benchmarks/findings.md, 'Warm rebuilds without copying')
FORMAT = 3
#: the folder is kept under this many bytes (least recently used entries go first)
MAX_BYTES = 4 << 30
_LOWERED, _LIBRARY, _ENTRY = "lowered.json", "kernels.so", "entry.json"
#: the folder of the weights, one file each named by its sha256, shared by the entries
WEIGHTS_FOLDER = "weights"
#: tensor constants of at least this many bytes are kept in the weights folder, under placeholder variables of this name
WEIGHT_BYTES = 1024
_PLACEHOLDER = "__nimble_cached_weight_"
#: a weight no entry names is deleted when pruning only once it is this old (a store running at once writes its
#: weights before its entry)
ORPHAN_SECONDS = 3600.0



@dataclass
class Hit:
    lowered: tvm.IRModule
    library: object  # tvm.runtime.Module, loaded from the entry; its export_library copies the entry's file


class KernelCache:
    """Lowered modules and kernel libraries under ``directory``, by :class:`~.session.CacheKey`: :meth:`load`,
    :meth:`store`. ``stats``: the counts to add to; ``note(text)``: where the one-line notes go; ``loaded``: the
    session's weights loaded so far, by sha256 (a weight loaded again is the same tensor: the buckets of a model
    share theirs). A store hashes every weight it keeps: remembering the tensors stored would keep them alive
    (TVM's tensors take no weak references) after the build drops them."""

    def __init__(self, directory: str, stats: dict, note, loaded: dict | None = None):
        self.directory, self.stats, self.note = directory, stats, note
        self.weights = os.path.join(directory, WEIGHTS_FOLDER)
        self.loaded = loaded if loaded is not None else {}

    @staticmethod
    def _entry_key(key) -> list:
        return json.loads(json.dumps([key.kind, key.what, key.context], sort_keys=True))

    def path(self, key) -> str:
        return os.path.join(self.directory, key.digest)

    def has(self, key) -> bool:
        """Whether an entry of ``key`` is there (not whether it is usable)."""
        return os.path.exists(os.path.join(self.path(key), _ENTRY))

    # ---- read --------------------------------------------------------------------------
    def load(self, key, target: tvm.target.Target) -> Hit | None:
        """The entry of ``key``, loaded, or None (counted a miss; an unusable entry is also one note)."""
        folder = self.path(key)
        try:
            with open(os.path.join(folder, _ENTRY), encoding="utf-8") as f:
                entry = json.load(f)
        except FileNotFoundError:
            self.stats["miss"] += 1
            return None
        except (OSError, ValueError):
            return self._rejected()
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != self._entry_key(key):
            return self._rejected()
        files, named = entry.get("files"), entry.get("weights")
        if not isinstance(files, dict) or set(files) != {_LOWERED, _LIBRARY} or not isinstance(named, dict):
            return self._rejected()
        try:
            with open(os.path.join(folder, _LOWERED), "rb") as f:
                text = f.read()
            if hashlib.sha256(text).hexdigest() != files[_LOWERED] or \
                    file_sha256(os.path.join(folder, _LIBRARY)) != files[_LIBRARY]:
                return self._rejected()
            weights = {name: self._weight(digest) for name, digest in named.items()}
            if any(w is None for w in weights.values()):
                return self._rejected()
            # written by this TVM (its version is in the key): read without tvm.ir.load_json's schema upgrade of
            # older versions' JSON (a parse and an indented re-dump of the whole graph, 3.6 of densenet121's
            # 17 s warm fp16 build on a CPU)
            lowered = _with_weights(from_json_graph_str(text.decode()), weights)
            if target.kind.name == "cuda":
                from tvm_nimble.codegen.cuda_compile import load_cuda_runtime

                load_cuda_runtime()  # the library's CUDA module needs TVM's CUDA runtime registered
            library = _exportable(tvm.runtime.load_module(os.path.join(folder, _LIBRARY)),
                                  os.path.join(folder, _LIBRARY))
        except Exception:  # noqa: BLE001  (anything TVM raises on a damaged file: rebuild instead)
            return self._rejected()
        if not isinstance(lowered, tvm.IRModule) or "main" not in [gv.name_hint for gv in lowered.functions]:
            return self._rejected()
        try:
            os.utime(os.path.join(folder, _ENTRY))  # recently used: the last to be dropped
        except OSError:
            pass
        self.stats["hit"] += 1
        return Hit(lowered, library)

    def _weight(self, digest):
        """The weight kept under ``digest`` (loaded once a session), or None when it is missing or damaged."""
        if not isinstance(digest, str):
            return None
        if digest in self.loaded:
            return self.loaded[digest]
        try:
            tensor = _read_weight(os.path.join(self.weights, digest), digest)
        except OSError:
            return None
        if tensor is None:  # damaged: out of the way, so the rebuild writes it again
            self._drop_weight(digest)
            return None
        self.loaded[digest] = tensor
        return tensor

    def _rejected(self):
        self.stats["rejected"] += 1
        self.stats["miss"] += 1
        self.note(f"ignoring unreadable compiled-kernel cache entries under {self.directory}: the kernels are "
                  "compiled again and the entries rewritten (delete the folder, or pass kernel_cache=False, if "
                  "this repeats)", stacklevel=5)
        return None

    # ---- write -------------------------------------------------------------------------
    def store(self, key, lowered: tvm.IRModule, library) -> bool:
        """Keep ``lowered`` and ``library`` for ``key`` (replacing an unusable entry); False, with one note,
        when the folder cannot be written."""
        folder = self.path(key)
        try:
            os.makedirs(self.directory, exist_ok=True)
            staging = tempfile.mkdtemp(dir=self.directory, prefix=".tmp-")
        except OSError as err:
            return self._unwritable(err)
        try:
            placeheld, weights = _without_weights(lowered)
            named = {name: self._keep_weight(tensor) for name, tensor in weights.items()}
            del weights
            text = tvm.ir.save_json(placeheld).encode()
            with open(os.path.join(staging, _LOWERED), "wb") as f:
                f.write(text)
            files = {_LOWERED: hashlib.sha256(text).hexdigest()}
            del text
            library.export_library(os.path.join(staging, _LIBRARY))
            files[_LIBRARY] = file_sha256(os.path.join(staging, _LIBRARY))
            with open(os.path.join(staging, _ENTRY), "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT, "key": self._entry_key(key), "files": files, "weights": named}, f,
                          sort_keys=True)
            if os.path.exists(folder):  # an unusable entry (a usable one was loaded instead): out of the way
                old = os.path.join(self.directory, f".old-{uuid.uuid4().hex[:12]}")
                try:
                    os.rename(folder, old)
                    shutil.rmtree(old, ignore_errors=True)
                except OSError:
                    pass
            try:
                os.rename(staging, folder)
            except OSError:  # another build put its entry there first: the same kernels
                return False
        except OSError as err:
            return self._unwritable(err)
        finally:
            if os.path.isdir(staging):
                shutil.rmtree(staging, ignore_errors=True)
        self.stats["stored"] += 1
        self._prune(keep=folder)
        return True

    def _keep_weight(self, tensor) -> str:
        """The sha256 under which ``tensor`` is kept in the weights folder, written there unless it is already
        (renamed into place whole, so that a reader sees all of it or nothing)."""
        header, data = _weight_parts(tensor)
        sha = hashlib.sha256(header)
        sha.update(data)
        digest = sha.hexdigest()
        path = os.path.join(self.weights, digest)
        if os.path.exists(path):
            os.utime(path)  # named again: not an orphan to a prune running at once
            return digest
        os.makedirs(self.weights, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.weights, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return digest

    def _unwritable(self, err: OSError) -> bool:
        self.note(f"cannot write the compiled-kernel cache under {self.directory} ({err.strerror or err}): this "
                  "build's kernels are not kept; give timing_cache a writable directory, or pass kernel_cache=False",
                  stacklevel=5)
        return False

    def _prune(self, keep: str, max_bytes: int | None = None) -> None:
        """Drop the least recently used entries (never ``keep``) while the folder holds over ``max_bytes``, each
        weight with the last entry that names it; weights no entry names (an earlier format's, a store that
        failed) and unfinished writes once they are :data:`ORPHAN_SECONDS` old."""
        max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        entries, blobs, now = [], {}, time.time()
        try:
            if os.path.isdir(self.weights):
                for e in os.scandir(self.weights):
                    if not e.is_file():
                        continue
                    stat = e.stat()
                    if not e.name.startswith("."):
                        blobs[e.name] = (stat.st_size, stat.st_mtime)
                    elif now - stat.st_mtime > ORPHAN_SECONDS:  # a write that never finished
                        os.remove(e.path)
            for name in os.listdir(self.directory):
                folder = os.path.join(self.directory, name)
                if name.startswith(".") or name == WEIGHTS_FOLDER or not os.path.isdir(folder):
                    continue
                size = sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())
                entries.append((_used(folder), size, folder, _named_weights(folder)))
        except OSError:
            return
        named = collections.Counter(d for *_, ds in entries for d in ds)
        for digest, (_, mtime) in list(blobs.items()):
            if not named[digest] and now - mtime > ORPHAN_SECONDS:
                self._drop_weight(digest)
                del blobs[digest]
        total = sum(size for _, size, _, _ in entries) + sum(size for size, _ in blobs.values())
        for _, size, folder, digests in sorted(entries, key=lambda e: e[0]):
            if total <= max_bytes:
                break
            if folder == keep:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            total -= size
            for digest in digests:
                named[digest] -= 1
                if not named[digest] and digest in blobs:
                    self._drop_weight(digest)
                    total -= blobs.pop(digest)[0]

    def _drop_weight(self, digest: str) -> None:
        self.loaded.pop(digest, None)
        try:
            os.remove(os.path.join(self.weights, digest))
        except OSError:
            pass


def _weight_parts(tensor) -> tuple[bytes, memoryview]:
    """A weight's file: its header line (JSON: dtype, shape) and its bytes (a view of the tensor's own where DLPack
    hands them over, else a copy: bfloat16)."""
    import numpy as np

    array = as_numpy(tensor)
    header = json.dumps({"dtype": str(tensor.dtype), "shape": [int(d) for d in tensor.shape]}).encode() + b"\n"
    return header, memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _read_weight(path: str, digest: str):
    """The tensor of the weight file ``path``: its bytes read once into an aligned buffer that becomes the tensor
    (no copy where TVM takes it through DLPack); None when the file's sha256 is not ``digest`` or its header is not
    one."""
    import numpy as np

    with open(path, "rb") as f:
        header = f.readline(4096)
        try:
            meta = json.loads(header)
            dtype, shape = _numpy_dtype(meta["dtype"]), tuple(int(d) for d in meta["shape"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        array = aligned_empty(shape, dtype)
        data = array.reshape(-1).view(np.uint8)
        if f.readinto(memoryview(data)) != data.size or f.read(1):
            return None
    sha = hashlib.sha256(header)
    sha.update(memoryview(data))
    if sha.hexdigest() != digest:
        return None
    return as_tensor(array)


def _numpy_dtype(dtype: str):
    """numpy's dtype of TVM's ``dtype`` (ml_dtypes' for those numpy lacks: bfloat16, float8_*); AttributeError
    for a name neither has."""
    import ml_dtypes
    import numpy as np

    try:
        return np.dtype(dtype)
    except TypeError:
        return np.dtype(getattr(ml_dtypes, dtype))


def _used(folder: str) -> float:
    """When the entry in ``folder`` was last stored or loaded (0 without an entry file)."""
    try:
        return os.stat(os.path.join(folder, _ENTRY)).st_mtime
    except OSError:
        return 0.0


def _named_weights(folder: str) -> set[str]:
    """The weights the entry in ``folder`` names (none for an unreadable entry or an earlier format's)."""
    try:
        with open(os.path.join(folder, _ENTRY), encoding="utf-8") as f:
            weights = json.load(f).get("weights")
    except (OSError, ValueError, AttributeError):
        return set()
    return set(weights.values()) if isinstance(weights, dict) else set()


def _exportable(library, path: str):
    """``library`` (loaded from ``path``) whose ``export_library`` copies ``path``: TVM cannot export a shared
    library it loaded, and an artifact (or a user) exports the kernels of a build with it."""
    def export_library(file_name, *_args, **_kwargs):
        try:
            shutil.copyfile(path, os.fspath(file_name))
        except OSError as err:
            raise NimbleError(f"the kernel library {path}, loaded from the compiled-kernel cache, is gone "
                              f"({err.strerror or err}); build again (kernel_cache=False to compile) and export") from None

    library.export_library = export_library  # this object's: every holder of the build's kernels exports them
    return library


def _relax_functions(mod: tvm.IRModule, mutator) -> tvm.IRModule:
    from tvm import relax

    out = mod.clone()
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = mutator.visit_expr(func)
    return out


def _without_weights(lowered: tvm.IRModule) -> tuple[tvm.IRModule, dict]:
    """``lowered`` with each tensor constant of :data:`WEIGHT_BYTES` or more replaced by a variable of its type
    named :data:`_PLACEHOLDER` and its index, and those tensors by name."""
    import math

    from tvm import relax

    weights: dict = {}

    @relax.expr_functor.mutator
    class Out(relax.PyExprMutator):
        def visit_generic_const_(self, op):
            value = op.value
            if not isinstance(value, tvm.runtime.Tensor):
                return op
            if math.prod(value.shape) * tvm.runtime.DataType(str(value.dtype)).bits // 8 < WEIGHT_BYTES:
                return op
            name = f"{_PLACEHOLDER}{len(weights)}"
            weights[name] = value
            return relax.Var(name, op.ty)

    return _relax_functions(lowered, Out()), weights


def _with_weights(placeheld: tvm.IRModule, weights) -> tvm.IRModule:
    """:func:`_without_weights` undone: each placeholder back to its tensor, as a constant."""
    from tvm import relax

    @relax.expr_functor.mutator
    class In(relax.PyExprMutator):
        def visit_var_(self, op):
            if op.name.startswith(_PLACEHOLDER):
                return relax.const(weights[op.name])
            return op

    return _relax_functions(placeheld, In())


