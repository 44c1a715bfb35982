"""A persistent cache of what builds measure on a GPU, so that a second build measures nothing twice.

``kernels="best"`` times every distinct chain on each provider and on TVM (:mod:`.kernel_choice`), the
whole model both ways when the choice is mixed, and each cuBLASLt GEMM's algorithms
(:mod:`.gemm_algorithms`); ``max_streams="auto"`` replays every candidate schedule
(:mod:`.stream_choice`); a reduced-precision build's accuracy report runs a stock float32 build of the model
(:mod:`.accuracy`, whose outputs are kept here too). That is minutes for a large model, and the same numbers every time on the
same GPU, so each measurement is kept here, in a directory (``BuildOptions.timing_cache``, by default
``$XDG_CACHE_HOME/tvm-nimble/timings`` or ``~/.cache/tvm-nimble/timings``), like TensorRT's timing cache:

    <directory>/<gpu id>/gpu.json                 the GPU's fingerprint, for people
    <directory>/<gpu id>/<kind>/<key digest>.json {"gpu", "context", "kind", "key", "value"}
    <directory>/kernels/...                       compiled kernels, for any GPU (:mod:`.kernel_cache`)

An entry counts only for the GPU that measured it: the gpu id is a digest of the measuring timer's
fingerprint (name, arch, SMs, memory, clock, kernel driver, CUDA driver API, cuDNN / cuBLAS / CUDA
runtime wheels; a remote GPU's own through RPC), so a build through an RPC tracker finds the entries
of that GPU, and a cache directory can be copied to another build machine. Every entry also records
the context it was measured in (this format, TVM's version, a digest of tvm-nimble's compiler and
runtime sources, the target), and a key naming what was measured (a chain's signature with the
precision, TF32 and tuning database; a module's structural hash; a plan's digest). An entry whose
recorded GPU or context is not this build's (an older tvm-nimble, an entry copied from elsewhere) is
ignored with a one-line note and measured again; an unreadable one likewise. Each entry is its own
file, written to a temporary file and renamed into place, so builds running at once never see a half
written entry (the last to finish wins, with a measurement as good as the other's).

The keys are made by the build session (:mod:`.session`), which also keeps what it measured or read in memory
(also with the cache off); this module is the files.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import warnings

from tvm_nimble import env
from tvm_nimble.errors import NimbleError

#: bumped when an entry's meaning changes: older entries are then stale
FORMAT = 1
#: the subpackages whose code decides what a measurement measures
_CODE_FOLDERS = ("compiler", "runtime", "relay_passes", "codegen")
_CODE_SUFFIXES = (".py", ".cu", ".cpp", ".cuh", ".h")

#: the compiled-kernel cache's folder inside the directory (see :mod:`.kernel_cache`), not a GPU's
KERNELS_FOLDER = "kernels"

def default_directory() -> str:
    """``timings`` under the cache root (:func:`tvm_nimble.env.cache_root`), beside the vendor extension's cache."""
    return env.cache_dir("timings")


def directory_option(value) -> str | None:
    """The ``timing_cache`` option as a directory path, or None for off (None, False or ``"off"``)."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    try:
        path = os.fspath(value)
    except TypeError:
        path = None
    if not path or not isinstance(path, str):
        raise NimbleError(f"timing_cache must be a directory path, or None / 'off' to keep no timings, got {value!r}")
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise NimbleError(f"timing_cache {path} is a file, not a directory; give a directory (created when "
                          "missing) or 'off'")
    return path


def numbers(count: int | None = None):
    """A ``valid`` for :meth:`TimingCache.get`: a list of numbers (of ``count`` of them, when given)."""
    def valid(value) -> bool:
        return (isinstance(value, list) and (count is None or len(value) == count)
                and all(isinstance(x, (int, float)) for x in value))
    return valid


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _digest(obj) -> str:
    return hashlib.sha256(_canonical(obj).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """A digest of tvm-nimble's compiler, runtime, pass and codegen sources: what a TVM kernel or a plan
    becomes depends on them, so a measurement is stale once they change."""
    import importlib.util

    h = hashlib.sha256()
    for name in _CODE_FOLDERS:
        # installed inside tvm_nimble, or (relay_passes, codegen) at the repository root
        (folder,) = importlib.util.find_spec(f"tvm_nimble.{name}").submodule_search_locations
        for dirpath, dirnames, files in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(_CODE_SUFFIXES):
                    path = os.path.join(dirpath, f)
                    h.update(f"{name}/{os.path.relpath(path, folder)}\0".encode())
                    with open(path, "rb") as fh:
                        h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()[:32]


def tuning_db_digest(path: str | None) -> str | None:
    """A digest of a MetaSchedule database directory's files (the tuned kernels TVM's side gets), None
    without one. Read again whenever a file changed, so tuning more between builds is seen."""
    if not path:
        return None
    path = os.path.abspath(path)
    stamp = []
    for f in sorted(os.listdir(path)) if os.path.isdir(path) else []:
        full = os.path.join(path, f)
        if os.path.isfile(full):
            st = os.stat(full)
            stamp.append((f, st.st_size, st.st_mtime_ns))
    return _tuning_db_digest(path, tuple(stamp))


@functools.lru_cache(maxsize=64)
def _tuning_db_digest(path: str, stamp: tuple) -> str:
    h = hashlib.sha256()
    for name, _size, _mtime in stamp:
        h.update(name.encode() + b"\0")
        with open(os.path.join(path, name), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:32]


def context_of(target) -> dict:
    """What, besides the GPU, every measurement of a build for ``target`` depends on."""
    import tvm

    context = {"format": FORMAT, "tvm": tvm.__version__, "code": code_digest(), "target": str(target)}
    stock = env.stock_schedules()
    if stock:  # an experiment's other TVM kernels: measured apart
        context["stock_schedules"] = list(stock)
    return context


def describe_gpu(gpu: dict) -> str:
    """``NVIDIA H100 80GB HBM3 sm_90, driver 580.65.06``: a fingerprint, short, for the notes."""
    if not gpu:
        return "an unidentified GPU"
    driver = gpu.get("driver") or gpu.get("cuda_driver_api", "?")
    return f"{gpu.get('name', '?')} {gpu.get('arch', '?')}, driver {driver}"


def _warn(text: str, stacklevel: int = 3) -> None:
    warnings.warn(text, stacklevel=stacklevel + 1)


class TimingCache:
    """The files of one GPU's measurements in one context under ``directory``: :meth:`get` what was measured,
    :meth:`put` what is new. ``note(text)``: where the one-line notes go (the build session's)."""

    def __init__(self, directory: str, gpu: dict, context: dict, note=_warn):
        self.gpu = json.loads(_canonical(gpu))
        self.context = json.loads(_canonical(context))
        self.directory = directory
        self.note = note
        self.gpu_id = _digest(self.gpu)[:16]
        self._looked_around = False

    # ---- the two calls -----------------------------------------------------------------
    def get(self, kind: str, key, valid=None):
        """The value measured for ``key`` (JSON: lists, strings, numbers), or None when it must be measured:
        not on disk, or there but unreadable, foreign, stale, or failing ``valid(value)``."""
        return self._read(kind, json.loads(_canonical(key)), valid)

    def put(self, kind: str, key, value) -> None:
        """Keep ``value`` (JSON) for ``key`` on disk (while the directory is writable)."""
        if self.directory is not None:
            self._write(kind, json.loads(_canonical(key)), json.loads(_canonical(value)))

    # ---- files -------------------------------------------------------------------------
    def path(self, kind: str, key) -> str:
        """Where the entry of ``key`` lives (whether or not it exists)."""
        return os.path.join(self.directory or "", self.gpu_id, kind, _digest([kind, key])[:40] + ".json")

    def _read(self, kind: str, key, valid):
        if self.directory is None:
            return None
        path = self.path(kind, key)
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f)
        except FileNotFoundError:
            self._note_other_gpus()
            return None
        except (OSError, ValueError):  # ValueError: bad JSON or bad UTF-8
            return self._corrupt()
        if not isinstance(entry, dict) or entry.get("kind") != kind or entry.get("key") != key:
            return self._corrupt()
        if entry.get("gpu") != self.gpu or entry.get("context") != self.context:
            self.note(f"ignoring timing-cache entries under {self.directory} that another GPU, driver, library, "
                      f"TVM or tvm-nimble version measured (this build's: {describe_gpu(self.gpu)}); they are "
                      "measured again and replaced", stacklevel=4)
            return None
        value = entry.get("value")
        if value is None or (valid is not None and not valid(value)):
            return self._corrupt()
        return value

    def _corrupt(self):
        self.note(f"ignoring unreadable timing-cache entries under {self.directory}: they are measured again and "
                  "rewritten (delete the directory, or pass timing_cache='off', if this repeats)", stacklevel=5)
        return None

    def _note_other_gpus(self) -> None:
        """Once per cache: say so when the directory holds entries of other GPUs but none of this one (a new
        driver or library version makes every entry stale; that should not pass silently)."""
        if self._looked_around:
            return
        self._looked_around = True
        try:
            others = [d for d in os.listdir(self.directory) if d not in (self.gpu_id, KERNELS_FOLDER)
                      and not d.startswith(".") and os.path.isdir(os.path.join(self.directory, d))]
        except OSError:
            return
        if others and not os.path.isdir(os.path.join(self.directory, self.gpu_id)):
            self.note(f"the timing cache under {self.directory} has entries of {len(others)} other GPU, driver or "
                      f"library version(s) and none of this build's ({describe_gpu(self.gpu)}): measuring",
                      stacklevel=5)

    def _write(self, kind: str, key, value) -> None:
        """Write the entry to a temporary file beside its place and rename it there (atomic on POSIX)."""
        path = self.path(kind, key)
        entry = {"gpu": self.gpu, "context": self.context, "kind": kind, "key": key, "value": value}
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            gpu_file = os.path.join(self.directory, self.gpu_id, "gpu.json")
            if not os.path.exists(gpu_file):
                _write_json_atomically(gpu_file, self.gpu, indent=1)
            _write_json_atomically(path, entry)
        except OSError as err:
            self.note(f"cannot write the timing cache under {self.directory} ({err.strerror or err}): this build's "
                      "measurements are not kept; give timing_cache (--timing-cache) a writable directory, or 'off'",
                      stacklevel=4)
            self.directory = None  # reads of what this build measures come from the session's memory


def _write_json_atomically(path: str, obj, indent: int | None = None) -> None:
    """``obj`` as JSON in ``path``, written to a temporary file beside it and renamed there (atomic on POSIX:
    a reader sees the old file or the new one, never half of one); the temporary file goes on failure."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=indent, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
