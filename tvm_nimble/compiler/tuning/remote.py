"""Measuring tuning trials on remote devices through TVM's RPC tracker.

Building stays here (the local builder pool); each built candidate goes to whichever RPC server
registered under the key is free (MetaSchedule's ``RPCRunner``, one worker per server), so two
servers measure two candidates at once. A server that dies or times out fails only the trials it
held: MetaSchedule records them as failed runs and the run goes on with the others.

Start a fleet (every GPU machine runs a server: TVM's own, with TVM's CUDA runtime loaded, which
a plain ``python -m tvm.exec.rpc_server`` from the apache-tvm wheel does not do):

    python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190
    tvm-nimble rpc-server --tracker TRACKER_HOST:9190 --key h100             # on each GPU machine
    tvm-nimble tune model.onnx --rpc-tracker TRACKER_HOST:9190 --rpc-key h100 --arch sm_90
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

from tvm_nimble.errors import NimbleError

#: seconds one remote measurement (upload, load, time, clean up) may take before it counts as lost
SESSION_TIMEOUT_S = 60


def parse_tracker(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), or a one-line error."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise NimbleError(f"--rpc-tracker expects HOST:PORT (e.g. 127.0.0.1:9190), got {text!r}")
    return host, int(port)


def servers_under_key(host: str, port: int, key: str) -> int:
    """How many servers the tracker lists under ``key`` (free or busy); a clear error if it is unreachable."""
    from tvm import rpc

    try:
        socket.create_connection((host, port), timeout=5).close()  # TVM itself retries for a minute
        summary = rpc.connect_tracker(host, port).summary()
    except Exception as err:  # refused, unresolvable, not a tracker
        raise NimbleError(f"cannot reach the RPC tracker at {host}:{port} ({str(err).splitlines()[0][:120]}); "
                          "start one with `python -m tvm.exec.rpc_tracker --port PORT`") from None
    count = sum(1 for server in summary.get("server_info", []) if server.get("key") == f"server:{key}")
    if count == 0:
        keys = ", ".join(sorted(summary.get("queue_info", {}))) or "none"
        raise NimbleError(f"no RPC server is registered under key {key!r} at {host}:{port} (keys there: {keys}); "
                          f"start one with `tvm-nimble rpc-server --tracker {host}:{port} --key {key}`")
    return count


def rpc_runner(tracker: str, key: str, evaluator_config):
    """(MetaSchedule RPCRunner over every server under ``key``, the server count)."""
    from tvm.s_tir import meta_schedule as ms

    host, port = parse_tracker(tracker)
    n = servers_under_key(host, port, key)
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                                 session_timeout_sec=SESSION_TIMEOUT_S)
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator_config, max_workers=n), n


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(ready, what: str, seconds: float) -> None:
    deadline = time.time() + seconds
    while True:
        try:
            if ready():
                return
        except (OSError, NimbleError):
            pass
        if time.time() > deadline:
            raise NimbleError(f"{what} after {seconds:.0f} s")
        time.sleep(0.2)


def kill_group(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and every process it started (an RPC server serves from a child process, which
    starts the sessions): each fleet process leads a process group of its own."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@contextlib.contextmanager
def loopback_fleet(n_servers: int, key: str, log_dir: str, timeout: float = 60):
    """A tracker and ``n_servers`` RPC servers on 127.0.0.1 (TVM's tracker, ``tvm-nimble rpc-server``), for tests
    and for measuring tuning throughput on one machine. Yields (``HOST:PORT``, [(server process, its
    log path)]); every process is killed on exit (:func:`kill_group`). The tracker needs the tornado package."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                               "--port-end", str(port + 1)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)]
    servers = []
    try:
        _wait(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() is None,
              f"the RPC tracker did not listen on 127.0.0.1:{port}", timeout)
        for k in range(n_servers):
            log, sp = os.path.join(log_dir, f"server{k}.log"), free_port()
            with open(log, "w") as f:
                procs.append(subprocess.Popen([sys.executable, "-m", "tvm_nimble.cli", "rpc-server", "--tracker",
                                               f"127.0.0.1:{port}", "--key", key, "--host", "127.0.0.1", "--port",
                                               str(sp), "--port-end", str(sp + 1)], stdout=subprocess.DEVNULL, stderr=f,
                                              start_new_session=True))
            servers.append((procs[-1], log))
        _wait(lambda: servers_under_key("127.0.0.1", port, key) == n_servers,
              f"{n_servers} RPC server(s) did not register", timeout)
        yield f"127.0.0.1:{port}", servers
    finally:
        for p in procs:
            kill_group(p)
