"""The README's examples run as written, on the CPU, so they cannot drift from the code.

Its fenced blocks are taken in order and run in one temporary directory:
- ```python blocks in one shared namespace (a later block uses what an earlier one defined);
- ```bash / ```sh / ```console blocks line by line in a shell (a console block's commands are its
  ``$ `` lines), with ``tvm-nimble`` and ``python`` resolving to this checkout and this interpreter;
- ```text blocks are sample output, not run. One that starts with ``$ COMMAND`` is a transcript: the
  command is run at that point and every line shown must appear in its real output, in order
  (a ``...`` line elides).
A line whose trailing comment says ``needs a GPU``, ``needs nvcc`` or ``not run by tests`` is skipped
(``make`` targets, GPU-only commands); the test counts them, so the README cannot quietly turn into
skipped examples.
"""
import os
import re
import stat
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
SKIP_MARKERS = ("needs a gpu", "needs nvcc", "not run by tests")
MAX_SKIPPED = 9  # make install/run/test, activating the venv, the GPU commands; raise only for a line that truly cannot run here
SHELL_LANGS = {"bash", "sh", "console", "shell"}
KNOWN_LANGS = SHELL_LANGS | {"python", "text"}

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


def readme_blocks(text):
    """[(lang, body, line number)] of the fenced blocks, in order."""
    return [(m.group(1).lower(), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def _comment(line):
    """The trailing ``# comment`` of a shell or Python line (outside quotes), lower-cased, or ''."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[i + 1:].strip().lower()
    return ""


def is_skipped(line):
    return any(marker in _comment(line) for marker in SKIP_MARKERS)


def shell_commands(lang, body):
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped;
    in a console block only the ``$ `` lines."""
    lines, cur = [], ""
    for raw in body.splitlines():
        if lang == "console":
            if raw.startswith("$ "):
                raw = raw[2:]
            elif not cur:
                continue  # output
        cur += raw.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        if cur.strip() and not cur.lstrip().startswith("#"):
            lines.append(cur.strip())
        cur = ""
    return lines


def python_source(body):
    """A Python block with its skipped lines replaced by ``pass`` (same indentation)."""
    out, skipped = [], []
    for line in body.splitlines():
        if line.strip() and is_skipped(line):
            skipped.append(line.strip())
            line = line[: len(line) - len(line.lstrip())] + "pass"
        out.append(line)
    return "\n".join(out) + "\n", skipped


def _bin_dir(path):
    """``tvm-nimble`` and ``python`` wrappers for this checkout and interpreter (the console script
    may not be on PATH, and a bare ``python`` may be another one)."""
    os.makedirs(path, exist_ok=True)
    for name, cmd in (("tvm-nimble", f'exec "{sys.executable}" -m tvm_nimble.cli "$@"'),
                      ("python", f'exec "{sys.executable}" "$@"')):
        p = os.path.join(path, name)
        with open(p, "w") as f:
            f.write(f"#!/bin/sh\n{cmd}\n")
        os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_readme_fences_are_known():
    blocks = readme_blocks(open(README).read())
    assert blocks, "no fenced blocks found in README.md"
    unknown = [(lang or "(none)", line) for lang, _, line in blocks if lang not in KNOWN_LANGS]
    assert not unknown, f"README blocks need a language ({sorted(KNOWN_LANGS)}): {unknown}"


def test_shell_parsing():
    assert shell_commands("bash", "a \\\n  b  # c\n# only a comment\n\nd\n") == ["a    b  # c", "d"]
    assert shell_commands("console", "$ tvm-nimble x\noutput line\n$ y\n") == ["tvm-nimble x", "y"]
    assert is_skipped("make run   # not run by tests: installs") and is_skipped("x  # needs a GPU")
    assert not is_skipped("python -c \"print('# needs a GPU')\"") and not is_skipped("make run")
    src, skipped = python_source("if x:\n    gpu()  # needs a GPU\n")
    assert src == "if x:\n    pass\n" and skipped == ["gpu()  # needs a GPU"]


def test_readme_examples_run_on_cpu(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PATH=_bin_dir(str(tmp_path / "bin")) + os.pathsep + os.environ.get("PATH", ""),
               CUDA_VISIBLE_DEVICES="")  # the CPU, as a newcomer without a GPU runs them
    monkeypatch.chdir(work)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the Ray example: no token written under the home folder
    namespace = {"__name__": "__readme__"}
    skipped, ran = [], 0

    def sh(cmd, line):
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=work, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"README line {line}: `{cmd}` exited {r.returncode}:\n{r.stderr[-3000:]}"
        return r.stdout

    for lang, body, line in readme_blocks(open(README).read()):
        if lang == "python":
            src, skip = python_source(body)
            skipped += skip
            try:
                exec(compile(src, f"README.md:{line}", "exec"), namespace)
            except Exception as err:  # say which block
                raise AssertionError(f"README python block at line {line} failed: {type(err).__name__}: {err}") from err
            ran += 1
        elif lang in SHELL_LANGS:
            for cmd in shell_commands(lang, body):
                if is_skipped(cmd):
                    skipped.append(cmd)
                    continue
                sh(cmd, line)
                ran += 1
        elif lang == "text" and body.startswith("$ "):
            cmd, *shown = body.splitlines()
            out = sh(cmd[2:], line).splitlines()
            pos = 0
            for want in shown:
                if want.strip() in ("", "..."):
                    continue
                try:
                    pos = out.index(want, pos) + 1
                except ValueError:
                    raise AssertionError(f"README sample output at line {line} (`{cmd[2:]}`) shows\n  {want}\n"
                                         f"which the command does not print (in this order); it printed:\n"
                                         + "\n".join(out)) from None
            ran += 1
    assert ran >= 10, f"only {ran} README examples ran"
    assert len(skipped) <= MAX_SKIPPED, f"{len(skipped)} README lines are skipped (at most {MAX_SKIPPED}): {skipped}"
