"""The ``tvm-nimble`` command line: ``main`` (compile, run, explain, demo) and the ``bench`` and ``tune`` tools.

Rule: the CLI sits on top; it imports the library (compiler, runtime, bench), the library never
imports it. Every command turns a :class:`~tvm_nimble.errors.NimbleError` into one line and exit 1.
"""
