"""TVM's own kernels: every operator no other provider took, legalized, fused and scheduled by TVM
(DLight's default schedules, or tuned ones from a MetaSchedule database). Nothing is rewritten."""
from __future__ import annotations

from ..precision import DTYPES
from .registry import TVM, Provider, register

PROVIDER = register(Provider(name=TVM, title="TVM", kernel_prefix=None, dtypes=DTYPES,
                             targets=("cuda", "llvm"), runtime_library=None))
