"""tvm-nimble rpc-server: an RPC server that measures kernels on this machine's GPU for a tracker.

  tvm-nimble rpc-server --tracker 10.0.0.5:9190 --key h100

TVM's own ``python -m tvm.exec.rpc_server``, set up to measure on a GPU:
- TVM's CUDA runtime libraries are loaded in every session: the apache-tvm wheel keeps them apart
  from the core runtime, and a server without them fails every CUDA measurement;
- every session runs in a spawned process (TVM's ``--no-fork``): a session forked from the server
  could not initialize CUDA (``cudaErrorInitializationError``, every trial lost on an H100).
- every session also offers Nimble's timing functions (``tvm_nimble.runtime.rpc_session``), with which
  a machine without this GPU builds ``--kernels best`` / ``--max-streams auto`` artifacts for it.
On a machine without an NVIDIA driver it serves the CPU only, and says so.
"""
from __future__ import annotations

import argparse
import ctypes
import logging


def load_library() -> str | None:
    """TVM's CUDA runtime libraries as ``--load-library`` wants them, or None without an NVIDIA driver."""
    from tvm_nimble.runtime.device import cuda_runtime_libraries

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return ":".join(cuda_runtime_libraries()) or None


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tvm-nimble rpc-server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracker", required=True, help="HOST:PORT of the RPC tracker")
    ap.add_argument("--key", required=True, help="the device key tuners ask the tracker for (e.g. h100)")
    ap.add_argument("--host", default="0.0.0.0", help="address this server listens on")
    ap.add_argument("--port", type=int, default=9090, help="first port to try")
    ap.add_argument("--port-end", type=int, default=9199, help="last port to try")
    args = ap.parse_args(argv)
    from tvm_nimble.compiler.tuning.remote import parse_tracker

    parse_tracker(args.tracker)  # a malformed address is one line, before anything starts
    from tvm import rpc

    from tvm_nimble.runtime.rpc_session import install

    libs = load_library()
    if libs is None:
        print("tvm-nimble rpc-server: no NVIDIA driver here: serving the CPU only", flush=True)
    logging.basicConfig(level=logging.INFO)
    host, port = args.tracker.rsplit(":", 1)
    server = rpc.Server(args.host, args.port, args.port_end, key=args.key, tracker_addr=(host, int(port)),
                        load_library=libs, no_fork=True, server_init_callback=install)
    server.proc.join()


if __name__ == "__main__":
    main()
