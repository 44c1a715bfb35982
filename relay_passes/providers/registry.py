"""Kernel providers: who can run an operator, registered by name.

A provider is one module of this package that builds a :class:`Provider` and calls :func:`register`
at import (``providers/__init__.py`` imports each one: one line per provider); its place among the others
is its place in :data:`PRIORITY`. It declares
- which Relax operators anchor its patterns (``matchers``: op name -> matcher), for which compute
  dtypes (``dtypes``, see :mod:`..precision`) and layouts, on which target kinds; or a ``rewrite`` of the
  offloaded module (calls other providers made, fused: ``attention_append``);
- how it is lowered to a launch of the plan: a matcher replaces a chain of bindings with one
  destination-passing ``call_dps_packed`` of a global function named ``kernel_prefix + op``, which
  the plan takes as a launch like any TIR kernel (:mod:`..vendor_offload` does the rewriting);
- where the runtime finds that function (``runtime_library``: ``"vendor"`` is the cuDNN/cuBLASLt
  extension, ``codegen/vendor``, whose functions the runtime resolves by the prefixes in
  ``tvm_nimble.contract.vendor_abi.VENDOR_PREFIXES``).

TVM's own kernels are the provider ``tvm``: it takes every operator no other provider took, with no
rewriting. ``kernels="best"`` (``compiler.kernel_choice``) measures every provider that accepts an
operator against TVM's kernel and keeps the fastest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

#: the provider that runs whatever no other provider took
TVM = "tvm"

#: The order in which the providers claim an operator several of them accept (``kernels="vendor"`` keeps the first;
#: ``"best"`` breaks ties of measured time by it), and in which they are listed. Every provider has its place here:
#: :func:`register` refuses a name this list does not hold, so the order never follows the import order.
PRIORITY = (
    TVM,  # TVM's own kernels: everything no one else took
    "cudnn",  # convolutions, average pools
    "cudnn_grad",  # a convolution's gradients (training; only when named)
    "cudnn_graph",  # convolutions through cuDNN's graph API (after cudnn: "vendor" keeps cudnn)
    "depthwise",  # our depthwise convolutions and pools (after cuDNN: "vendor" keeps cuDNN)
    "cudnn_sdpa",  # cuDNN's fused attention, fp16/bf16 (before ours: "vendor" gives it those chains)
    "cudnn_bias_sdpa",  # the same with a mask or grouped K/V heads (more than one query row; before ours too)
    "attention",  # our fused attention (claims Q·Kᵀ before the GEMMs do)
    "attention_split",  # our other attention kernels, one more candidate each for "best"
    "attention_tile",
    "attention_cluster",
    "attention_append",  # a decode step's KV cache write inside its attention call (after the offload, no matcher)
    "attention_rope",  # and the rotary embedding of its q and new key (after attention_append)
    "cudnn_key_mask",  # a decoder's padding mask as one row of keys, cuDNN's causal mask part of the call (rewrite)
    # a decode step's few rows (16-bit, at most 8 rows), before cuBLASLt: what kernels="best" chose for them on every
    # decode step measured (benchmarks/findings.md, 'A decode step's Linears on our GEMV in kernels="vendor"')
    "gemv_glu",  # a gated MLP's gate/up projection and its SiLU gate, the norm before it in its prologue (one row)
    "gemv_norm",  # our GEMV with the LayerNorm/RMSNorm before it in its prologue (one row; not an LM head's width)
    "gemv",  # our 16-bit GEMV
    "cublaslt",  # GEMMs
    "simt_gemm",  # our fp32 GEMM for small M (after cuBLASLt: "vendor" keeps cuBLASLt)
    "tf32x3",  # a float32 GEMM as three TF32 products in one cuBLASLt call (only when named)
    "layer_norm",  # LayerNorm
)


@dataclass(frozen=True)
class Provider:
    name: str  # as users spell it: BuildOptions(providers=("cudnn",)), --providers cudnn
    title: str  # as messages spell it, e.g. "cuDNN"
    kernel_prefix: str | None  # the global functions it emits (None: TVM's own kernels, nothing emitted)
    matchers: dict[str, Callable] = field(default_factory=dict)  # Relax op name -> matcher (see vendor_offload)
    dtypes: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ()
    targets: tuple[str, ...] = ("cuda",)  # target kinds it runs on
    runtime_library: str | None = "vendor"  # which runtime library serves ``kernel_prefix``
    by_default: bool = True  # among the providers a build uses when the options name none
    # a module pass run after the offload, on the calls the providers made (a provider that fuses two of them);
    # in place of matchers, or besides them
    rewrite: Callable | None = None


    def owns(self, kernel: str) -> bool:
        """Whether a plan launch of ``kernel`` is one of this provider's calls."""
        return self.kernel_prefix is not None and kernel.startswith(self.kernel_prefix)


_REGISTRY: dict[str, Provider] = {}


def register(provider: Provider) -> Provider:
    if provider.name not in PRIORITY:
        raise ValueError(f"kernel provider {provider.name!r} has no place in registry.PRIORITY: add it there")
    if provider.name in _REGISTRY and _REGISTRY[provider.name] != provider:
        raise ValueError(f"a kernel provider named {provider.name!r} is registered already")
    _REGISTRY[provider.name] = provider
    return provider


def registered() -> list[Provider]:
    """Every provider, in :data:`PRIORITY` order (the order in which they claim an operator)."""
    return sorted(_REGISTRY.values(), key=lambda p: PRIORITY.index(p.name))


def names() -> tuple[str, ...]:
    return tuple(p.name for p in registered())


def get(name: str) -> Provider:
    return _REGISTRY[name]


def offloading(target_kind: str, only: tuple[str, ...] | None = None) -> list[Provider]:
    """The providers other than TVM that run on ``target_kind`` (those named in ``only``, when given; else
    those used by default), in :data:`PRIORITY` order."""
    return [p for p in registered() if p.name != TVM and target_kind in p.targets
            and (p.name in only if only is not None else p.by_default)]


def provider_of(kernel: str) -> Provider:
    """The provider whose call a plan launch of ``kernel`` is (TVM for a TIR kernel): of those whose prefix it
    has, the one with the longest (cudnn_grad's "nimble.cudnn.conv2d_bwd_" within cudnn's "nimble.cudnn.")."""
    owners = [p for p in registered() if p.owns(kernel)]
    return max(owners, key=lambda p: len(p.kernel_prefix)) if owners else _REGISTRY[TVM]
