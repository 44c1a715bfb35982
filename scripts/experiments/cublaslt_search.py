"""Experiment: cuBLASLt's whole configuration space for a decoder's GEMMs, against the heuristic's candidates the build
times (#52: the 0.5B decoder's output and down projections at 512 tokens, far from the GPU's rate; benchmarks/findings.md,
'cuBLASLt's configuration space').

``cublaslt_search.cu`` (beside this script, compiled here with nvcc against the cuBLAS wheel) lists the heuristic's
candidates and every configuration ``cublasLtMatmulAlgoCheck`` accepts of every algorithm id (tiles x stages x cluster
shapes x split-K 1/2/4/8 x custom options), screens them, and times the heuristic's and the 12 fastest others as CUDA graphs of 20
calls (memset nodes counted). Cases: the 0.5B decoder's Linears at 512 tokens (``gemm_algos --cases
llama-0.5b@512``'s), the output and down projections with the residual (beta 1) as the build runs them.

    bash scripts/gpu_session.sh "experiment cublaslt_search 150 --dtypes f16,bf16"
    python3 scripts/experiments/cublaslt_search.py --compile-only --out DIR   # CPU: the program compiles

Writes DIR/cublaslt_search.json and prints per case: the heuristic's first and best (index), the search's best with
its configuration (algorithm id, tile id, stages id, split-K, cluster shape id), and memsets a call.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
#: (name, M, N, K, beta): the 0.5B decoder's GEMMs at 512 tokens (beta 1: the residual added by the GEMM)
CASES = [
    ("qkv", 512, 1152, 896, 0), ("o_proj", 512, 896, 896, 1), ("gate_up", 512, 9728, 896, 0),
    ("down", 512, 896, 4864, 1), ("lm_head", 512, 151936, 896, 0),
]


def compile_program(out: str) -> tuple[str, dict]:
    """The search program compiled for this machine's GPU (sm_90 without one), and the environment it runs in."""
    from tvm_nimble.codegen.vendor_build import find_nvcc, vendor_paths

    paths = vendor_paths()
    exe = os.path.join(out, "cublaslt_search")
    arch = "sm_90"
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            arch = f"sm_{major}{minor}"
    except ImportError:
        pass
    subprocess.run([find_nvcc(), "-O2", "-std=c++17", f"-arch={arch}", "-I", paths["cublas_include"],
                    os.path.join(HERE, "cublaslt_search.cu"), "-o", exe, "-L", paths["cublas_lib"],
                    "-l:libcublasLt.so.13"], check=True)
    run_env = dict(os.environ)
    run_env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (paths["cublas_lib"], os.environ.get("LD_LIBRARY_PATH"))
                                                 if p)
    return exe, run_env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/cublaslt_search")
    ap.add_argument("--dtypes", default="f16", help="comma-separated: f16, bf16, f32")
    ap.add_argument("--cases", default="qkv,o_proj,gate_up,down", help=f"of {','.join(c[0] for c in CASES)}")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    exe, run_env = compile_program(args.out)
    if args.compile_only:
        print(f"compiled {exe}")
        return 0
    rows = []
    wanted = args.cases.split(",")
    for dtype in args.dtypes.split(","):
        for name, M, N, K, beta in [c for c in CASES if c[0] in wanted]:
            done = subprocess.run([exe, dtype, str(M), str(N), str(K), str(beta)], capture_output=True, text=True,
                                  env=run_env)
            cands = []
            for line in done.stdout.splitlines():
                src, index, us, algo, tile, stages, split, cluster, memsets, ws, custom = line.split()
                cands.append({"source": src, "index": int(index), "us": float(us), "algo": int(algo),
                              "tile": int(tile), "stages": int(stages), "split": int(split),
                              "cluster": int(cluster), "memsets": int(memsets), "workspace": int(ws),
                              "custom": int(custom)})
            rows.append({"case": name, "dtype": dtype, "M": M, "N": N, "K": K, "beta": beta, "candidates": cands,
                         "stderr": done.stderr.strip()[-400:], "rc": done.returncode})
            heur = [c for c in cands if c["source"] == "heuristic"]
            found = [c for c in cands if c["source"] == "search"]
            first = heur[0] if heur else None
            best_h = min(heur, key=lambda c: c["us"]) if heur else None
            best_s = min(found, key=lambda c: c["us"]) if found else None

            def fmt(c):
                return ("-" if c is None else
                        f"{c['us']:7.2f} us (algo {c['algo']} tile {c['tile']} stages {c['stages']} split "
                        f"{c['split']} cluster {c['cluster']} custom {c['custom']}, {c['memsets']} memsets)")
            print(f"{name:8s} {dtype:4s} {done.stderr.strip().splitlines()[0] if done.stderr.strip() else ''}",
                  flush=True)
            print(f"   heuristic first {fmt(first)}\n   heuristic best  {fmt(best_h)} [index "
                  f"{best_h['index'] if best_h else '-'}]\n   search best     {fmt(best_s)}", flush=True)
    with open(os.path.join(args.out, "cublaslt_search.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
