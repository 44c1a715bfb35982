"""Feasibility: fp32 GEMMs at transformer shapes (M = 128/197, and the decoders' 512 tokens) as one TF32 GEMM of
depth 3K on split operands (3xTF32: A_hi*B_hi + A_hi*B_lo + A_lo*B_hi), against cuBLAS SGEMM (TF32 off): time (CUDA
graph of 20 calls) and relative L2 error against float64, with the large product first along K and with the two small
ones first (provider tf32x3's order: does the tensor cores' accumulation lose less so?).

    OUT=out python3 scripts/experiments/gemm_3xtf32.py [MODEL,...]     (default: every entry of SHAPES)
"""
import json, os, sys
import torch

from gpu_args import graph_us  # beside this script in scripts/experiments/

torch.manual_seed(0)
dev = "cuda"
SHAPES = {"vit_s": (197, [(384, 1152), (384, 384), (384, 1536), (1536, 384)]),
          "vit_b": (197, [(768, 2304), (768, 768), (768, 3072), (3072, 768)]),
          "bert": (128, [(768, 768), (768, 3072), (3072, 768), (768, 2304)]),
          # the decoders' Linears at 512 tokens (#52's fp32 rows), GPT-2's head padded to 50,264 columns as built
          "gpt2_512": (512, [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50264)]),
          "llama_512": (512, [(896, 1152), (896, 896), (896, 9728), (4864, 896), (896, 151936)])}
if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
    SHAPES = {k: SHAPES[k] for k in sys.argv[1].split(",")}


def tf32_round(x):  # round-to-nearest to 10 mantissa bits (exact in TF32)
    i = x.view(torch.int32)
    return ((i + 0x1000) & ~0x1FFF).view(torch.float32)


def split(x):
    hi = tf32_round(x)
    return hi, x - hi


def rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


rows = []
for model, (M, kn) in SHAPES.items():
    for K, N in kn:
        a = torch.randn(M, K, device=dev)
        w = torch.randn(K, N, device=dev) / K ** 0.5
        ref = a.double() @ w.double()
        ahi, alo = split(a); whi, wlo = split(w)
        a3 = torch.cat([ahi, ahi, alo], 1).contiguous()
        w3 = torch.cat([whi, wlo, whi], 0).contiguous()
        out = torch.empty(M, N, device=dev)
        torch.backends.cuda.matmul.allow_tf32 = False
        sg = graph_us(lambda: torch.mm(a, w, out=out)); e_sg = rel(torch.mm(a, w), ref)
        torch.backends.cuda.matmul.allow_tf32 = True
        t1 = graph_us(lambda: torch.mm(a, w, out=out)); e_t1 = rel(torch.mm(a, w), ref)
        t3 = graph_us(lambda: torch.mm(a3, w3, out=out)); e_t3 = rel(torch.mm(a3, w3), ref)
        a3s = torch.cat([alo, ahi, ahi], 1).contiguous()  # the small products first: provider tf32x3's order
        t3s = graph_us(lambda: torch.mm(a3s, w3, out=out)); e_t3s = rel(torch.mm(a3s, w3), ref)
        del a3s
        # the activation split as one elementwise kernel's worth of work (torch: several kernels; bound it)
        buf = torch.empty(M, 3 * K, device=dev)
        def do_split():
            hi = tf32_round(a); buf[:, :K] = hi; buf[:, K:2 * K] = hi; buf[:, 2 * K:] = a - hi
        sp = graph_us(do_split)
        rows.append(dict(model=model, M=M, K=K, N=N, sgemm_us=round(sg, 2), tf32_us=round(t1, 2),
                         x3tf32_us=round(t3, 2), x3tf32_small_first_us=round(t3s, 2), split_torch_us=round(sp, 2),
                         err_sgemm=e_sg, err_tf32=e_t1, err_3xtf32=e_t3, err_3xtf32_small_first=e_t3s))
        del a3, w3, buf
        print(rows[-1], flush=True)

out = os.environ.get("OUT", ".")
json.dump(rows, open(os.path.join(out, "gemm_3xtf32.json"), "w"), indent=1)
print(f"{'model':9} {'M':>4} {'K':>5} {'N':>6} {'sgemm':>8} {'tf32':>8} {'3xtf32':>8} {'small1st':>8} {'split':>6}"
      f"  err sg / 3x / small first")
for r in rows:
    print(f"{r['model']:9} {r['M']:4} {r['K']:5} {r['N']:6} {r['sgemm_us']:8.2f} {r['tf32_us']:8.2f} "
          f"{r['x3tf32_us']:8.2f} {r['x3tf32_small_first_us']:8.2f} {r['split_torch_us']:6.2f}  "
          f"{r['err_sgemm']:.1e} / {r['err_3xtf32']:.1e} / {r['err_3xtf32_small_first']:.1e}")
