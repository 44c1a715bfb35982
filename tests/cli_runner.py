"""``tvm-nimble`` commands run inside the test's own process.

:func:`run_cli` calls ``tvm_nimble.cli.main`` on the arguments with stdout and stderr captured and returns what
``subprocess.run`` would (a ``CompletedProcess``: exit code, stdout, stderr): the same parser, dispatch and error
handling a shell reaches through ``python -m tvm_nimble.cli``, without a new interpreter importing TVM and PyTorch
for every command (seconds each, most of what a short command's test took). Tests of the entry point itself, of
commands that start servers or worker processes, or of a fresh process's behaviour use :func:`run_cli_process`,
``python -m tvm_nimble.cli`` in a process of its own.
"""
import contextlib
import io
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    from tvm_nimble.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:  # argparse: usage errors (2) and --help (0), before main's own handling
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["tvm-nimble", *map(str, args)], code, out.getvalue(), err.getvalue())


def run_cli_process(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tvm_nimble.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=dict(os.environ, PYTHONPATH=ROOT), timeout=timeout)
