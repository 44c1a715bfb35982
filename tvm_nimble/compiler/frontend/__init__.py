"""ONNX in, Relax out: loading and up-front checks (``onnx_import``), static shape folding (``fold_shapes``)."""
from .onnx_import import (OnnxFileNotFoundError, from_onnx, load_onnx_model, max_supported_opset,  # noqa: F401
                          supported_operators, unsupported_operators)
from .fold_shapes import fold_static_shapes  # noqa: F401
