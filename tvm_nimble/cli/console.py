"""What a command prints on stderr besides its own lines: Python warnings as one line each, and TVM's C++ log
lines that do not apply to a tvm-nimble build left out.

Both hold for one command (:func:`command_output`), and are undone when it returns, so ``main()`` called in
a process that goes on (a test, a notebook) leaves that process as it found it.
"""
from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
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


class _LineFilter:
    """Copies what arrives on a pipe to a file descriptor, leaving out the lines that contain one of
    ``dropped``. A line is passed on once complete; an unfinished one (a prompt, a progress bar's ``\\r``
    redraw) at once, unless it may be a log line, which waits for its end."""

    def __init__(self, source: int, target: int, dropped: tuple[str, ...], poll_s: float = 0.1):
        """``poll_s``: how often (seconds) the thread looks whether the command has ended."""
        self.source, self.target, self.dropped, self.poll_s = source, target, dropped, poll_s
        self.pending = b""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="tvm-nimble stderr filter")
        self.thread.start()

    def _keep(self, line: bytes) -> bool:
        text = line.decode(errors="replace")
        return not any(d in text for d in self.dropped)

    def _pass_on(self, data: bytes) -> None:
        while data:
            try:
                data = data[os.write(self.target, data):]
            except OSError:
                return

    def _flush(self, everything: bool) -> None:
        *lines, rest = self.pending.split(b"\n")
        self._pass_on(b"".join(line + b"\n" for line in lines if self._keep(line)))
        if everything or (rest and not self._held(rest)):
            if self._keep(rest):
                self._pass_on(rest)
            rest = b""
        self.pending = rest

    @staticmethod
    def _held(partial: bytes) -> bool:
        """Whether an unfinished line waits for its end: one that may be a TVM log line, which starts
        ``[hh:mm:ss] file:line: Warning: ...`` and whose text and newline C++ writes separately."""
        return partial.startswith(b"[")

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select([self.source], [], [], self.poll_s)
            if not ready:
                if self.done.is_set():
                    break
                continue
            chunk = os.read(self.source, 1 << 16)
            if not chunk:
                break
            self.pending += chunk
            self._flush(everything=False)
        self._flush(everything=True)

    def close(self) -> None:
        self.done.set()
        self.thread.join()


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
    line_filter = _LineFilter(read_end, original, dropped)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        os.dup2(original, 2)  # (a child process still holding the pipe's write end does not delay the end)
        line_filter.close()
        os.close(read_end)
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
