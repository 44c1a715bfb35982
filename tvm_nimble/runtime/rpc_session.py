"""The server side of timing through an RPC tracker: Nimble's functions in every RPC session.

A build machine without the GPU (``build(..., kernels="best", rpc_tracker=..., rpc_key=...)``)
exports each plan it wants timed as an artifact, uploads it as a tar file to a session of an RPC
server registered under the key, and calls these functions there:

``nimble.rpc.gpu_arch()``                    the server's GPU (``sm_XY``, "" without one)
``nimble.rpc.gpu_fingerprint()``             JSON: its GPU, driver and libraries (:mod:`.gpu_identity`)
``nimble.rpc.launch_ms(tar, reps)``          JSON: median ms of every launch (:func:`.timing.launch_ms`)
``nimble.rpc.replay_ms(tars, rounds, iters)`` JSON: each round's median ms of each artifact's replay, side by
                                             side (``tars`` newline-separated; :func:`.timing.replay_ms`,
                                             :meth:`.timing.ReplayTimes.to_json`)

TVM's RPC server runs every session in a process of its own; its ``server_init_callback`` runs only
in the server's process, which a spawned session does not inherit. So :func:`install`, that
callback, replaces TVM's session loop with :func:`_session_loop` (through a private TVM API: see
:func:`.tvm_compat.replace_rpc_serve_loop`): each session process imports this module (by
reference, whatever the start method) and registers the functions before TVM's serving loop.
Runtime only: the artifacts load with the TVM runtime, the vendor extension included.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import tarfile

from tvm_nimble import env

from .tvm_compat import replace_rpc_serve_loop, tvm_rpc_serve_loop


def _unpacked(tar_name: str, workdir: str):
    """Load the artifact of the uploaded ``tar_name`` (in the session's ``workdir``).

    Vendor extensions are kept once per content: every artifact of a build carries the same
    ``vendor.so``, and loading it again from a new path would register its functions twice."""
    from .artifact import VENDOR_FILE
    from .module import load

    tar_path = os.path.join(workdir, tar_name)
    dest = tar_path + ".d"
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="data")
    (root,) = [os.path.join(dest, d) for d in os.listdir(dest)]
    vendor = os.path.join(root, VENDOR_FILE)
    if os.path.isfile(vendor):
        with open(vendor, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        kept = os.path.join(workdir, f"vendor-{digest}.so")
        if not os.path.exists(kept):
            os.replace(vendor, kept)
        else:
            os.remove(vendor)
        os.symlink(kept, vendor)
    return load(root)


def register_session_functions(workdir: str) -> None:
    """Register the ``nimble.rpc.*`` functions, reading uploads from ``workdir``."""
    import tvm_ffi

    from . import timing
    from .device import gpu_arch
    from .gpu_identity import gpu_fingerprint

    tvm_ffi.register_global_func("nimble.rpc.gpu_arch", lambda: gpu_arch() or "", override=True)
    tvm_ffi.register_global_func("nimble.rpc.gpu_fingerprint", lambda: json.dumps(dict(gpu_fingerprint())),
                                 override=True)
    tvm_ffi.register_global_func(
        "nimble.rpc.launch_ms",
        lambda tar, reps: json.dumps(timing.launch_ms(_unpacked(tar, workdir), int(reps))), override=True)
    tvm_ffi.register_global_func(
        "nimble.rpc.replay_ms",
        lambda tars, rounds, iters: json.dumps(timing.replay_ms([_unpacked(t, workdir) for t in tars.split("\n")],
                                                                int(rounds), int(iters)).to_json()), override=True)


def _session_loop(sock, load_library, work_path):
    """One RPC session, in a process of its own: Nimble's functions, then TVM's serving loop."""
    register_session_functions(work_path.path)
    tvm_rpc_serve_loop()(sock, load_library, work_path)


def install() -> None:
    """``server_init_callback`` of ``tvm.rpc.Server``: in the server's process, every session process it
    starts from then on runs :func:`_session_loop` (and so offers the ``nimble.rpc.*`` functions)."""
    replace_rpc_serve_loop(_session_loop)
    # Every session process imports TVM, and tvm_ffi imports PyTorch and asks torch.cuda.is_available(),
    # which initializes CUDA (10.5 s per session on the H100 image) and leaves a process that cannot fork
    # a CUDA-capable child. Sessions need neither: skip that probe (TVM-FFI's switch) and let PyTorch
    # answer from NVML should anything ask.
    env.quiet_torch_interop(force=True)
    if "forkserver" in multiprocessing.get_all_start_methods():
        # sessions fork from one process that imported TVM once (it never touches CUDA; each session loads
        # TVM's CUDA runtime itself) instead of each spawning a fresh Python that imports it again
        multiprocessing.set_start_method("forkserver", force=True)
        multiprocessing.set_forkserver_preload([__name__, "tvm.rpc.server"])

