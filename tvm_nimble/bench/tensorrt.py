"""TensorRT baseline for the benchmark: the same ONNX model through TensorRT's ONNX parser.

Only where ``tensorrt`` is importable (it cannot be installed on our machines, so this path has
not run here yet). fp32 builds clear TensorRT's TF32 flag, for parity with TVM and PyTorch;
float16 sets its FP16 flag and leaves the precision of each layer to TensorRT. Buffers and the
stream are plain CUDA allocations through ``cuda.bindings``, as in the executor.
"""
from __future__ import annotations

import weakref

import numpy as np

from tvm_nimble.runtime.cuda_graph import cuda_runtime, check


class TensorRTUnavailable(Exception):
    """TensorRT could not build this model here; the message says why (no number is reported)."""


class TensorRTEngine:
    """One built engine with device buffers bound to its inputs and outputs."""

    def __init__(self, onnx_model, feeds: dict[str, np.ndarray], dtype: str = "float32"):
        import tensorrt as trt

        rt = cuda_runtime()
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        major = int(trt.__version__.split(".")[0])
        flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(onnx_model.SerializeToString()):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise TensorRTUnavailable(f"TensorRT {trt.__version__} could not parse the model: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 30)
        if dtype == "float16":
            config.set_flag(trt.BuilderFlag.FP16)
        else:
            config.clear_flag(trt.BuilderFlag.TF32)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise TensorRTUnavailable(f"TensorRT {trt.__version__} could not build an engine for the model")
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
        self.context = self.engine.create_execution_context()
        self.stream = check(rt.cudaStreamCreate(), "cudaStreamCreate")
        self.outputs_ = {}  # name -> (shape, numpy dtype, device pointer)
        pointers = []
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            shape = tuple(self.context.get_tensor_shape(name))
            np_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            nbytes = int(np.prod(shape)) * np_dtype.itemsize
            ptr = check(rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc")
            pointers.append(ptr)
            self.context.set_tensor_address(name, int(ptr))
            if self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                if name not in feeds:
                    raise TensorRTUnavailable(f"TensorRT engine input {name!r} is not an input of the ONNX model")
                host = np.ascontiguousarray(feeds[name], dtype=np_dtype)
                check(rt.cudaMemcpy(ptr, host.ctypes.data, nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice),
                      "cudaMemcpy (input)")
            else:
                self.outputs_[name] = (shape, np_dtype, ptr)
        self.output_names = [o.name for o in onnx_model.graph.output]
        self._free = weakref.finalize(self, _release, pointers, self.stream)

    def run(self):
        if not self.context.execute_async_v3(int(self.stream)):
            raise RuntimeError("TensorRT execute_async_v3 failed")

    def sync(self):
        check(cuda_runtime().cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def outputs(self) -> list[np.ndarray]:
        rt = cuda_runtime()
        self.run()
        self.sync()
        result = []
        for name in self.output_names:
            shape, np_dtype, ptr = self.outputs_[name]
            host = np.empty(shape, np_dtype)
            check(rt.cudaMemcpy(host.ctypes.data, ptr, host.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost),
                  "cudaMemcpy (output)")
            result.append(host.astype(np.float32))
        return result


def _release(pointers, stream):
    rt = cuda_runtime()
    for p in pointers:
        rt.cudaFree(p)
    rt.cudaStreamDestroy(stream)
