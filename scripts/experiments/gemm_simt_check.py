"""Experiment: our fp32 GEMM (codegen/vendor/gemm_simt.cu, provider simt_gemm), every candidate checked
against float64, then timed beside cuBLASLt's candidates and PyTorch's cuBLAS on the transformers' Linears.

Why: at batch 1 a ViT's GEMMs have M = 197 rows, and cuBLAS's fp32 kernels leave most of the H100's 132 SMs
idle, far below the FMA peak (see benchmarks/findings.md, 'Fused attention, where a ViT's time goes'). ViT-S's
GEMMs are ~80% of its fp32 time, so they decide #30's fp32 rows.

    bash scripts/gpu_session.sh "experiment gemm_simt_check 120"

Correctness: every candidate, on the transformer shapes and on edge shapes (one row, M not a multiple of the
tile, K shorter than a stage, N = 4), identity and GELU, the residual form (also in place, z = y), and the
call without an index (measured on its first call); relative L2 against float64 <= 1e-5 (PyTorch's fp32
is listed beside). Timing: microseconds per call (``nimble.gemm.matmul_timings``, back to back behind a
spin kernel) of our fastest candidate, cuBLASLt's fastest (``nimble.cublas.matmul_timings``, our call of
it: bias in its epilogue or our kernel) and PyTorch's ``F.linear`` as a CUDA graph of 20 calls.
Writes DIR/gemm_simt_check.json; prints one line per shape.
"""
from __future__ import annotations

import json
import os

import gpu_args  # the shared command line, beside this script in scripts/experiments/
from gemm_algos import LINEARS  # (name, M, N, K): the Linears of ViT-S/16, ViT-B/16 (197 tokens), BERT-base (128)
EDGES = [("one_row", 1, 1000, 1280), ("odd_m", 5, 68, 36), ("short_k", 70, 132, 8), ("n4", 33, 4, 100),
         ("k_not_16", 197, 96, 20)]
TOL = 1e-5


def main(argv=None) -> int:
    args = gpu_args.parse_kernel_bench(__doc__, argv, "out/gemm_simt_check")
    import torch
    import tvm_ffi

    from tvm_nimble.contract import vendor_abi

    f = {n: tvm_ffi.get_global_func(n) for n in (vendor_abi.GEMM_MATMUL, vendor_abi.GEMM_MATMUL_ADD,
                                                  vendor_abi.GEMM_MATMUL_TIMINGS, vendor_abi.GEMM_CANDIDATES,
                                                  vendor_abi.CUBLAS_MATMUL_TIMINGS)}
    dev = tvm_ffi.device("cuda", 0)
    stream = torch.cuda.current_stream().cuda_stream
    t = tvm_ffi.from_dlpack
    ws1 = torch.empty(1, dtype=torch.uint8, device="cuda")
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", generator=gen) * scale

    def rel(out, ref):
        return float((out.double() - ref).norm() / ref.norm())

    def gelu(r):
        return 0.5 * r * (1 + (r / 2 ** 0.5).erf())

    cases, rows = [], []
    major = torch.cuda.get_device_capability(0)[0]
    for name, M, N, K in LINEARS + EDGES:
        a, w, b = randn(1, M, K), randn(K, N, scale=K ** -0.5), randn(N, scale=0.5)
        z = randn(1, M, N)
        plain = a.double() @ w.double() + b.double()
        names = list(f[vendor_abi.GEMM_CANDIDATES](M, N, K, major >= 9))
        with tvm_ffi.use_raw_stream(dev, stream):
            for idx in [None] + list(range(len(names))):
                cand = "auto" if idx is None else names[idx]

                def check(op, run, out, ref, act=0):
                    try:
                        run()
                        torch.cuda.synchronize()
                        cases.append({"case": name, "op": op, "candidate": cand, "act": act, "rel_l2": rel(out, ref)})
                    except Exception as e:  # noqa: BLE001 - recorded as a failed case
                        cases.append({"case": name, "op": op, "candidate": cand, "act": act, "rel_l2": float("inf"),
                                      "error": str(e).strip().splitlines()[-1][:300]})

                for act in (0, 3):
                    y = torch.full((1, M, N), float("nan"), device="cuda")
                    attrs = tvm_ffi.Shape([act] if idx is None else [act, idx])
                    check("matmul", lambda: f[vendor_abi.GEMM_MATMUL](t(a), t(w), t(b), attrs, t(y), t(ws1)), y,
                          gelu(plain) if act else plain, act)
                y = torch.full((1, M, N), float("nan"), device="cuda")
                attrs = tvm_ffi.Shape([0] if idx is None else [0, idx])
                check("matmul_add", lambda: f[vendor_abi.GEMM_MATMUL_ADD](t(a), t(w), t(b), t(z), attrs, t(y), t(ws1)), y,
                      plain + z.double())
                inplace = z.clone()
                check("matmul_add z=y", lambda: f[vendor_abi.GEMM_MATMUL_ADD](t(a), t(w), t(b), t(inplace), attrs,
                                                                             t(inplace), t(ws1)),
                      inplace, plain + z.double())
            torch_rel = rel(torch.nn.functional.linear(a, w.t(), b), plain)
            if (name, M, N, K) not in LINEARS:
                continue
            ours = list(f[vendor_abi.GEMM_MATMUL_TIMINGS](t(a), t(w), t(b), tvm_ffi.Shape([0]), t(y), t(ws1), args.reps))
            theirs = list(f[vendor_abi.CUBLAS_MATMUL_TIMINGS](t(a), t(w), t(b), tvm_ffi.Shape([0, 0, 0]), t(y), t(ws),
                                                            args.reps))
        torch_graph = gpu_args.graph_us(lambda: torch.nn.functional.linear(a, w.t(), b))
        best = min(range(len(ours)), key=ours.__getitem__)
        rows.append({"case": name, "M": M, "N": N, "K": K, "ours_us": ours, "candidates": names,
                     "ours_best": names[best], "ours_best_us": ours[best], "cublaslt_us": theirs,
                     "cublaslt_best_us": min(theirs), "torch_linear_graph_us": torch_graph, "torch_rel_l2": torch_rel})
    bad = [c for c in cases if not c["rel_l2"] <= TOL]
    with open(os.path.join(args.out, "gemm_simt_check.json"), "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(0), "tol": TOL, "checks": len(cases), "failed": bad[:50],
                   "max_rel_l2": max(c["rel_l2"] for c in cases), "rows": rows, "cases": cases}, fh, indent=1,
                  default=str)
    print(f"gemm_simt correctness: {len(cases) - len(bad)}/{len(cases)} within {TOL:g} of float64 "
          f"(max {max(c['rel_l2'] for c in cases):.2e})" + (f"; FAILED e.g. {bad[:3]}" if bad else ""))
    print(f"{'case':10} {'ours us':>8} {'tile/S':>9} {'cublasLt':>9} {'torch':>7} {'speedup':>8}")
    for r in rows:
        print(f"{r['case']:10} {r['ours_best_us']:8.2f} {r['ours_best']:>9} {r['cublaslt_best_us']:9.2f} "
              f"{r['torch_linear_graph_us']:7.2f} {min(r['cublaslt_best_us'], r['torch_linear_graph_us']) / r['ours_best_us']:7.2f}x")
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
