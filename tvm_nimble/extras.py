"""Optional packages: which of them this Python lacks, so that a command can name the install in one
line before any work, instead of failing later with a traceback from deep inside a library."""
from __future__ import annotations

import importlib


def missing_modules(names) -> list[str]:
    """The names among ``names`` that cannot be imported here, in order."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing
