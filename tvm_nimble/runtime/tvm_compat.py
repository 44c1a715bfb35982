"""Every use of a private or moving TVM API by the runtime, in one place.

The runtime's counterpart of ``tvm_nimble.relay_passes.tvm_compat`` (the compiler's), kept apart
because the runtime never imports the compiler side (see ``tests/test_layout.py``). Each function
says what it works around. They are pinned to apache-tvm==0.27.0.post1 and
apache-tvm-ffi==0.1.14.post0 (see pyproject.toml); when TVM changes one of these internals, this
file is the one to update. Runtime only: nothing here imports ``tvm.relax``.
"""
from __future__ import annotations

#: TVM's own RPC session loop, kept when :func:`replace_rpc_serve_loop` puts another in its place. Process-wide
#: because the rebinding it remembers is: TVM's module attribute is one per process.
_tvm_serve_loop: dict = {}


def tensor_view(storage, shape, dtype: str, byte_offset: int):
    """A ``shape``/``dtype`` view of the tensor ``storage``, ``byte_offset`` bytes in, sharing its memory.

    Private: ``tvm.runtime.Tensor._create_view`` (TVM 0.27.0.post1), the only way TVM's Python API
    offers to alias part of an allocation; its own docstring warns it may be removed or replaced.
    The executor's workspace places every tensor of a plan in a storage block this way."""
    return storage._create_view(shape, dtype, byte_offset)


def zero_offset(view):
    """``view`` with its ``byte_offset`` folded into its data pointer (the same memory, no copy when the
    offset is aligned to TVM's 64-byte allocation alignment; a copy otherwise).

    Internal: the Relax VM's builtin ``vm.builtin.ensure_zero_offset`` (TVM 0.27.0.post1), undocumented
    outside the VM. TVM's compiled kernels reject a tensor whose ``byte_offset`` is not 0."""
    import tvm_ffi

    return tvm_ffi.get_global_func("vm.builtin.ensure_zero_offset")(view)


def tvm_rpc_serve_loop():
    """TVM's own RPC session loop, ``loop(sock, load_library, work_path)``: what each session process of
    ``tvm.rpc.Server`` runs, even after :func:`replace_rpc_serve_loop` (call it at the end of yours).

    Private: ``tvm.rpc.server._serve_loop`` (TVM 0.27.0.post1). TVM offers no per-session hook:
    ``server_init_callback`` runs only in the server's process, which a session does not inherit."""
    import tvm.rpc.server as server

    return _tvm_serve_loop.get("loop") or server._serve_loop


def replace_rpc_serve_loop(loop) -> None:
    """Every RPC session process that ``tvm.rpc.Server`` starts from now on (in this process) runs
    ``loop(sock, load_library, work_path)`` in place of TVM's loop (see :func:`tvm_rpc_serve_loop`).

    Private: rebinds ``tvm.rpc.server._serve_loop`` (TVM 0.27.0.post1), which ``_serving`` looks up
    each time it starts a session process. ``loop`` must be a module-level function, so that a
    spawned or forkserver session process can import it by reference."""
    import tvm.rpc.server as server

    if "loop" not in _tvm_serve_loop:
        _tvm_serve_loop["loop"] = server._serve_loop
    server._serve_loop = loop
