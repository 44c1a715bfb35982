"""What a command prints on stderr besides its own lines: Python warnings as one line each.

That holds for one command (:func:`command_output`) and is undone when it returns, so ``main()`` called in a
process that goes on (a test, a notebook) leaves that process as it found it. (TVM's C++ warning for every ONNX
Gather, the one native log line a build printed, is gone at its source: ``relay_passes.take_indices``.)
"""
from __future__ import annotations

import contextlib
import sys
import warnings


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` for the command line: ``note: ...`` (a UserWarning, how the build's notes come)
    or ``warning: Category: ...``, without the file, line number and source line that Python's default display
    adds (which mean nothing to someone running a command). Lines that start ``tvm-nimble:`` are the command's
    own verdict (an error, a usage error), one per failed command."""
    text = str(message).strip()
    shown = f"note: {text}" if category is UserWarning else f"warning: {category.__name__}: {text}"
    out = sys.stderr if file is None else file
    try:
        out.write(f"{shown}\n")
    except (OSError, ValueError):  # a closed or invalid stream, as warnings' own display tolerates
        pass


@contextlib.contextmanager
def command_output():
    """A command's stderr: warnings as one line each (:func:`one_line_warning`)."""
    with warnings.catch_warnings():  # (restores showwarning)
        warnings.showwarning = one_line_warning
        yield
