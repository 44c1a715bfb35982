"""ONNX Runtime's CUDA execution provider on the same ONNX file: the engine ONNX users deploy with
where TensorRT is not installed. Two systems: plain (``ort-cuda``) and with ORT's own CUDA graph
(``ort-cuda-graph``). TF32 off, exhaustive cuDNN algorithm search, inputs and outputs bound on the
device (I/O binding), so timing covers execution only, as for every other system.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time

import numpy as np

from tvm_nimble.bench.system import System
from tvm_nimble.errors import NimbleError


def onnxruntime_systems(onnx_model, feeds: dict[str, np.ndarray], precision: str = "fp32",
                        use_gpu: bool = True) -> tuple[list, list[str]]:
    """(systems, notes): the two ORT systems in ``precision``, or none and a note saying why.

    tf32 is ORT's ``use_tf32`` option; fp16 runs an fp16 copy of the model made by onnxconverter-common's
    converter with float32 inputs and outputs (``keep_io_types``), as ORT's own docs suggest; bf16 has no
    converter or broad CUDA EP kernel coverage, so no rows."""
    try:
        import onnxruntime as ort
    except ImportError:
        return [], ["ONNX Runtime not installed: no ORT rows (pip install onnxruntime-gpu adds them)"]
    if not use_gpu:
        return [], ["ONNX Runtime's CUDA EP needs a GPU: no ORT rows on this run"]
    if precision == "bf16":
        return [], ["ONNX Runtime has no bf16 conversion of an fp32 model: no ORT rows for bf16"]
    if precision == "fp16":
        try:
            onnx_model = fp16_model(onnx_model)
        except MissingConverter as err:
            return [], [f"{err}: no fp16 ORT rows"]
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return [], ["ONNX Runtime has no CUDA execution provider here: no ORT rows"]
    from cuda.bindings import runtime as rt

    def sync():
        rt.cudaDeviceSynchronize()

    systems = []
    with serialized(onnx_model) as blob:
        for name, graph in (("ort-cuda", "0"), ("ort-cuda-graph", "1")):
            # the outputs' shapes come from the plain session's run: a first run of the CUDA-graph session captures
            # its graph with the buffers that run used, which the bound outputs are not
            system = _session(ort, blob, name, graph, precision, feeds, sync, systems[0].outputs() if systems else None)
            if isinstance(system, str):
                return [], [system]
            systems.append(system)
    return systems, []


class MissingConverter(NimbleError):
    """The fp16 conversion of an ONNX model needs onnxconverter-common, which is not installed."""


def fp16_model(onnx_model, keep_io_types: bool = True):
    """The fp16 copy of ``onnx_model`` ORT's fp16 rows run: onnxconverter-common's converter with float32 inputs and
    outputs (``keep_io_types``), as ORT's own docs suggest; without it, float inputs and outputs in fp16 too (ORT
    GenAI's cache). Without onnxconverter-common: :class:`MissingConverter`, one line saying how to install it."""
    try:
        from onnxconverter_common import float16
    except ImportError as err:
        raise MissingConverter(f"onnxconverter-common not installed ({err}): pip install onnxconverter-common") \
            from None

    from tvm_nimble.compiler.frontend.fold_shapes import fold_static_shapes

    # static shape arithmetic folded first: the converter leaves a Cast(to=float) of a shape in fp32,
    # and timm's attention scale (sqrt of a Cast of a Slice of a Shape) then mixes fp16 and fp32
    folded = fold_static_shapes(onnx_model)
    inferred = _shapes_inferred_on_disk(folded)  # over 2 GB the converter's own inference cannot serialize it
    return _cast_types_kept(float16.convert_float_to_float16(folded if inferred is None else inferred,
                                                             keep_io_types=keep_io_types,
                                                             disable_shape_infer=inferred is not None))


def _shapes_inferred_on_disk(onnx_model, limit: int = 2**31 - 1):
    """``onnx_model`` with ONNX's shape inference applied through a file (``infer_shapes_path``, which takes any
    size), where the model is over ``limit`` bytes (protobuf's 2 GB: a 0.5B-parameter decoder in float32); else None."""
    import onnx

    from tvm_nimble.compiler.frontend.onnx_import import fits_in_memory_checks

    if fits_in_memory_checks(onnx_model, limit=limit):
        return None
    with serialized(onnx_model, limit) as path, tempfile.TemporaryDirectory(prefix="tvm-nimble-fp16-") as tmp:
        out = os.path.join(tmp, "inferred.onnx")
        onnx.shape_inference.infer_shapes_path(path, out)
        inferred = onnx.load(out, load_external_data=False)
        onnx.external_data_helper.load_external_data_for_model(inferred, os.path.dirname(path))
        return inferred


@contextlib.contextmanager
def serialized(onnx_model, limit: int = 2**31 - 1):
    """What ``InferenceSession`` takes: the serialized model, or, over protobuf's 2 GB limit, the path of a copy
    with its weights as external data in a temporary folder (kept while the sessions are made)."""
    import onnx

    from tvm_nimble.compiler.frontend.onnx_import import fits_in_memory_checks

    if fits_in_memory_checks(onnx_model, limit=limit):
        yield onnx_model.SerializeToString()
        return

    with tempfile.TemporaryDirectory(prefix="tvm-nimble-ort-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        copy = onnx.ModelProto()  # saving with external data moves the caller's tensors out of its model
        copy.CopyFrom(onnx_model)
        onnx.save(copy, path, save_as_external_data=True, location="model.onnx.data")
        yield path


def _session(ort, blob, name: str, graph: str, precision: str, feeds: dict, sync, reference=None):
    """One ONNX Runtime system (``graph``: "1" captures a CUDA graph) with its inputs and outputs bound on the
    GPU, or the one-line reason it could not be made. ``reference``: outputs of the model on ``feeds`` (their
    shapes and dtypes), else this session runs it once unbound (never a CUDA-graph session: see the caller)."""
    options = {"use_tf32": "1" if precision == "tf32" else "0", "cudnn_conv_algo_search": "EXHAUSTIVE",
               "enable_cuda_graph": graph}
    start = time.perf_counter()  # its build: the session's creation and the first run (cuDNN's search, the capture)
    try:
        sess = ort.InferenceSession(blob, providers=[("CUDAExecutionProvider", options)])
    except Exception as err:  # noqa: BLE001 -- ORT's own error types; the bench goes on without its rows
        return f"ONNX Runtime could not load the {precision} model: {' '.join(str(err).split())[:200]}"
    if reference is None:
        reference = sess.run(None, feeds)
    binding = sess.io_binding()
    keep = []
    for k, v in feeds.items():
        value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), "cuda", 0)
        keep.append(value)
        binding.bind_ortvalue_input(k, value)
    outs = []
    for o, r in zip(sess.get_outputs(), reference):
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(r.shape), r.dtype, "cuda", 0)
        outs.append(value)
        binding.bind_ortvalue_output(o.name, value)

    def run(sess=sess, binding=binding):
        sess.run_with_iobinding(binding)

    run()  # with a CUDA graph, the first run captures it
    sync()
    return System(name, run, sync, lambda run=run, outs=outs, keep=keep: (run(), sync(), [o.numpy() for o in outs])[2],
                  time.perf_counter() - start)


def _cast_types_kept(model):
    """``model`` with each Cast to float32 whose output the fp16 converter retyped to float16 casting to float16:
    the converter retypes every float32 value, the outputs of the Casts to float32 that transformers' attention
    computes in too, but leaves their ``to``, and ONNX Runtime then refuses the model ("Type (tensor(float16)) of
    output arg (.../Cast_output_0) does not match expected type (tensor(float))"). The attention then runs in
    float16, as the rest of the converted model."""
    from onnx import TensorProto

    retyped = {vi.name for vi in model.graph.value_info
               if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == TensorProto.FLOAT16}
    for n in model.graph.node:
        if n.op_type == "Cast" and n.domain in ("", "ai.onnx") and n.output[0] in retyped:
            for a in n.attribute:
                if a.name == "to" and a.i == TensorProto.FLOAT:
                    a.i = TensorProto.FLOAT16
    return model
