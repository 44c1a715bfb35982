"""Compiled products kept under the cache root: a vendor unit's object, the linked vendor extension, a kernel
module's fatbin.

Each is made once, also where several processes build at the same time (a test run's workers): the first takes
a lock file beside the product and makes it, the others wait and then read it. Beside each product lies a record
of what made it and when (``<product>.json``), so that a run can say what its cold cache cost (the test run prints
nvcc's share of its time from them).

Only the standard library is imported here (``codegen.vendor_build`` runs where only the TVM runtime is).
"""
from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

RECORD_SUFFIX = ".json"


@dataclass(frozen=True)
class CompileRecord:
    """One product's compile: which product, what it is, when it started (epoch seconds) and how long it took."""

    product: str
    what: str
    started: float
    seconds: float

    @property
    def ended(self) -> float:
        return self.started + self.seconds


def cached(path: str, make: Callable[[str], None], what: str) -> str:
    """``path``, made by ``make(tmp)`` unless it exists: ``make`` writes the product to ``tmp``, which becomes
    ``path`` once complete (a reader never sees half a product). ``what`` goes in the record."""
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if os.path.exists(path):  # made by another process (or thread) while this one waited
            return path
        tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
        started = time.time()
        try:
            make(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        record = CompileRecord(os.path.basename(path), what, started, time.time() - started)
        with open(path + RECORD_SUFFIX, "w") as f:
            json.dump(asdict(record), f)
    return path


def records(root: str) -> list[CompileRecord]:
    """The records of every product under ``root`` (files named ``<product>.json`` beside their product)."""
    out = []
    for folder, _, files in os.walk(root):
        names = set(files)
        for name in files:
            if not name.endswith(RECORD_SUFFIX) or name[:-len(RECORD_SUFFIX)] not in names:
                continue
            try:
                with open(os.path.join(folder, name)) as f:
                    out.append(CompileRecord(**json.load(f)))
            except (OSError, ValueError, TypeError):
                continue  # a JSON file of something else (a timing entry) that happens to sit beside its namesake
    return out


def busy_seconds(recs: list[CompileRecord]) -> float:
    """Seconds during which at least one of the compiles ran (overlapping compiles counted once)."""
    total, end = 0.0, float("-inf")
    for r in sorted(recs, key=lambda r: r.started):
        if r.ended > end:
            total += r.ended - max(r.started, end)
            end = r.ended
    return total
