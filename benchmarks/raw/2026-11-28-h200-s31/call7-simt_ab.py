"""A/B of the SIMT GEMM's device code: every candidate's microseconds on ViT-S's Linears, act 0 and 3.
Run from a variant tree on PYTHONPATH: python3 simt_ab.py build|time LABEL"""
import sys

mode, label = sys.argv[1], sys.argv[2]
from tvm_nimble.codegen.vendor_build import build_vendor_library

lib = build_vendor_library("sm_90", kernels=["nimble.gemm."])
if mode == "build":
    print(label, lib)
    raise SystemExit
import torch
import tvm_ffi

from tvm_nimble.contract import vendor_abi
from tvm_nimble.runtime.vendor import load_vendor_library

load_vendor_library(lib)
f = {n: tvm_ffi.get_global_func(n) for n in (vendor_abi.GEMM_MATMUL_TIMINGS, vendor_abi.GEMM_CANDIDATES)}
dev = tvm_ffi.device("cuda", 0)
stream = torch.cuda.current_stream().cuda_stream
t = tvm_ffi.from_dlpack
ws1 = torch.empty(1, dtype=torch.uint8, device="cuda")
gen = torch.Generator(device="cuda").manual_seed(0)
for name, M, N, K in [("qkv", 197, 1152, 384), ("proj", 197, 384, 384), ("fc1", 197, 1536, 384),
                      ("fc2", 197, 384, 1536)]:
    a = torch.randn(1, M, K, device="cuda", generator=gen)
    w = torch.randn(K, N, device="cuda", generator=gen) * K ** -0.5
    b = torch.randn(N, device="cuda", generator=gen)
    y = torch.empty(1, M, N, device="cuda")
    names = list(f[vendor_abi.GEMM_CANDIDATES](M, N, K, True))
    for act in (0, 3):
        with tvm_ffi.use_raw_stream(dev, stream):
            runs = [list(f[vendor_abi.GEMM_MATMUL_TIMINGS](t(a), t(w), t(b), tvm_ffi.Shape([act]), t(y), t(ws1), 200))
                    for _ in range(5)]
        med = [sorted(r[i] for r in runs)[2] for i in range(len(names))]
        best = min(range(len(names)), key=med.__getitem__)
        print(f"{label} {name:4s} act{act} best {med[best]:6.2f} us ({names[best]}) all "
              + " ".join(f"{n}={m:.2f}" for n, m in zip(names, med)), flush=True)
