"""The kernel providers (see :mod:`.registry`). Each import below registers one; the order in which
they claim an operator that several accept is :data:`.registry.PRIORITY`, not the order of these imports."""
from .registry import TVM, Provider, get, names, offloading, provider_of, register, registered  # noqa: F401

from . import attention  # noqa: E402,F401
from . import cublaslt  # noqa: E402,F401
from . import cudnn  # noqa: E402,F401
from . import cudnn_grad  # noqa: E402,F401
from . import cudnn_graph  # noqa: E402,F401
from . import depthwise  # noqa: E402,F401
from . import gemv  # noqa: E402,F401
from . import norm  # noqa: E402,F401
from . import simt_gemm  # noqa: E402,F401
from . import tf32x3  # noqa: E402,F401
from . import tvm_kernels  # noqa: E402,F401
