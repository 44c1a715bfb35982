"""Open a MetaSchedule tuning database directory (what `tvm-nimble tune` writes)."""
from __future__ import annotations

import os

from tvm_nimble.errors import NimbleError


def open_tuning_database(path: str):
    from tvm.s_tir import meta_schedule as ms

    workload = os.path.join(path, "database_workload.json")
    records = os.path.join(path, "database_tuning_record.json")
    if not (os.path.isfile(workload) and os.path.isfile(records)):
        raise NimbleError(f"no MetaSchedule database in {path} (expected database_workload.json and "
                          "database_tuning_record.json); run `tvm-nimble tune` first")
    return ms.database.JSONDatabase(path_workload=workload, path_tuning_record=records)
