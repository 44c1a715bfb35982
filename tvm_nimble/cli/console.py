"""What a command prints on stderr besides its own lines: Python warnings as one line each, and TVM's C++ log
lines that do not apply to a tvm-nimble build left out.

Both hold for one command (:func:`command_output`), and are undone when it returns, so ``main()`` called in
a process that goes on (a test, a notebook) leaves that process as it found it.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings

#: TVM C++ log lines (``LOG(WARNING)``, written straight to file descriptor 2) that a tvm-nimble command drops,
#: each with why it does not apply. topi's ``take`` in "fast" mode (every ONNX Gather) warns at every
#: legalization, several times per build; the executor checks every index input against its table when it is
#: set (``NimbleExecutor(check_inputs=True)``, the default), so out-of-bounds ids never reach the kernel.
DROPPED_TVM_LINES = ("Fast mode segfaults when there are out-of-bounds indices",)


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


#: the filter process: copies its stdin (the pipe fd 2 writes to) to its stdout (the command's real stderr),
#: leaving out the lines that contain one of its arguments. A line is passed on once complete; an unfinished one
#: (a prompt, a progress bar's ``\r`` redraw) at once, unless it may be a TVM log line (``[hh:mm:ss] file:line:
#: Warning: ...``, whose text and newline C++ writes separately), which waits for its end. Standard library only.
_FILTER = r"""
import os, sys
dropped = [d.encode() for d in sys.argv[1:]]
keep = lambda line: not any(d in line for d in dropped)
pending = b""
def write(data):
    while data:
        try:
            data = data[os.write(1, data):]
        except OSError:
            return
while True:
    try:
        chunk = os.read(0, 1 << 16)
    except OSError:
        break
    if not chunk:
        break
    *lines, pending = (pending + chunk).split(b"\n")
    out = b"".join(line + b"\n" for line in lines if keep(line))
    if pending and not pending.startswith(b"["):
        out, pending = out + (pending if keep(pending) else b""), b""
    write(out)
if keep(pending):
    write(pending)
"""
#: how long (seconds) the end of a command waits for the filter to pass on what is left; a process the command
#: started that still holds the pipe (a compile worker) keeps the filter alive past that, not the command
FILTER_DRAIN_S = 2.0


@contextlib.contextmanager
def native_lines_dropped(dropped: tuple[str, ...] = DROPPED_TVM_LINES):
    """While the block runs, lines written to file descriptor 2 by native code (TVM's C++ ``LOG``, compilers
    it runs) that contain one of ``dropped`` are left out; everything else reaches stderr as before. Python's
    ``sys.stderr`` keeps writing to the original stream directly, so a terminal stays a terminal (progress bars)
    and Python's own lines are never held back."""
    try:
        sys.stderr.flush()
        original = os.dup(2)
    except (OSError, ValueError):  # no file descriptor 2 to filter
        yield
        return
    read_end, write_end = os.pipe()
    python_stderr = sys.stderr
    writes_fd2 = _writes_fd2(python_stderr)
    if writes_fd2:  # Python's writes keep going where they went, not through the filter
        sys.stderr = open(os.dup(original), "w", buffering=1, encoding=python_stderr.encoding,
                          errors=python_stderr.errors or "backslashreplace")
    # a process, not a thread: when native code aborts the command (a CUDA error thrown in a destructor ends in
    # std::terminate), its last words are in the pipe, and only a reader outliving the process passes them on
    line_filter = subprocess.Popen([sys.executable, "-I", "-c", _FILTER, *dropped], stdin=read_end, stdout=original,
                                   close_fds=True)
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        os.dup2(original, 2)  # the filter sees the end of its input once no process holds the pipe any more
        try:
            line_filter.wait(FILTER_DRAIN_S)
        except subprocess.TimeoutExpired:  # a process the command started still holds the pipe: it goes on
            pass
        if writes_fd2:
            sys.stderr.close()
            sys.stderr = python_stderr
        os.close(original)


def _writes_fd2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):  # pytest's capture, a StringIO: not file descriptor 2
        return False


@contextlib.contextmanager
def command_output():
    """A command's stderr: warnings as one line each (:func:`one_line_warning`), TVM's inapplicable C++ log
    lines left out (:func:`native_lines_dropped`)."""
    with warnings.catch_warnings(), native_lines_dropped():  # (catch_warnings restores showwarning)
        warnings.showwarning = one_line_warning
        yield
