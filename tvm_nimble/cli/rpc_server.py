"""tvm-nimble rpc-server: an RPC server that measures kernels on this machine's GPU for a tracker.

  tvm-nimble rpc-server --tracker 10.0.0.5:9190 --key h100

TVM's own ``python -m tvm.exec.rpc_server``, set up to measure on a GPU:
- TVM's CUDA runtime libraries are loaded in every session: the apache-tvm wheel keeps them apart
  from the core runtime, and a server without them fails every CUDA measurement;
- every session runs in a process forked from a fork server that imported TVM once and never touches
  CUDA, with PyTorch's CUDA probe off (``tvm_nimble.runtime.rpc_session.install``): a session forked from
  a process that had initialized CUDA could not (``cudaErrorInitializationError``, every trial lost on an
  H100), and a freshly spawned one pays TVM's import, seconds, per measurement;
- every session also offers Nimble's timing functions (``tvm_nimble.runtime.rpc_session``), with which
  a machine without this GPU builds ``--kernels best`` / ``--max-streams auto`` artifacts for it.
On a machine without an NVIDIA driver it serves the CPU only, and says so. A tracker it cannot reach
within --connect-timeout seconds is one line and exit code 1 (TVM itself would retry forever).
"""
from __future__ import annotations

import argparse
import ctypes
import logging
import socket
import time


def load_library() -> str | None:
    """TVM's CUDA runtime libraries as ``--load-library`` wants them, or None without an NVIDIA driver."""
    from tvm_nimble.native_libs import cuda_runtime_libraries

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return ":".join(cuda_runtime_libraries()) or None


def wait_for_tracker(host: str, port: int, timeout: float) -> None:
    """Return once something listens at ``host:port``; a one-line error after ``timeout`` seconds. TVM's server
    retries a tracker it cannot reach for a minute, then its serving thread dies and the process waits forever."""
    from tvm_nimble.errors import NimbleError

    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))).close()
            return
        except OSError as err:
            why = err.strerror or str(err) or type(err).__name__
        if time.monotonic() >= deadline:
            raise NimbleError(f"cannot reach the RPC tracker at {host}:{port} after {timeout:g} s ({why}): start it "
                              f"first (python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port {port}) or fix --tracker; "
                              "--connect-timeout sets how long to wait")
        time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tvm-nimble rpc-server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracker", required=True, help="HOST:PORT of the RPC tracker")
    ap.add_argument("--key", required=True, help="the device key tuners ask the tracker for (e.g. h100)")
    ap.add_argument("--host", default="0.0.0.0", help="address this server listens on")
    ap.add_argument("--port", type=int, default=9090, help="first port to try")
    ap.add_argument("--port-end", type=int, default=9199, help="last port to try")
    ap.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="give up (exit code 1) when the tracker cannot be reached within this time (default 30)")
    args = ap.parse_args(argv)
    from tvm_nimble.compiler.tuning.remote import parse_tracker

    host, port = parse_tracker(args.tracker)  # a malformed address is one line, before anything starts
    wait_for_tracker(host, port, args.connect_timeout)
    from tvm import rpc

    from tvm_nimble.runtime.rpc_session import install

    libs = load_library()
    if libs is None:
        print("tvm-nimble rpc-server: no NVIDIA driver here: serving the CPU only", flush=True)
    logging.basicConfig(level=logging.INFO)
    # no_fork: TVM's server process never forks itself; install() then starts every session from a fork server
    server = rpc.Server(args.host, args.port, args.port_end, key=args.key, tracker_addr=(host, port),
                        load_library=libs, no_fork=True, server_init_callback=install)
    server.proc.join()


if __name__ == "__main__":
    main()
