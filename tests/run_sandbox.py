"""Where a test run writes: every cache in a folder of its own, and nothing under ``$HOME``.

:class:`RunCaches` points tvm-nimble's cache root, XDG's cache and config folders and matplotlib's at one folder
made for the run (or a folder the user names, to keep compiled kernels between runs); the conftest sets them
before any test module is imported, and the run's pytest-xdist workers inherit them, so the vendor extension and
the kernels compile once per run whatever ran before. :class:`HomeListing` lists ``$HOME`` before and after the
run, a few levels deep (a write deeper down changes the modification time of a folder it lists, when it
creates the file); what was created, changed or removed there fails the run. :func:`nvcc_summary` says how
much of the run nvcc took, from the records the compiled products carry (``codegen.compile_cache``).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RunCaches:
    """The folder a run's caches live in; ``owned``: made for this run (removed at its end)."""

    folder: str
    owned: bool

    @classmethod
    def create(cls, keep: str | None = None) -> "RunCaches":
        """A fresh temporary folder, or ``keep`` (a folder kept between runs) when given."""
        if keep:
            os.makedirs(keep, exist_ok=True)
            return cls(os.path.abspath(keep), False)
        return cls(tempfile.mkdtemp(prefix="tvm-nimble-tests-"), True)

    @property
    def cache_root(self) -> str:
        return os.path.join(self.folder, "tvm-nimble")

    def environment(self) -> dict[str, str]:
        """The variables that send every cache a run writes into the folder."""
        return {"TVM_NIMBLE_CACHE_DIR": self.cache_root,
                "XDG_CACHE_HOME": os.path.join(self.folder, "xdg-cache"),
                "XDG_CONFIG_HOME": os.path.join(self.folder, "xdg-config"),
                "MPLCONFIGDIR": os.path.join(self.folder, "matplotlib"),
                # the CUDA driver's cache of kernels it compiled from PTX (default ~/.nv/ComputeCache)
                "CUDA_CACHE_PATH": os.path.join(self.folder, "cuda-compute-cache")}

    def remove(self) -> None:
        if self.owned:
            shutil.rmtree(self.folder, ignore_errors=True)


@dataclass(frozen=True)
class HomeListing:
    """Every entry of ``root`` down to ``depth`` levels (relative path -> modification time in ns), the folders
    in ``skip`` (the repository, the temporary folders) left out."""

    root: str
    entries: dict

    @classmethod
    def take(cls, root: str, skip: Iterable[str] = (), depth: int = 3) -> "HomeListing":
        skip = {os.path.realpath(s) for s in skip}
        entries: dict[str, int] = {}
        todo = [(root, 1)]
        while todo:
            folder, level = todo.pop()
            try:
                listed = list(os.scandir(folder))
            except OSError:  # unreadable, or gone meanwhile
                continue
            for entry in listed:
                if os.path.realpath(entry.path) in skip:
                    continue
                try:
                    entries[os.path.relpath(entry.path, root)] = entry.stat(follow_symlinks=False).st_mtime_ns
                except OSError:
                    continue
                if level < depth and entry.is_dir(follow_symlinks=False):
                    todo.append((entry.path, level + 1))
        return cls(root, entries)

    def changes(self, later: "HomeListing") -> list[str]:
        """What differs in ``later``: one line per entry created, changed or removed."""
        before, after = self.entries, later.entries
        lines = [f"created {p}" for p in sorted(after.keys() - before.keys())]
        lines += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
        lines += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
        return [f"{line} (under {self.root})" for line in lines]


def nvcc_summary(cache_root: str, run_started: float) -> str:
    """One line: the run's compiles (vendor units and links, kernel modules; those started since ``run_started``,
    epoch seconds: a cache kept between runs holds older ones), their nvcc seconds, and the part of the run during
    which nvcc ran."""
    import time

    from tvm_nimble.codegen.compile_cache import busy_seconds, records  # (at the end: nothing imported before the run)

    run_seconds = time.time() - run_started
    recs = [r for r in records(cache_root) if r.started >= run_started]
    if not recs:
        return "nvcc: nothing compiled in this run"
    kinds: dict[str, list] = {}
    for r in recs:
        kind = "vendor unit" if "vendor unit" in r.what else "vendor link" if "vendor link" in r.what else "kernel module"
        kinds.setdefault(kind, []).append(r.seconds)
    parts = ", ".join(f"{len(v)} {k}{'s' if len(v) > 1 else ''} {sum(v):.0f} s" for k, v in sorted(kinds.items()))
    busy = busy_seconds(recs)
    slowest = max(recs, key=lambda r: r.seconds)
    return (f"nvcc: {parts}; running during {busy:.0f} s of the run's {run_seconds:.0f} s "
            f"({100 * busy / max(run_seconds, 1e-9):.0f}%); slowest {slowest.what} {slowest.seconds:.0f} s")
