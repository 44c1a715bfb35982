"""Experiment: cuBLASLt's algorithm candidates for the GEMMs of transformers at batch 1, each timed,
against PyTorch's own GEMM on the same operands.

Why: in a kernel profile of timm vit_small_patch16_224, nimble.cublas.matmul took over half the kernel
time: the heuristic's first algorithm, at M = 197, leaves most of the 132 SMs idle (see
benchmarks/findings.md, 'Fused attention, where a ViT's time goes'). This times every
candidate the heuristic lists (``nimble.cublas.matmul_timings``: the index the build can bake into
the attrs) beside ``torch.nn.functional.linear`` / ``torch.matmul``.

    bash scripts/gpu_session.sh "experiment gemm_algos 120"
    bash scripts/gpu_session.sh "experiment gemm_algos 120 --cases llama-0.5b@512 --dtypes float16,bfloat16"

``--cases llama-0.5b@512``: the Linear layers of the 0.5B decoder (``hf:llama-0.5b``) at 512 tokens instead (Q/K/V
merged, the output projection, gate/up merged, the down projection, the tied LM head; no batched GEMMs: cuDNN's
attention takes those).

Writes DIR/gemm_algos.json and prints one line per case: PyTorch us, the heuristic's first us, the
fastest candidate (index, us) and the number of candidates.
"""
from __future__ import annotations

import json
import os

import gpu_args  # the shared command line, beside this script in scripts/experiments/

# (name, M, N, K): the Linear layers of ViT-S/16 and ViT-B/16 at 197 tokens and BERT-base at 128
LINEARS = [
    ("vits_qkv", 197, 1152, 384), ("vits_proj", 197, 384, 384), ("vits_fc1", 197, 1536, 384),
    ("vits_fc2", 197, 384, 1536), ("vitb_qkv", 197, 2304, 768), ("vitb_proj", 197, 768, 768),
    ("vitb_fc1", 197, 3072, 768), ("vitb_fc2", 197, 768, 3072), ("bert_qkv", 128, 768, 768),
    ("bert_fc1", 128, 3072, 768), ("bert_fc2", 128, 768, 3072),
]
# (name, batch, M, N, K, transpose_b): attention's Q @ K^T and P @ V
BATCHED = [
    ("vits_qk", 6, 197, 197, 64, 1), ("vits_pv", 6, 197, 64, 197, 0),
    ("vitb_qk", 12, 197, 197, 64, 1), ("vitb_pv", 12, 197, 64, 197, 0),
    ("bert_qk", 12, 128, 128, 64, 1), ("bert_pv", 12, 128, 64, 128, 0),
]
#: --cases llama-0.5b@512: (name, M, N, K) of the 0.5B decoder's Linears at 512 tokens (hidden 896, 14 query and 2
#: KV heads of 64, MLP 4864, vocabulary 151,936)
LLAMA_512 = [
    ("qkv", 512, 1152, 896), ("o_proj", 512, 896, 896), ("gate_up", 512, 9728, 896), ("down", 512, 896, 4864),
    ("lm_head", 512, 151936, 896),
]


def _arguments(ap) -> None:
    ap.add_argument("--cases", default="transformers", choices=["transformers", "llama-0.5b@512"],
                    help="the GEMMs: ViT/BERT's at batch 1 (and their attention's batched ones), or the 0.5B decoder's")
    ap.add_argument("--dtypes", default="float32,float16", help="comma-separated torch dtypes")


def main(argv=None) -> int:
    args = gpu_args.parse_kernel_bench(__doc__, argv, "out/gemm_algos", _arguments)
    import torch
    import tvm_ffi

    from tvm_nimble.contract import vendor_abi

    mm_t = tvm_ffi.get_global_func(vendor_abi.CUBLAS_MATMUL_TIMINGS)
    bmm_t = tvm_ffi.get_global_func(vendor_abi.CUBLAS_BATCHED_MATMUL_TIMINGS)
    dev = tvm_ffi.device("cuda", 0)
    stream = torch.cuda.current_stream().cuda_stream
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # the offload's GEMM workspace
    t = tvm_ffi.from_dlpack

    rows = []
    linears, batched = (LINEARS, BATCHED) if args.cases == "transformers" else (LLAMA_512, [])
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        dname = str(dtype).split(".")[-1]
        for name, M, N, K in linears:
            a = torch.randn(1, M, K, device="cuda", dtype=dtype)
            w = torch.randn(K, N, device="cuda", dtype=dtype) * K ** -0.5  # [K, N]: the ONNX exports' layout
            b = torch.randn(N, device="cuda", dtype=dtype)
            y = torch.empty(1, M, N, device="cuda", dtype=dtype)
            with tvm_ffi.use_raw_stream(dev, stream):
                us = list(mm_t(t(a), t(w), t(b), tvm_ffi.Shape([0, 0, 0]), t(y), t(ws), args.reps))
            ref = gpu_args.back_to_back_us(lambda: torch.nn.functional.linear(a, w.t(), b), args.reps)
            # PyTorch's cuBLAS GEMM (no bias) as a CUDA graph of 20 calls: its GPU time, the floor to reach
            graph_mm = gpu_args.graph_us(lambda: torch.matmul(a, w, out=y))
            rows.append({"case": name, "dtype": dname, "torch_us": ref, "torch_mm_graph_us": graph_mm,
                         "candidates_us": us})
        for name, B, M, N, K, tb in batched:
            a = torch.randn(B, M, K, device="cuda", dtype=dtype)
            bm = torch.randn(B, N, K, device="cuda", dtype=dtype) if tb else torch.randn(B, K, N, device="cuda",
                                                                                         dtype=dtype)
            y = torch.empty(B, M, N, device="cuda", dtype=dtype)
            with tvm_ffi.use_raw_stream(dev, stream):
                us = list(bmm_t(t(a), t(bm), tvm_ffi.Shape([tb, 0]), t(y), t(ws), args.reps))
            ref = gpu_args.back_to_back_us(lambda: torch.matmul(a, bm.transpose(-1, -2) if tb else bm), args.reps)
            rows.append({"case": name, "dtype": dname, "torch_us": ref, "candidates_us": us})
    with open(os.path.join(args.out, "gemm_algos.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    print(f"{'case':12} {'dtype':8} {'torch us':>9} {'mm graph':>9} {'first us':>9} {'best us':>8} {'best':>5} {'n':>3}")
    for r in rows:
        c = r["candidates_us"]
        best = min(range(len(c)), key=c.__getitem__) if c else -1
        print(f"{r['case']:12} {r['dtype']:8} {r['torch_us']:9.2f} {r.get('torch_mm_graph_us', float('nan')):9.2f} "
              f"{c[0] if c else float('nan'):9.2f} {c[best] if c else float('nan'):8.2f} {best:5d} {len(c):3d}")
    first = sum(r["candidates_us"][0] for r in rows)
    best = sum(min(r["candidates_us"]) for r in rows)
    print(f"sum over cases: torch {sum(r['torch_us'] for r in rows):.1f} us, first {first:.1f}, best {best:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
