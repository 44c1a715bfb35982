"""The vendor extension's ABI: the name of every global function ``codegen/vendor`` registers, spelled once.

The passes emit calls of these functions (``relay_passes/providers``), the plan launches them, the runtime
resolves them in the loaded extension (``tvm_nimble.runtime.vendor``), and the CUDA sources register them
(``Register(name, ...)`` in ``codegen/vendor/*.cu``; ``tests/test_layering.py`` checks that the two sets are
equal). Each function is ``nimble.<library>.<op>``; a library's *kernels* are the destination-passing calls a
plan launches, its *utilities* the functions called from Python (cuDNN's heuristics, the GEMM timings,
versions), never launched.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

#: The namespace of every global function and marker tvm-nimble defines.
ROOT = "nimble."


@dataclass(frozen=True)
class VendorLibrary:
    """One library of the vendor extension: its functions are ``nimble.<name>.<op>``."""

    name: str
    kernels: tuple[str, ...] = ()  # launched by a plan
    utilities: tuple[str, ...] = ()  # called from Python only

    def __post_init__(self):
        stray = [f for f in self.functions if not f.startswith(self.prefix)]
        if stray:
            raise ValueError(f"vendor functions {stray} are not in library {self.prefix!r}")

    @property
    def prefix(self) -> str:
        return f"{ROOT}{self.name}."

    @property
    def functions(self) -> tuple[str, ...]:
        return self.kernels + self.utilities


def family(*names: str) -> str:
    """The longest prefix ``names`` share: the ``kernel_prefix`` of a provider that emits exactly them."""
    return os.path.commonprefix(list(names))


# ---- cuDNN, legacy API (codegen/vendor/nimble_vendor.cpp) -------------------------------------------------
CUDNN_CONV2D = "nimble.cudnn.conv2d"
CUDNN_CONV2D_ADD = "nimble.cudnn.conv2d_add"
CUDNN_CONV2D_BWD_DATA = "nimble.cudnn.conv2d_bwd_data"
CUDNN_CONV2D_BWD_FILTER = "nimble.cudnn.conv2d_bwd_filter"
CUDNN_CONV2D_ALGOS = "nimble.cudnn.conv2d_algos"
CUDNN = VendorLibrary("cudnn", kernels=(CUDNN_CONV2D, CUDNN_CONV2D_ADD, CUDNN_CONV2D_BWD_DATA, CUDNN_CONV2D_BWD_FILTER),
                      utilities=(CUDNN_CONV2D_ALGOS,))

# ---- cuDNN, graph API (codegen/vendor/cudnn_conv_graph.cpp) ------------------------------------------------
CUDNN_GRAPH_CONV2D = "nimble.cudnn_graph.conv2d"
CUDNN_GRAPH_CONV2D_ADD = "nimble.cudnn_graph.conv2d_add"
CUDNN_GRAPH = VendorLibrary("cudnn_graph", kernels=(CUDNN_GRAPH_CONV2D, CUDNN_GRAPH_CONV2D_ADD))

# ---- cuBLASLt (codegen/vendor/nimble_vendor.cpp) -----------------------------------------------------------
CUBLAS_MATMUL = "nimble.cublas.matmul"
CUBLAS_MATMUL_ADD = "nimble.cublas.matmul_add"
CUBLAS_BATCHED_MATMUL = "nimble.cublas.batched_matmul"
CUBLAS_MATMUL_TIMINGS = "nimble.cublas.matmul_timings"
CUBLAS_MATMUL_ADD_TIMINGS = "nimble.cublas.matmul_add_timings"
CUBLAS_BATCHED_MATMUL_TIMINGS = "nimble.cublas.batched_matmul_timings"
# the same GEMMs under the names of provider tf32x3 (three TF32 products in one call: relay_passes/providers/tf32x3.py)
CUBLAS_TF32X3_MATMUL = "nimble.cublas.tf32x3_matmul"
CUBLAS_TF32X3_MATMUL_ADD = "nimble.cublas.tf32x3_matmul_add"
CUBLAS = VendorLibrary("cublas", kernels=(CUBLAS_MATMUL, CUBLAS_MATMUL_ADD, CUBLAS_BATCHED_MATMUL, CUBLAS_TF32X3_MATMUL,
                                          CUBLAS_TF32X3_MATMUL_ADD),
                       utilities=(CUBLAS_MATMUL_TIMINGS, CUBLAS_MATMUL_ADD_TIMINGS, CUBLAS_BATCHED_MATMUL_TIMINGS))

# ---- our SIMT GEMM (codegen/vendor/gemm_simt.cu) ----------------------------------------------------------
GEMM_MATMUL = "nimble.gemm.matmul"
GEMM_MATMUL_ADD = "nimble.gemm.matmul_add"
GEMM_MATMUL_TIMINGS = "nimble.gemm.matmul_timings"
GEMM_MATMUL_ADD_TIMINGS = "nimble.gemm.matmul_add_timings"
GEMM_CANDIDATES = "nimble.gemm.candidates"
GEMM = VendorLibrary("gemm", kernels=(GEMM_MATMUL, GEMM_MATMUL_ADD),
                     utilities=(GEMM_MATMUL_TIMINGS, GEMM_MATMUL_ADD_TIMINGS, GEMM_CANDIDATES))

# ---- our GEMV for a decode step's few rows (codegen/vendor/gemv.cu) ---------------------------------------
GEMV_MATMUL = "nimble.gemv.matmul"
GEMV_MATMUL_ADD = "nimble.gemv.matmul_add"
GEMV_NORM_MATMUL = "nimble.gemv.norm_matmul"
GEMV_NORM_MATMUL_ADD = "nimble.gemv.norm_matmul_add"
GEMV_GLU_MATMUL = "nimble.gemv.glu_matmul"
GEMV_GLU_NORM_MATMUL = "nimble.gemv.glu_norm_matmul"
GEMV = VendorLibrary("gemv", kernels=(GEMV_MATMUL, GEMV_MATMUL_ADD, GEMV_NORM_MATMUL,
                                     GEMV_NORM_MATMUL_ADD, GEMV_GLU_MATMUL, GEMV_GLU_NORM_MATMUL))

# ---- fused attention (codegen/vendor/attention*.cu, cudnn_attention.cpp) ----------------------------------
ATTENTION_SDPA = "nimble.attention.sdpa"
ATTENTION_SDPA_BIAS = "nimble.attention.sdpa_bias"
ATTENTION_CUDNN_SDPA = "nimble.attention.cudnn_sdpa"
#: cuDNN's SDPA with a mask (the bias, after the scale) and grouped K/V heads: (q, k, v, bias, attrs, y, workspace)
ATTENTION_CUDNN_BIAS_SDPA = "nimble.attention.cudnn_bias_sdpa"
#: the same with cuDNN's causal mask on top (key j > query i masked: a mask that masks them already, cuDNN skipping
#: those tiles), same arguments
ATTENTION_CUDNN_BIAS_CAUSAL_SDPA = "nimble.attention.cudnn_bias_causal_sdpa"
#: cuDNN's SDPA with its causal mask as part of the call and a padding mask of keys alone (one row broadcast over the
#: query rows: mask stride 0 along them), a decoder's causal + padding mask split in two, same arguments
ATTENTION_CUDNN_KEY_CAUSAL_SDPA = "nimble.attention.cudnn_key_causal_sdpa"
ATTENTION_SPLIT_SDPA = "nimble.attention.split_sdpa"
ATTENTION_SPLIT_SDPA_BIAS = "nimble.attention.split_sdpa_bias"
ATTENTION_TILE_SDPA = "nimble.attention.tile_sdpa"
ATTENTION_TILE_SDPA_BIAS = "nimble.attention.tile_sdpa_bias"
ATTENTION_CLUSTER_SDPA = "nimble.attention.cluster_sdpa"
ATTENTION_CLUSTER_SDPA_BIAS = "nimble.attention.cluster_sdpa_bias"
#: a decode step's KV cache write and its attention: (q, k_cache, v_cache, bias, k_new, v_new, positions, attrs, y,
#: workspace), the caches written in place (:data:`IN_PLACE`)
ATTENTION_APPEND_SDPA_BIAS = "nimble.attention.append_sdpa_bias"
#: the same with the rotary embedding of q and the new key first: (q, k_cache, v_cache, bias, k_new, v_new, positions,
#: cos, sin, attrs, y, workspace)
ATTENTION_APPEND_ROPE_SDPA_BIAS = "nimble.attention.append_rope_sdpa_bias"
ATTENTION = VendorLibrary("attention", kernels=(
    ATTENTION_SDPA, ATTENTION_SDPA_BIAS, ATTENTION_CUDNN_SDPA, ATTENTION_CUDNN_BIAS_SDPA,
    ATTENTION_CUDNN_BIAS_CAUSAL_SDPA, ATTENTION_CUDNN_KEY_CAUSAL_SDPA, ATTENTION_SPLIT_SDPA,
    ATTENTION_SPLIT_SDPA_BIAS, ATTENTION_TILE_SDPA, ATTENTION_TILE_SDPA_BIAS, ATTENTION_CLUSTER_SDPA,
    ATTENTION_CLUSTER_SDPA_BIAS, ATTENTION_APPEND_SDPA_BIAS, ATTENTION_APPEND_ROPE_SDPA_BIAS))

# ---- LayerNorm (codegen/vendor/layer_norm.cu) -------------------------------------------------------------
NORM_LAYER_NORM = "nimble.norm.layer_norm"
NORM = VendorLibrary("norm", kernels=(NORM_LAYER_NORM,))

# ---- depthwise convolutions and pools (codegen/vendor/depthwise.cu) ---------------------------------------
DEPTHWISE_CONV2D = "nimble.depthwise.conv2d"
DEPTHWISE_CONV2D_ADD = "nimble.depthwise.conv2d_add"
DEPTHWISE_POOL2D = "nimble.depthwise.pool2d"
DEPTHWISE_POOL2D_ADD = "nimble.depthwise.pool2d_add"
DEPTHWISE = VendorLibrary("depthwise", kernels=(DEPTHWISE_CONV2D, DEPTHWISE_CONV2D_ADD, DEPTHWISE_POOL2D,
                                                DEPTHWISE_POOL2D_ADD))

# ---- the extension itself (codegen/vendor/nimble_vendor.cpp) -----------------------------------------------
VENDOR_VERSIONS = "nimble.vendor.versions"
VENDOR_PLANS = "nimble.vendor.plans"
VENDOR = VendorLibrary("vendor", utilities=(VENDOR_VERSIONS, VENDOR_PLANS))

#: Every library of the extension.
LIBRARIES = (CUDNN, CUDNN_GRAPH, CUBLAS, GEMM, GEMV, ATTENTION, NORM, DEPTHWISE, VENDOR)
#: Every global function the extension registers (the runtime checks each one after loading it).
FUNCTIONS = tuple(f for lib in LIBRARIES for f in lib.functions)
#: Every function a plan may launch.
KERNELS = tuple(f for lib in LIBRARIES for f in lib.kernels)
#: A plan launch whose kernel starts with one of these is served by the vendor extension, not the kernel library.
VENDOR_PREFIXES = tuple(lib.prefix for lib in LIBRARIES if lib.kernels)
#: The kernels that write some of their tensor arguments in place (the indices among the call's tensors, its
#: destination and workspace last): what they write is state, which outlives a run (a decode step's KV cache)
IN_PLACE = {ATTENTION_APPEND_SDPA_BIAS: (1, 2), ATTENTION_APPEND_ROPE_SDPA_BIAS: (1, 2)}
assert set(IN_PLACE) <= set(KERNELS)

#: the symbol under which a built vendor library lists the functions it registers (newline-separated)
MANIFEST_SYMBOL = "nimble_vendor_functions"
