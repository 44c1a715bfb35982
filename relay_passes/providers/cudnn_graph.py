"""cuDNN's convolutions through the cuDNN frontend's graph API (codegen/vendor/cudnn_conv_graph.cpp).

    conv2d(x, W) [+ bias] [+ residual] [-> relu | clip(0, 6)]     (NCHW / OIHW or NHWC / OHWI, symmetric padding, groups 1)

the chains of :mod:`.cudnn` but for grouped convolutions.
Why a second cuDNN provider: the legacy API's algorithm list misses cuDNN 9's faster engines, so TF32
convolutions ran at their fp32 speed through it, where PyTorch's, chosen by the same engine heuristics as
here, got tensor-core kernels (see benchmarks/findings.md, 'Our fp32 GEMM for transformers, build times,
precision rows of the chains').
Registered after :mod:`.cudnn`, so ``kernels="vendor"`` keeps the legacy calls; ``kernels="best"`` measures
both per operator. Only in TF32 and half-precision builds: exact fp32 runs FMA kernels, where the legacy list
has what the engines have, and a provider that takes nothing costs the kernel choice no probe build.
"""
from __future__ import annotations

from tvm_nimble.contract import vendor_abi

from ..precision import DTYPES, REDUCED_DTYPES, compute_dtype
from .cudnn import conv_chain
from .registry import Provider, register

CONV2D = vendor_abi.CUDNN_GRAPH_CONV2D
CONV2D_ADD = vendor_abi.CUDNN_GRAPH_CONV2D_ADD


def graph_conv_chain(ctx, chains, var, call):
    if not ctx.allow_tf32 and compute_dtype(call) not in REDUCED_DTYPES:
        return None  # no note: exact fp32 is the legacy provider's, whose report says why where it declines
    return conv_chain(ctx, chains, var, call, conv=CONV2D, conv_add=CONV2D_ADD, groups=False)


PROVIDER = register(Provider(
    name="cudnn_graph", title="cuDNN (graph API)", kernel_prefix=vendor_abi.CUDNN_GRAPH.prefix,
    matchers={"relax.nn.conv2d": graph_conv_chain},
    dtypes=DTYPES, layouts=("NCHW/OIHW", "NHWC/OHWI")))
