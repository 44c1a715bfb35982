"""Tuning measured through TVM's RPC tracker: a real tracker and two real RPC servers on 127.0.0.1 (llvm).

Both servers must measure trials (their logs show the modules they loaded), the database must
resume across runs, killing one server mid-run must cost at most its in-flight trials, and a wrong
tracker or key must be one line from the CLI.
"""
import contextlib
import subprocess
import sys
import threading
import time

import pytest

from tvm_nimble import zoo
from tvm_nimble.compiler.tuning.remote import free_port, kill_group, loopback_fleet
from tvm_nimble.compiler.tuning.tune import tune

pytest.importorskip("tornado")  # TVM's tracker needs it; `make test` installs it
KEY = "nimble-test"


class _Fleets:
    """One loopback fleet at a time for the module (starting one, a tracker and two servers that import TVM, takes
    some 25 s on a 2-core machine): every test gets the one running, unless a test that kills a server had it,
    in which case a fresh one is started. Everything is killed at the module's end."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory, self.stack = tmp_path_factory, contextlib.ExitStack()
        self.current, self.spent = None, True

    def get(self, spend: bool = False):
        if self.spent:
            if self.current is not None:
                self.stack.close()  # the fleet a server was killed in: its tracker and the other server too
            self.stack = contextlib.ExitStack()
            self.current = self.stack.enter_context(
                loopback_fleet(2, KEY, str(self.tmp_path_factory.mktemp("fleet"))))
        self.spent = spend
        return self.current


@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    f = _Fleets(tmp_path_factory)
    try:
        yield f
    finally:
        f.stack.close()


@pytest.fixture
def fleet(fleets):
    """(tracker HOST:PORT, [server process, log path] x 2), both servers running, for a test that kills one: the
    module's fleet when it is intact (the other tests run first in file order), else a fresh one; no later test
    gets it."""
    return fleets.get(spend=True)


@pytest.fixture
def shared_fleet(fleets):
    """:func:`fleet` for the tests that leave both servers running."""
    return fleets.get()


def _loads(log) -> int:
    return open(log, errors="replace").read().count("load_module")


def _tune(work_dir, tracker, model="inception", total=8, per_task=2):
    return tune(zoo.get_model(model), "llvm", str(work_dir), trials_per_task=per_task, total_trials=total,
                trials_per_iter=per_task, strategy="replay-trace", cost_model="random", progress=False,
                rpc_tracker=tracker, rpc_key=KEY)


def test_both_servers_measure_and_the_database_resumes(shared_fleet, tmp_path):
    tracker, servers = shared_fleet
    first = _tune(tmp_path / "db", tracker)
    assert first.servers == 2 and first.trials_this_run == 8 and first.failed_trials == 0
    assert all(_loads(log) > 0 for _, log in servers)  # both servers measured candidates
    done = {t["name"]: t["trials"] for t in first.tasks if t["trials"]}
    second = _tune(tmp_path / "db", tracker)
    assert second.trials_this_run == 8
    after = {t["name"]: t["trials"] for t in second.tasks}
    assert all(after[name] == n for name, n in done.items())  # resumed: the first run's tasks were not redone
    assert sum(after.values()) == 16


def test_wrong_tracker_or_key_is_one_line(shared_fleet, tmp_path):
    tracker, _ = shared_fleet
    cli = [sys.executable, "-m", "tvm_nimble.cli", "tune", "zoo:incept6", "--target", "llvm", "--total-trials", "1",
           "--work-dir", str(tmp_path / "db")]
    for extra, message in ((["--rpc-tracker", f"127.0.0.1:{free_port()}", "--rpc-key", KEY], "cannot reach the RPC tracker"),
                           (["--rpc-tracker", tracker, "--rpc-key", "other"], "no RPC server is registered under key 'other'"),
                           (["--rpc-tracker", "nohostport", "--rpc-key", KEY], "--rpc-tracker expects HOST:PORT"),
                           (["--rpc-tracker", tracker], "--rpc-tracker needs --rpc-key")):
        r = subprocess.run(cli + extra, capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and message in r.stderr, (extra, r.stderr[-500:])
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_rpc_server_with_a_malformed_tracker_is_one_line():
    r = subprocess.run([sys.executable, "-m", "tvm_nimble.cli", "rpc-server", "--tracker", "no-port", "--key", "k"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "tvm-nimble: error: --rpc-tracker expects HOST:PORT (e.g. 127.0.0.1:9190), got 'no-port'"]


# last in the file: it ends one server of the module's fleet (a test after it would start a fresh fleet)
def test_killing_a_server_mid_run_loses_only_its_trials(fleet, tmp_path):
    tracker, servers = fleet
    (victim, victim_log), (_, survivor_log) = servers
    measured_before = _loads(victim_log)  # the fleet may have served the tests before this one
    killed_at = []

    def kill_after_first_measurement():
        while _loads(victim_log) == measured_before:
            time.sleep(0.02)
        kill_group(victim)  # the server and the process it serves from
        killed_at.append(_loads(survivor_log))

    threading.Thread(target=kill_after_first_measurement, daemon=True).start()
    report = _tune(tmp_path / "db", tracker, model="nasnet", total=24, per_task=4)
    assert killed_at, "the victim server never measured"
    assert report.trials_this_run == 24  # the run went on
    assert report.failed_trials <= 2  # at most what the dead server held (two runner workers)
    assert _loads(survivor_log) > killed_at[0]  # the other server kept measuring
