"""The accuracy report's float32 reference, compiled by a child process while the build's stages run.

A reduced-precision build measures its error against stock TVM's float32 build of the same model
(:mod:`.accuracy`): a whole TVM build of its own (DLight's schedules, TVM's lowering, nvcc), 10-17 s of an
H100's cold fp16 build of googlenet, inception_v3 or resnet50. Nothing in it depends on the build's own stages,
so the build starts it right after the import (:func:`start`), in a child process that imports the same ONNX
model, compiles it and exports the library; the accuracy stage loads that library (:meth:`PendingReference.executable`).

A process and not a thread: the kernel choice and the stream choice time kernels from Python (launch, then
synchronize, per sample), and a thread compiling beside them would take the GIL between a launch and its
synchronize (DLight's schedules are Python), adding milliseconds to samples of microseconds. The child runs at a
lower priority (``nice`` 10) with half the build's nvcc processes, so that the build it runs beside (its timers,
its own compiles: the critical path) keeps the cores it asks for.

The child's module must be the parent's: it reports its structural hash, and a library of another module (or a
child that failed) is not used: the accuracy stage then builds the reference itself, as before.

    python -m tvm_nimble.compiler.reference_build MODEL.onnx SHAPES.json TARGET.json OUT_DIR   (the child)
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import weakref

import tvm
import tvm_ffi

#: the exported library and the module hash the child writes into its folder
LIBRARY, HASH = "reference.so", "module_hash.txt"


class PendingReference:
    """A child process compiling stock TVM's float32 build of ``fp32_mod``'s model into ``folder``."""

    def __init__(self, proc: subprocess.Popen, folder: str, module_hash: str):
        self.proc, self.folder, self.module_hash = proc, folder, module_hash
        self._done = False
        self._finalizer = weakref.finalize(self, _discard, proc, folder)

    def executable(self):
        """The reference's executable (``tvm.relax.VMExecutable``) once the child is done; None where it failed or
        compiled another module than the parent's (then the caller builds it). Called once."""
        if self._done:
            return None
        self._done = True
        try:
            if self.proc.wait() != 0:
                return None
            with open(os.path.join(self.folder, HASH)) as f:
                if f.read().strip() != self.module_hash:
                    return None
            return tvm.relax.VMExecutable(tvm.runtime.load_module(os.path.join(self.folder, LIBRARY)))
        except (OSError, tvm.error.TVMError):
            return None
        finally:
            self._finalizer()  # the library is loaded (mapped) or not wanted: its folder goes

    def cancel(self) -> None:
        """Not needed (the reference was cached): the child is stopped and its folder removed."""
        self._done = True
        self._finalizer()


def _discard(proc: subprocess.Popen, folder: str) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


#: the largest ModelProto handed to a child (written to a file for it): protobuf's 2 GB limit, less a margin
CHILD_MODEL_BYTES = (1 << 31) - (1 << 20)


def start(model, shape_dict: dict | None, fp32_mod: tvm.IRModule, target: tvm.target.Target,
          module_hash: str, limit: int = CHILD_MODEL_BYTES) -> PendingReference | None:
    """A child process compiling the reference of ``model`` (an ONNX ModelProto or a path to one; None for anything
    else: an IRModule, which a child cannot import, or a ModelProto over ``limit`` bytes, which protobuf cannot
    serialize: a 0.5B decoder in float32), whose import is ``fp32_mod`` (``module_hash``: its structural hash) with
    ``shape_dict``, for ``target``."""
    import onnx

    from .frontend.onnx_import import fits_in_memory_checks

    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        path = os.path.abspath(model)
    elif isinstance(model, onnx.ModelProto) and fits_in_memory_checks(model, limit):
        path = None
    else:
        return None
    folder = tempfile.mkdtemp(prefix="nimble-reference-")
    if path is None:
        path = os.path.join(folder, "model.onnx")
        onnx.save(model, path)
    with open(os.path.join(folder, "shapes.json"), "w") as f:
        json.dump({k: [int(d) for d in v] for k, v in (shape_dict or {}).items()}, f)
    with open(os.path.join(folder, "target.json"), "w") as f:
        f.write(str(target))  # (a Target prints as the JSON it is made from again)
    from tvm_nimble import env

    child_env = dict(os.environ, **{env.JOBS: str(max(1, env.jobs() // 2))})
    log = open(os.path.join(folder, "child.log"), "wb")
    with log:
        proc = subprocess.Popen([sys.executable, "-m", __name__, path, os.path.join(folder, "shapes.json"),
                                 os.path.join(folder, "target.json"), folder],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env)
    return PendingReference(proc, folder, module_hash)


def main(argv: list[str]) -> int:
    model_path, shapes_path, target_path, folder = argv
    os.nice(10)  # behind the build it runs beside (see the module's docstring); its nvcc processes inherit it
    from .stages import import_model
    from .stock import build_stock_vm

    with open(shapes_path) as f:
        shape_dict = json.load(f) or None
    with open(target_path) as f:
        target = tvm.target.Target(f.read())
    mod = import_model(model_path, None, shape_dict)
    with open(os.path.join(folder, HASH), "w") as f:
        f.write(str(tvm_ffi.structural_hash(mod)))
    build_stock_vm(mod, target).export_library(os.path.join(folder, LIBRARY))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
