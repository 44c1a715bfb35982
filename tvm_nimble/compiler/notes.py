"""One-line notes to the user (Python warnings), each given once per process however many builds run."""
from __future__ import annotations

import warnings

_given: set[str] = set()


def note_once(text: str, stacklevel: int = 3) -> None:
    """``stacklevel`` counts from the caller of ``note_once``, as in ``warnings.warn``."""
    if text not in _given:
        _given.add(text)
        warnings.warn(text, stacklevel=stacklevel + 1)
