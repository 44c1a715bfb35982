"""One-line notes to the user (Python warnings): each build session's own, each given once per session."""
from __future__ import annotations

import warnings


class Notes:
    """The notes of one build session, each given (a ``UserWarning``) once however often it is raised; ``given``
    lists them in order."""

    def __init__(self):
        self.given: list[str] = []

    def __call__(self, text: str, stacklevel: int = 3) -> None:
        """``stacklevel`` counts from the caller, as in ``warnings.warn``."""
        if text not in self.given:
            self.given.append(text)
            warnings.warn(text, stacklevel=stacklevel + 1)
