"""The kernel providers (see :mod:`.registry`). Each import below registers one; the order is the
order in which they claim an operator that several accept."""
from .registry import TVM, Provider, get, names, offloading, provider_of, register, registered  # noqa: F401

from . import tvm_kernels  # noqa: E402,F401  TVM's own kernels: everything no one else took
from . import cudnn  # noqa: E402,F401  convolutions, average pools
from . import cudnn_grad  # noqa: E402,F401  a convolution's gradients (training; only when named)
from . import cudnn_graph  # noqa: E402,F401  convolutions through cuDNN's graph API (after cudnn: "vendor" keeps it)
from . import depthwise  # noqa: E402,F401  our depthwise convolutions and pools (after cuDNN: "vendor" keeps it)
from . import attention  # noqa: E402,F401  fused attention (claims Q·Kᵀ before the GEMMs do)
from . import cublaslt  # noqa: E402,F401  GEMMs
from . import simt_gemm  # noqa: E402,F401  our fp32 GEMM for small M (after cuBLASLt: "vendor" keeps cuBLASLt)
from . import norm  # noqa: E402,F401  LayerNorm
