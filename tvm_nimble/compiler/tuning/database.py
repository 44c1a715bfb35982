"""Open a MetaSchedule tuning database directory (what `tvm-nimble tune` writes), say whose it is, and
whether it holds anything for a given model."""
from __future__ import annotations

import json
import os

from tvm_nimble.errors import NimbleError

SUMMARY_FILE = "tuning_summary.json"


def open_tuning_database(path: str):
    from tvm.s_tir import meta_schedule as ms

    workload = os.path.join(path, "database_workload.json")
    records = os.path.join(path, "database_tuning_record.json")
    if not (os.path.isfile(workload) and os.path.isfile(records)):
        raise NimbleError(f"no MetaSchedule database in {path} (expected database_workload.json and "
                          "database_tuning_record.json); run `tvm-nimble tune` first")
    return ms.database.JSONDatabase(path_workload=workload, path_tuning_record=records)


def target_label(target: dict) -> str:
    """``cuda sm_90`` / ``llvm``: a tuning target as the summary records it and messages name it."""
    return " ".join(str(target[k]) for k in ("kind", "arch") if target.get(k))


def database_owner(path: str) -> dict:
    """What ``path``'s ``tuning_summary.json`` says the database was tuned for: ``model`` (absent in
    summaries written before it was recorded) and ``target`` (``cuda sm_90``; older summaries hold the
    kind only). Empty when there is no readable summary."""
    try:
        with open(os.path.join(path, SUMMARY_FILE)) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(summary, dict):
        return {}
    return {k: str(summary[k]) for k in ("model", "target") if summary.get(k)}


def _same_target(recorded: str, ours: str) -> bool:
    """A summary that records the kind only (``cuda``) matches any target of that kind."""
    rec, mine = recorded.split(), ours.split()
    return rec == mine or (len(rec) == 1 and rec[0] == mine[0])


def holds_any(database, task_modules) -> bool:
    """Whether ``database`` has a measured tuning record for any of ``task_modules`` (each task's
    workload, ``task.dispatched[0]``): a workload lookup each, reading nothing else."""
    for mod in task_modules:
        if database.has_workload(mod) and database.get_top_k(database.commit_workload(mod), 1):
            return True
    return False


def check_tuning_work_dir(path: str, model_name: str | None, target: dict, database=None, task_modules=()) -> None:
    """Refuse (one line) to tune into ``path`` when it holds another model's or another target's database,
    rather than mixing them and rewriting its summary. The model is told by the recorded name; where none
    is recorded (or ``model_name`` is None) by the workloads: a database with workloads, none of them one
    of ``task_modules``, belongs to another model."""
    owner = database_owner(path)
    ours = target_label(target)
    whose = " ".join(([f"of model {owner['model']!r}"] if owner.get("model") else []) +
                     ([f"for {owner['target']}"] if owner.get("target") else []))
    this = f"{f'model {model_name!r}' if model_name else 'this model'} for {ours}"
    why = None
    if owner.get("target") and not _same_target(owner["target"], ours):
        why = f"holds the tuning database {whose}, not {this}"
    elif model_name and owner.get("model") and owner["model"] != model_name:
        why = f"holds the tuning database {whose}, not {this}"
    elif database is not None and task_modules and not (model_name and owner.get("model")):
        workloads = os.path.join(path, "database_workload.json")
        if os.path.isfile(workloads) and os.path.getsize(workloads) and not any(
                database.has_workload(m) for m in task_modules):
            why = (f"holds another model's tuning database{f' ({whose})' if whose else ''}: none of the "
                   f"{len(task_modules)} kernels of {this} is in it")
    if why:
        raise NimbleError(f"--work-dir {path} {why}; pick another --work-dir for this one")


def database_applies(database, mod, target) -> bool:
    """Whether any kernel of ``mod`` (a Relax module, before fusion) has a record in ``database``: its
    tuning tasks extracted as `tvm-nimble tune` extracts them (fusion only, no scheduling), each looked up
    by workload."""
    from .tasks import extract_tuning_tasks

    _, tasks = extract_tuning_tasks(mod, target)
    return holds_any(database, [task.dispatched[0] for task in tasks])
