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

A bucketed build (:mod:`.buckets`) imports each bucket from the model with its weights lifted to inputs and bound
again (parsed once for every bucket), at the bucket's input sizes: its child repeats that import
(:class:`BucketImport`), so that its module is the parent's, hash for hash, and reads the model from one file
written for all the buckets' children (:func:`model_file`).

    python -m tvm_nimble.compiler.reference_build MODEL.onnx SHAPES.json TARGET.json OUT_DIR [BUCKET.json]   (the child)
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import weakref
from dataclasses import dataclass

import tvm
import tvm_ffi

from .frontend.onnx_import import LIFTED_WEIGHT_BYTES

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


@dataclass(frozen=True)
class BucketImport:
    """How a bucketed build imports one bucket: the model with its weights lifted to inputs (``weights_as_inputs``)
    at input sizes ``shapes`` (input name -> dims; ``output_batch``: the outputs' leading dimension made symbolic,
    as ``with_shapes`` does for batch sizes), the lifted weights (float initializers of
    ``min_weight_bytes`` or more) bound back."""
    shapes: dict
    output_batch: bool = False
    min_weight_bytes: int = LIFTED_WEIGHT_BYTES

    @staticmethod
    def lifted(model, min_weight_bytes: int = LIFTED_WEIGHT_BYTES) -> tuple:
        """(``model``, a .onnx path or a ModelProto, with its weights lifted to inputs; those weights as TVM tensors):
        what :meth:`module` takes, parsed once for every bucket."""
        from .frontend.onnx_import import load_onnx_model, weights_as_inputs

        stripped, weights = weights_as_inputs(load_onnx_model(model), min_weight_bytes)
        return stripped, [tvm.runtime.tensor(w) for _, w in weights]

    def module(self, lifted: tuple, params: dict | None = None, check: bool = True) -> tvm.IRModule:
        """The bucket's module, from :meth:`lifted`'s model and weights (``check``: the ONNX checker runs)."""
        from .frontend.onnx_import import with_shapes
        from .stages import import_model

        stripped, tensors = lifted
        return import_model(with_shapes(stripped, self.shapes, self.output_batch), params, check=check,
                            weights=tensors)


def _child_path(model, limit: int) -> str | None:
    """``model``'s file where it is a path to one; None for a ModelProto (to be written) and "" for what no child
    can import (an IRModule; a ModelProto over ``limit`` bytes, which protobuf cannot serialize: a 0.5B decoder in
    float32)."""
    import onnx

    from .frontend.onnx_import import fits_in_memory_checks

    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        return os.path.abspath(model)
    if isinstance(model, onnx.ModelProto) and fits_in_memory_checks(model, limit):
        return None
    return ""


@contextlib.contextmanager
def model_file(model, limit: int = CHILD_MODEL_BYTES):
    """A path to ``model`` (a .onnx path or a ModelProto, written once to a temporary folder removed after) for the
    children of several builds of it (a bucketed build's); None where no child can import it (see :func:`start`)."""
    import onnx

    path = _child_path(model, limit)
    if path is not None:
        yield path or None
        return
    folder = tempfile.mkdtemp(prefix="nimble-reference-model-")
    try:
        path = os.path.join(folder, "model.onnx")
        onnx.save(model, path)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start(model, shape_dict: dict | None, fp32_mod: tvm.IRModule, target: tvm.target.Target,
          module_hash: str, limit: int = CHILD_MODEL_BYTES, bucket: BucketImport | None = None) -> PendingReference | None:
    """A child process compiling the reference of ``model`` (an ONNX ModelProto or a path to one; None for anything
    else: an IRModule, which a child cannot import, or a ModelProto over ``limit`` bytes, which protobuf cannot
    serialize: a 0.5B decoder in float32), whose import is ``fp32_mod`` (``module_hash``: its structural hash) with
    ``shape_dict``, or as ``bucket`` says, for ``target``."""
    import onnx

    path = _child_path(model, limit)
    if path == "":
        return None
    folder = tempfile.mkdtemp(prefix="nimble-reference-")
    if path is None:
        path = os.path.join(folder, "model.onnx")
        onnx.save(model, path)
    with open(os.path.join(folder, "shapes.json"), "w") as f:
        json.dump({k: [int(d) for d in v] for k, v in (shape_dict or {}).items()}, f)
    with open(os.path.join(folder, "target.json"), "w") as f:
        f.write(str(target))  # (a Target prints as the JSON it is made from again)
    args = [path, os.path.join(folder, "shapes.json"), os.path.join(folder, "target.json"), folder]
    if bucket is not None:
        args.append(os.path.join(folder, "bucket.json"))
        with open(args[-1], "w") as f:
            json.dump({"shapes": {k: [int(d) for d in v] for k, v in bucket.shapes.items()},
                       "output_batch": bucket.output_batch, "min_weight_bytes": bucket.min_weight_bytes}, f)
    from tvm_nimble import env

    child_env = dict(os.environ, **{env.JOBS: str(max(1, env.jobs() // 2))})
    log = open(os.path.join(folder, "child.log"), "wb")
    with log:
        proc = subprocess.Popen([sys.executable, "-m", __name__, *args],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env)
    return PendingReference(proc, folder, module_hash)


def main(argv: list[str]) -> int:
    model_path, shapes_path, target_path, folder, *bucket_path = argv
    os.nice(10)  # behind the build it runs beside (see the module's docstring); its nvcc processes inherit it
    from .stages import import_model
    from .stock import build_stock_vm

    with open(shapes_path) as f:
        shape_dict = json.load(f) or None
    with open(target_path) as f:
        target = tvm.target.Target(f.read())
    if bucket_path:
        with open(bucket_path[0]) as f:
            bucket = BucketImport(**json.load(f))
        mod = bucket.module(BucketImport.lifted(model_path, bucket.min_weight_bytes))
    else:
        mod = import_model(model_path, None, shape_dict)
    with open(os.path.join(folder, HASH), "w") as f:
        f.write(str(tvm_ffi.structural_hash(mod)))
    build_stock_vm(mod, target).export_library(os.path.join(folder, LIBRARY))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
