"""Where a build's measurements run: this machine's GPU, or a GPU behind TVM's RPC tracker.

``kernels="best"`` and ``max_streams="auto"`` decide by timing plans on the GPU they are built for.
:class:`LocalGPU` times them here; :class:`RemoteGPU` exports each plan as an artifact, uploads it to
one session of an RPC server registered under a key (``tvm-nimble rpc-server``), and times it there
(:mod:`tvm_nimble.runtime.rpc_session`), so a machine without that GPU can build for it. Both
offer the same calls: ``arch()``, ``launch_ms(result, reps)``, ``replay_ms(results)`` (a
:class:`~tvm_nimble.runtime.timing.ReplayTimes`: every round's times, side by side), ``where`` and
``fingerprint()`` (what the timing cache keys their measurements by: the GPU, its driver and libraries,
a dict; empty when nothing identifies the GPU). :class:`LocalGPU` also times cuBLASLt's algorithm
candidates (``gemm_us``); a timer without it leaves every GEMM on the heuristic's first.
"""
from __future__ import annotations

import json
import os
import tarfile
import tempfile

from tvm_nimble.errors import NimbleError
from tvm_nimble.runtime import timing
from tvm_nimble.runtime.gpu_identity import gpu_fingerprint

from .notes import Notes
from .target import local_gpu_arch

#: seconds a remote session may last (the kernel choice of inception_v3 takes well under a minute)
SESSION_TIMEOUT_S = 600


class LocalGPU:
    """Measure on this machine's first GPU."""

    where = "this machine"

    def arch(self) -> str | None:
        return local_gpu_arch()

    def launch_ms(self, result, reps: int) -> list[float]:
        return timing.launch_ms(result, reps)

    def replay_ms(self, results: list) -> timing.ReplayTimes:
        return timing.replay_ms(results)

    def fingerprint(self) -> dict:
        return dict(gpu_fingerprint())

    def gemm_us(self, timings_func: str, call, reps: int) -> list[float]:
        """Microseconds per call of each cuBLASLt algorithm candidate of ``call`` (a Relax ``call_dps_packed``
        of a cuBLASLt function), on random operands of its shapes (cuda:0), timed by the vendor extension's
        ``timings_func`` over ``reps`` back-to-back calls."""
        import numpy as np
        import tvm
        import tvm_ffi
        from tvm import relax

        dev = tvm.cuda(0)
        rng = np.random.default_rng(0)
        args = []
        for a in call.args[1].fields:
            if isinstance(a, relax.ShapeExpr):
                args.append(tvm_ffi.Shape([int(x) for x in a.values]))
            else:
                shape = [int(d) for d in a.ty.shape.values]
                args.append(tvm.runtime.tensor(rng.standard_normal(shape).astype(str(a.ty.dtype)), dev))
        outs = [tvm.runtime.empty([int(d) for d in t.shape.values], str(t.dtype), dev) for t in call.ty.fields]
        return [float(x) for x in tvm_ffi.get_global_func(timings_func)(*args, *outs, reps)]


def _remote_error(err: Exception) -> NimbleError:
    """The message of an error raised in the RPC session (TVM puts it after its own header line)."""
    lines = [l.strip() for l in str(err).splitlines() if l.strip() and "Error caught from RPC call" not in l]
    return NimbleError(f"on the RPC server: {(lines[-1] if lines else repr(err))[:300]}")


class RemoteGPU:
    """Measure on a GPU of an RPC server registered with the tracker at ``tracker`` (HOST:PORT) under
    ``key``; one session serves every measurement of the build. ``note(text)``: where its one-line notes go."""

    def __init__(self, tracker: str, key: str, note=None):
        from .tuning.remote import parse_tracker, servers_under_key

        self.host, self.port = parse_tracker(tracker)
        servers_under_key(self.host, self.port, key)  # unreachable tracker, unknown key: one line now
        self.key = key
        self.note = note if note is not None else Notes()
        self.where = f"the RPC server under key {key!r} at {tracker}"
        self._session = None
        self._arch: str | None = None
        self._fingerprint: dict | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="nimble-rpc-")
        self._uploads = 0

    def _remote(self):
        if self._session is None:
            from tvm import rpc

            self._session = rpc.connect_tracker(self.host, self.port).request(self.key,
                                                                                session_timeout=SESSION_TIMEOUT_S)
            try:
                self._session.get_function("nimble.rpc.gpu_arch")
            except Exception:
                raise NimbleError(f"{self.where} does not offer Nimble's timing functions: start it with "
                                  f"`tvm-nimble rpc-server` (not TVM's plain rpc_server)") from None
        return self._session

    def _call(self, name: str, *args):
        try:
            return self._remote().get_function(name)(*args)
        except NimbleError:
            raise
        except Exception as err:
            raise _remote_error(err) from None

    def _upload(self, result) -> str:
        """Export ``result`` as an artifact, upload it as a tar file; its name in the session."""
        self._uploads += 1
        name = f"plan{self._uploads}"
        local = os.path.join(self._tmp.name, name)
        result.export(os.path.join(local, "model.nimble"))
        with tarfile.open(local + ".tar", "w") as tar:
            tar.add(os.path.join(local, "model.nimble"), arcname="model.nimble")
        self._remote().upload(local + ".tar", target=name + ".tar")
        return name + ".tar"

    def arch(self) -> str | None:
        """The session's GPU, asked once (a build checks it before the kernel choice and the stream cap)."""
        if self._arch is None:
            self._arch = str(self._call("nimble.rpc.gpu_arch"))
        return self._arch or None

    def fingerprint(self) -> dict:
        """The session's GPU, driver and libraries, asked once; empty (nothing cached on disk) from a server
        of an older tvm-nimble that cannot say."""
        if self._fingerprint is None:
            try:
                self._remote().get_function("nimble.rpc.gpu_fingerprint")
            except NimbleError:
                raise
            except Exception:
                self.note(f"{self.where} does not report its GPU's driver and libraries (an older tvm-nimble): "
                          "its timings are not kept in the timing cache; update tvm-nimble there")
                self._fingerprint = {}
            else:
                self._fingerprint = json.loads(self._call("nimble.rpc.gpu_fingerprint"))
        return self._fingerprint

    def launch_ms(self, result, reps: int) -> list[float]:
        return json.loads(self._call("nimble.rpc.launch_ms", self._upload(result), reps))

    def replay_ms(self, results: list) -> timing.ReplayTimes:
        names = "\n".join(self._upload(r) for r in results)
        value = json.loads(self._call("nimble.rpc.replay_ms", names, timing.ROUNDS, 40))
        if isinstance(value, list) and all(isinstance(x, (int, float)) for x in value):
            # a server of an older tvm-nimble: one median per plan, taken as one round
            self.note(f"{self.where} replies with one median per replayed plan (an older tvm-nimble): the stream "
                      "choice cannot tell its rounds' noise apart from a gain; update tvm-nimble there")
            return timing.ReplayTimes([value])
        try:
            return timing.ReplayTimes.from_json(value)
        except ValueError as err:
            raise NimbleError(f"{self.where} answered the replay with {err}") from None

    def close(self) -> None:
        self._session = None
        self._tmp.cleanup()


def has_gpu_for(timer, target) -> bool:
    """Whether ``timer`` (this machine or an RPC key's servers) has a GPU of ``target``'s arch to measure on."""
    return target.kind.name == "cuda" and timer.arch() == str(target.attrs["arch"])


def timer_for(rpc_tracker: str | None, rpc_key: str | None, note=None):
    """:class:`RemoteGPU` when a tracker is given (with its key), else :class:`LocalGPU`: the one place a build's
    timer is made (by its :class:`~.session.BuildSession`). ``note``: the session's notes."""
    if rpc_tracker is None and rpc_key is None:
        return LocalGPU()
    if not rpc_tracker or not rpc_key:
        raise NimbleError("measuring through an RPC tracker needs both the tracker (HOST:PORT) and the key "
                          "its servers registered under (--rpc-tracker and --rpc-key)")
    return RemoteGPU(rpc_tracker, rpc_key, note)
