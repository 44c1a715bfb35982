"""Which cuBLAS path is fastest for fp32 GEMMs at transformer shapes (M = 128/197), TF32 off: classic cuBLAS
(torch.mm) with the weight [K, N] (NN) or [N, K] (TN, nn.Linear's layout), cuBLASLt with the bias epilogue
(F.linear), and a residual as C (torch.addmm); CUDA-graph time of 20 calls, and the kernels each ran
(torch.profiler). Findings: benchmarks/findings.md, 'GEMMs at batch 1, build times, bf16 accuracy'."""
import json, os
import torch

from gpu_args import graph_us  # beside this script in scripts/experiments/
import torch.nn.functional as F

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
SHAPES = {"vit_b": (197, [(768, 2304), (768, 768), (768, 3072), (3072, 768)]),
          "vit_s": (197, [(384, 1152), (384, 1536), (1536, 384)]),
          "bert": (128, [(768, 768), (768, 3072), (3072, 768)])}


def kernels(fn):
    from torch.profiler import profile, ProfilerActivity
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn(); torch.cuda.synchronize()
    return [e.name[:90] for e in p.events() if e.device_type.name == "CUDA"]


rows = []
for model, (M, kn) in SHAPES.items():
    for K, N in kn:
        a = torch.randn(M, K, device=dev)
        w = torch.randn(K, N, device=dev) / K ** 0.5
        wt = w.t().contiguous()  # [N, K]
        bias = torch.randn(N, device=dev)
        res = torch.randn(M, N, device=dev)
        out = torch.empty(M, N, device=dev)
        variants = {
            "mm_NN": lambda: torch.mm(a, w, out=out),
            "mm_TN": lambda: torch.mm(a, wt.t(), out=out),
            "linear_bias": lambda: F.linear(a, wt, bias),
            "addmm_bias_NN": lambda: torch.addmm(bias, a, w, out=out),
            "addmm_res_NN": lambda: torch.addmm(res, a, w, out=out),
        }
        r = dict(model=model, M=M, K=K, N=N)
        for name, fn in variants.items():
            r[name] = round(graph_us(fn), 2)
            r[name + "_kernels"] = kernels(fn)
        rows.append(r)
        print({k: v for k, v in r.items() if not k.endswith("_kernels")}, flush=True)

out = os.environ.get("OUT", ".")
json.dump(rows, open(os.path.join(out, "gemm_paths.json"), "w"), indent=1)
names = ["mm_NN", "mm_TN", "linear_bias", "addmm_bias_NN", "addmm_res_NN"]
print(f"{'model':6} {'M':>4} {'K':>5} {'N':>5} " + " ".join(f"{n:>13}" for n in names))
for r in rows:
    print(f"{r['model']:6} {r['M']:4} {r['K']:5} {r['N']:5} " + " ".join(f"{r[n]:13.2f}" for n in names))
for r in rows[:4]:
    for n in names:
        print(r["model"], r["K"], r["N"], n, r[n + "_kernels"])
