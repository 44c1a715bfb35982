"""Kernel tuning: tasks and their cost (``tasks``), round planning (``rounds``), the tuning loop
(``tune``), and opening a database, whose it is and whether it applies to a model (``database``).
Private MetaSchedule workarounds live in ``relay_passes.tvm_compat``; the process-ending watchdog lives
with the CLI (``cli.tune``)."""
