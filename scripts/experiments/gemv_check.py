#!/usr/bin/env python3
"""Experiment: on a GPU machine, check our GEMV (codegen/vendor/gemv.cu) against PyTorch in float64, its norm
prologue included, inside a CUDA graph of dependent calls, and time a decode step's projections with and without
programmatic dependent launch.

1. correctness: ``nimble.gemv.matmul`` / ``matmul_add`` / ``norm_matmul`` / ``norm_matmul_add`` for fp16 and bf16
   (and ``glu_matmul`` / ``glu_norm_matmul``, the gated MLP's projection and SiLU gate, one row, each shape of even N),
   1, 3, 5 and 8 rows (the norm: 1), GPT-2's, Qwen2-0.5B's and a 4096-wide layer's shapes, float32 and 16-bit
   outputs, the tanh GELU, LayerNorm and RMSNorm of a float32 or 16-bit x; the reference normalizes in float64 and
   rounds to the 16-bit dtype as the unfused norm's cast does. Relative L2 error, tolerance 1e-2 (fp16) / 2e-2 (bf16).
2. a CUDA graph of eight dependent calls on one stream (each reads the one before's output: a launch that did not
   wait for its producer would read stale or NaN-filled memory), replayed twice with new inputs, checked again.
3. timing (``--skip-timing`` leaves it out): the norm in the prologue against our LayerNorm kernel followed by the
   plain GEMV (twelve of each as one graph); GPT-2 small's twelve layers of decode projections (norm + QKV,
   attention out + residual, norm + MLP up + GELU, MLP down + residual) as one CUDA graph, its replay's wall time
   (median of 7 runs of 200 replays), in fresh processes: NIMBLE_PDL=0 (the launches without the
   programmatic-dependent-launch attribute) and, with it, each split policy of ``--blocks-per-sm``
   (NIMBLE_GEMV_BLOCKS_PER_SM: 0 fills the GPU with up to two waves of blocks, B > 0 keeps one wave of at most B
   blocks a core; gemv.cu's GemvSplits); Qwen2.5-0.5B's 24 layers (RMSNorm + QKV, out + residual, RMSNorm + gated
   MLP up, down + residual; bf16) likewise. Each policy's process checks every case of 1. too (the splits differ).
4. the tensor-core kernel for several rows (``--mma-rows``: NIMBLE_GEMV_MMA_ROWS, the fewest rows it takes; 9 never,
   each in its own process, which checks every case of 1. too: 3 rows go to it under 2): GPT-2's 48 projections at 4
   and 8 rows as plain GEMVs (the norm's prologue takes one row) as one graph, beside the same products through
   PyTorch's ``addmm`` (cuBLAS, bias only).

Writes ``gemv_check.json`` into ``--out`` and prints a short table last; exits 1 when a check fails.

Findings: benchmarks/findings.md, 'Programmatic dependent launch for our decode kernels' and (the tensor-core rows)
'GPT-2's head on cuBLASLt's aligned kernels ...'. Raw outputs: benchmarks/raw/2026-11-29-h200-s34/
(call2-gemv_check.json, call8-session.log), benchmarks/raw/2026-11-29-h200-s40/call10-gemv_check.json.

    bash scripts/gpu_session.sh "experiment gemv_check 120"
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for tvm_nimble
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tvm_nimble.contract import vendor_abi  # noqa: E402

TOL = {"float16": 1e-2, "bfloat16": 2e-2}
#: (name, K, N): the projections of a decode step
SHAPES = [("gpt2_qkv", 768, 2304), ("gpt2_down", 3072, 768), ("qwen_gate_up", 896, 9728), ("wide", 4096, 512),
          ("small", 72, 40)]
NORMS = {0: "none", 1: "layer", 2: "rms"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for gemv_check.json")
    p.add_argument("--skip-timing", action="store_true", help="correctness and graph checks only")
    p.add_argument("--blocks-per-sm", default="0,2,4",
                   help="NIMBLE_GEMV_BLOCKS_PER_SM values checked and timed, each in its own process")
    p.add_argument("--mma-rows", default="2,5,9",
                   help="NIMBLE_GEMV_MMA_ROWS values (the fewest rows on the tensor cores; 9: never) checked and timed "
                        "(blocks per SM 4), each in its own process")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # a policy's process: checks and timing
    return p.parse_args(argv)


def eps_bits(eps: float) -> int:
    return struct.unpack("<I", struct.pack("<f", eps))[0]


class Gemv:
    def __init__(self):
        import torch
        import tvm_ffi
        from tvm_nimble.codegen.vendor_build import build_vendor_library
        from tvm_nimble.runtime.vendor import load_vendor_library

        major, minor = torch.cuda.get_device_capability(0)
        self.funcs = load_vendor_library(build_vendor_library(f"sm_{major}{minor}"))
        self.torch, self.tvm_ffi = torch, tvm_ffi
        self.dev = tvm_ffi.device("cuda", 0)
        self.gen = torch.Generator(device="cuda").manual_seed(0)
        self.ws = torch.empty(256, dtype=torch.uint8, device="cuda")

    def randn(self, shape, dtype, scale=1.0, shift=0.0):
        t = self.torch.randn(shape, device="cuda", generator=self.gen, dtype=self.torch.float32) * scale + shift
        return t.to(dtype)

    def call(self, x, w, bias, y, act=0, norm=0, gamma=None, beta=None, z=None, stream=None):
        """y = act(norm(x) @ w.T + bias (+ z)) through the extension, on ``stream`` (default: torch's)."""
        t = self.tvm_ffi.from_dlpack
        stream = self.torch.cuda.current_stream().cuda_stream if stream is None else stream
        if norm:
            name = vendor_abi.GEMV_NORM_MATMUL_ADD if z is not None else vendor_abi.GEMV_NORM_MATMUL
            head = [t(x), t(gamma), t(beta), t(w), t(bias)]
            attrs = self.tvm_ffi.Shape([act, norm, eps_bits(1e-5)])
        else:
            name = vendor_abi.GEMV_MATMUL_ADD if z is not None else vendor_abi.GEMV_MATMUL
            head, attrs = [t(x), t(w), t(bias)], self.tvm_ffi.Shape([act])
        args = head + ([t(z)] if z is not None else []) + [attrs, t(y), t(self.ws)]
        with self.tvm_ffi.use_raw_stream(self.dev, stream):
            self.funcs[name](*args)

    def reference(self, x, w, bias, act=0, norm=0, gamma=None, beta=None, z=None):
        torch = self.torch
        xd = x.double()
        if norm:
            mean = xd.mean(-1, keepdim=True) if norm == 1 else 0.0
            var = ((xd - mean) ** 2).mean(-1, keepdim=True)
            xd = (xd - mean) / torch.sqrt(var + 1e-5) * gamma.double() + (beta.double() if norm == 1 else 0.0)
            xd = xd.to(w.dtype).double()  # the unfused norm's cast
        r = xd.reshape(-1, xd.shape[-1]) @ w.double().t() + bias.double()
        r = r + (z.double().reshape(r.shape) if z is not None else 0.0)
        if act == 4:
            r = 0.5 * r * (1 + torch.tanh(0.7978845608028654 * (r + 0.044715 * r ** 3)))
        return r

    def call_glu(self, x, w, bias, y, norm=0, gamma=None, beta=None, stream=None):
        """y = silu(gate) * up of norm(x) @ w.T + bias, w's rows (gate j, up j) interleaved, through the extension."""
        t = self.tvm_ffi.from_dlpack
        if norm:
            name, head = vendor_abi.GEMV_GLU_NORM_MATMUL, [t(x), t(gamma), t(beta), t(w), t(bias)]
            attrs = self.tvm_ffi.Shape([1, norm, eps_bits(1e-5)])
        else:
            name, head, attrs = vendor_abi.GEMV_GLU_MATMUL, [t(x), t(w), t(bias)], self.tvm_ffi.Shape([1])
        stream = self.torch.cuda.current_stream().cuda_stream if stream is None else stream
        with self.tvm_ffi.use_raw_stream(self.dev, stream):
            self.funcs[name](*head, attrs, t(y), t(self.ws))

    def reference_glu(self, x, w, bias, norm=0, gamma=None, beta=None):
        """The gate as the unfused 16-bit operators compute it: the projection, sigmoid, and both products each
        rounded to w's dtype."""
        dt = w.dtype
        h = self.reference(x, w, bias, 0, norm, gamma, beta).to(dt).double()
        g, u = h[..., 0::2], h[..., 1::2]
        sig = self.torch.sigmoid(g).to(dt).double()
        return ((g * sig).to(dt).double() * u).to(dt).double()

    @staticmethod
    def rel_l2(out, ref):
        d = (out.double().reshape(ref.shape) - ref).norm().item()
        n = ref.norm().item()
        return d / n if n > 0 else d


def check_cases(g: Gemv) -> list[dict]:
    torch = g.torch
    cases = []
    for dname, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        for name, K, N in SHAPES:
            for rows in (1, 3, 5, 8):
                for norm in (0, 1, 2) if rows == 1 else (0,):  # the norm's prologue takes one row
                    for out32 in (True, False):
                        x_dtype = torch.float32 if (norm and out32) else dtype
                        x = g.randn((1, rows, K), x_dtype, 2.0, 0.5)
                        w = g.randn((N, K), dtype, K ** -0.5)
                        odt = torch.float32 if out32 else dtype
                        bias = g.randn((N,), odt, 0.1)
                        z = g.randn((1, rows, N), odt) if out32 else None
                        act = 0 if out32 else 4
                        gamma = g.randn((K,), torch.float32, 0.1, 1.0) if norm else None
                        beta = g.randn((K,), torch.float32, 0.1) if norm else None
                        y = torch.full((1, rows, N), float("nan"), dtype=odt, device="cuda")
                        g.call(x, w, bias, y, act, norm, gamma, beta, z)
                        torch.cuda.synchronize()
                        rel = g.rel_l2(y, g.reference(x, w, bias, act, norm, gamma, beta, z))
                        cases.append({"dtype": dname, "shape": name, "K": K, "N": N, "rows": rows,
                                      "norm": NORMS[norm], "x": str(x_dtype).split(".")[-1], "out": str(odt).split(".")[-1],
                                      "act": act, "rel_l2": rel, "ok": rel <= TOL[dname]})
            if N % 2:
                continue
            for norm in (0, 2):  # the gated MLP's projection and gate (one row; Llama's RMSNorm in the prologue)
                x = g.randn((1, 1, K), torch.float32 if norm else dtype, 2.0, 0.5)
                w = g.randn((N, K), dtype, K ** -0.5)
                bias = g.randn((N,), dtype, 0.1)
                gamma = g.randn((K,), torch.float32, 0.1, 1.0) if norm else None
                beta = torch.zeros((K,), dtype=torch.float32, device="cuda") if norm else None
                y = torch.full((1, 1, N // 2), float("nan"), dtype=dtype, device="cuda")
                g.call_glu(x, w, bias, y, norm, gamma, beta)
                torch.cuda.synchronize()
                rel = g.rel_l2(y, g.reference_glu(x, w, bias, norm, gamma, beta))
                cases.append({"dtype": dname, "shape": name, "K": K, "N": N, "rows": 1, "norm": NORMS[norm],
                              "x": str(x.dtype).split(".")[-1], "out": dname, "act": "silu-glu", "rel_l2": rel,
                              "ok": rel <= TOL[dname]})
    return cases


def decode_chain(g: Gemv, layers: int, dtype, K: int = 768):
    """GPT-2's projections per layer: [norm + QKV, out + residual, norm + up + GELU, down + residual]; returns
    (issue(stream), outputs, reference())."""
    torch = g.torch
    r0 = g.randn((1, 1, K), torch.float32, 1.0)
    bufs, steps = [], []
    r = r0
    for _ in range(layers):
        p = {n: g.randn(s, dt, sc) for n, s, dt, sc in (
            ("g1", (K,), torch.float32, 0.1), ("b1", (K,), torch.float32, 0.1), ("w_qkv", (3 * K, K), dtype, K ** -0.5),
            ("bq", (3 * K,), dtype, 0.1), ("w_o", (K, K), dtype, K ** -0.5), ("bo", (K,), torch.float32, 0.1),
            ("g2", (K,), torch.float32, 0.1), ("b2", (K,), torch.float32, 0.1), ("w_up", (4 * K, K), dtype, K ** -0.5),
            ("bu", (4 * K,), dtype, 0.1), ("w_dn", (K, 4 * K), dtype, (4 * K) ** -0.5), ("bd", (K,), torch.float32, 0.1))}
        p["g1"] += 1.0
        p["g2"] += 1.0
        qkv = torch.empty((1, 1, 3 * K), dtype=dtype, device="cuda")
        r1 = torch.empty((1, 1, K), dtype=torch.float32, device="cuda")
        up = torch.empty((1, 1, 4 * K), dtype=dtype, device="cuda")
        r2 = torch.empty((1, 1, K), dtype=torch.float32, device="cuda")
        # the attention stand-in: the output projection reads the first K columns of QKV
        steps.append((r, p, qkv, r1, up, r2))
        bufs += [qkv, r1, up, r2]
        r = r2

    def issue(stream=None):
        for r_in, p, qkv, r1, up, r2 in steps:
            g.call(r_in, p["w_qkv"], p["bq"], qkv, 0, 1, p["g1"], p["b1"], stream=stream)
            g.call(qkv.view(-1)[:K].view(1, 1, K), p["w_o"], p["bo"], r1, 0, z=r_in, stream=stream)
            g.call(r1, p["w_up"], p["bu"], up, 4, 1, p["g2"], p["b2"], stream=stream)
            g.call(up, p["w_dn"], p["bd"], r2, 0, z=r1, stream=stream)

    def reference():
        r_ref = r0.double()
        for _, p, *_ in steps:
            qkv = g.reference(r_ref.float(), p["w_qkv"], p["bq"], 0, 1, p["g1"], p["b1"]).to(dtype)
            r1 = g.reference(qkv[..., :K].reshape(1, 1, K), p["w_o"], p["bo"], z=r_ref.float()).float()
            up = g.reference(r1, p["w_up"], p["bu"], 4, 1, p["g2"], p["b2"]).to(dtype)
            r_ref = g.reference(up.reshape(1, 1, -1), p["w_dn"], p["bd"], z=r1).float().double()
        return r_ref

    return r0, issue, bufs, steps[-1][5], reference


def check_graph(g: Gemv) -> dict:
    from tvm_nimble.runtime.cuda_graph import CapturedGraph, StreamSet, check

    from cuda.bindings import runtime as rt

    torch = g.torch
    streams = StreamSet(1)
    r0, issue, bufs, out, reference = decode_chain(g, 2, torch.float16)
    issue(streams.handle(0))  # the live run first, as the executor does
    check(rt.cudaStreamSynchronize(streams.streams[0]), "cudaStreamSynchronize")
    graph = CapturedGraph(lambda: issue(streams.handle(0)), streams)
    replays = []
    for replay in range(2):
        with torch.no_grad():
            for b in bufs:
                b.fill_(float("nan"))
            if replay:
                r0.copy_(g.randn(r0.shape, torch.float32, 1.0))
        torch.cuda.synchronize()
        graph.launch()
        check(rt.cudaStreamSynchronize(streams.streams[0]), "cudaStreamSynchronize")
        rel = g.rel_l2(out, reference())
        replays.append({"rel_l2": rel, "ok": rel <= TOL["float16"]})
    graph.close()
    streams.close()
    return {"replays": replays, "ok": all(r["ok"] for r in replays)}


def qwen_chain(g: Gemv, layers: int = 24, K: int = 896, kv: int = 128, inner: int = 4864):
    """Qwen2.5-0.5B's decode projections per layer, bf16 (timing only): [RMSNorm + QKV, out + residual, RMSNorm +
    gate/up + SiLU gate, down + residual]; returns issue(stream)."""
    torch, dt = g.torch, g.torch.bfloat16
    r = g.randn((1, 1, K), torch.float32, 1.0)
    steps = []
    for _ in range(layers):
        p = {n: g.randn(s, d, sc) for n, s, d, sc in (
            ("g1", (K,), torch.float32, 0.1), ("w_qkv", (K + 2 * kv, K), dt, K ** -0.5), ("bq", (K + 2 * kv,), dt, 0.1),
            ("w_o", (K, K), dt, K ** -0.5), ("bo", (K,), torch.float32, 0.0), ("g2", (K,), torch.float32, 0.1),
            ("w_gu", (2 * inner, K), dt, K ** -0.5), ("bgu", (2 * inner,), dt, 0.0),
            ("w_dn", (K, inner), dt, inner ** -0.5), ("bd", (K,), torch.float32, 0.0))}
        p["g1"] += 1.0
        p["g2"] += 1.0
        out = (torch.empty((1, 1, K + 2 * kv), dtype=dt, device="cuda"),
               torch.empty((1, 1, K), dtype=torch.float32, device="cuda"),
               torch.empty((1, 1, inner), dtype=dt, device="cuda"),
               torch.empty((1, 1, K), dtype=torch.float32, device="cuda"))
        steps.append((r, p, out))
        r = out[3]

    def issue(stream=None):
        for r_in, p, (qkv, r1, h, r2) in steps:
            g.call(r_in, p["w_qkv"], p["bq"], qkv, 0, 2, p["g1"], p["g1"], stream=stream)
            g.call(qkv.view(-1)[:K].view(1, 1, K), p["w_o"], p["bo"], r1, 0, z=r_in, stream=stream)
            g.call_glu(r1, p["w_gu"], p["bgu"], h, 2, p["g2"], p["g2"], stream=stream)
            g.call(h, p["w_dn"], p["bd"], r2, 0, z=r1, stream=stream)

    return issue


def time_chain(g: Gemv) -> dict:
    """Wall time per replay of GPT-2 small's fp16 and Qwen2.5-0.5B's bf16 decode projections, each as one graph
    (this process's NIMBLE_PDL, NIMBLE_GEMV_BLOCKS_PER_SM and NIMBLE_GEMV_MMA_ROWS), and GPT-2's at ROWS rows."""
    _, issue, _, _, _ = decode_chain(g, 12, g.torch.float16)
    return {"us_per_replay": graph_us(g, issue), "launches": 48, "qwen_us_per_replay": graph_us(g, qwen_chain(g)),
            "qwen_launches": 96, "rows_us": {str(r): graph_us(g, rows_chain(g, r)) for r in ROWS}}


#: the batch sizes whose GPT-2 projections are timed (the norm's prologue takes one row: plain GEMVs here)
ROWS = (4, 8)


def rows_chain(g: Gemv, rows: int, torch_linear: bool = False, K: int = 768):
    """GPT-2 small's fp16 decode projections at ``rows`` rows, 12 layers, as plain GEMVs: QKV, the output projection of
    a constant stand-in for the attention + residual, MLP up + GELU, down + residual (each layer's output the next
    one's input); with ``torch_linear`` the same four products through PyTorch's ``addmm`` (cuBLAS; bias only, no
    residual or GELU): issue(stream)."""
    torch = g.torch
    dt = torch.float16
    shapes = ((3 * K, K, 0), (K, K, 0), (4 * K, K, 4), (K, 4 * K, 0))  # (N, K, activation)
    layers = [[(g.randn((n, k), dt, k ** -0.5), g.randn((n,), dt, 0.1), act) for n, k, act in shapes]
              for _ in range(12)]
    att = g.randn((1, rows, K), dt)
    xs = [g.randn((1, rows, K), dt)] + [torch.empty((1, rows, K), dtype=dt, device="cuda") for _ in layers]
    tmp = [[torch.empty((1, rows, n), dtype=dt, device="cuda") for n, _, _ in shapes] for _ in layers]

    def issue(stream=None):
        for i, ((qkv, out, up, down), (y_qkv, r1, y_up, _)) in enumerate(zip(layers, tmp)):
            x, y = xs[i], xs[i + 1]
            steps = ((x, qkv, y_qkv, None), (att, out, r1, x), (r1, up, y_up, None), (y_up, down, y, r1))
            for a, (w, b, act), o, z in steps:
                if torch_linear:
                    with torch.cuda.stream(torch.cuda.ExternalStream(stream) if stream else torch.cuda.current_stream()):
                        torch.addmm(b, a.view(rows, -1), w.t(), out=o.view(rows, -1))
                else:
                    g.call(a, w, b, o, act, z=z, stream=stream)

    return issue


def graph_us(g: Gemv, issue) -> float:
    """Median wall time per replay of ``issue(stream)`` captured as one CUDA graph (7 runs of 200 replays)."""
    from tvm_nimble.runtime.cuda_graph import CapturedGraph, StreamSet, check

    from cuda.bindings import runtime as rt

    streams = StreamSet(1)
    issue(streams.handle(0))
    check(rt.cudaStreamSynchronize(streams.streams[0]), "cudaStreamSynchronize")
    graph = CapturedGraph(lambda: issue(streams.handle(0)), streams)
    runs = []
    for _ in range(7):
        check(rt.cudaStreamSynchronize(streams.streams[0]), "cudaStreamSynchronize")
        t = time.perf_counter()
        for _ in range(200):
            graph.launch()
        check(rt.cudaStreamSynchronize(streams.streams[0]), "cudaStreamSynchronize")
        runs.append((time.perf_counter() - t) / 200 * 1e6)
    graph.close()
    streams.close()
    return statistics.median(runs)


def time_fusion(g: Gemv) -> dict:
    """The norm in the GEMV's prologue against our LayerNorm kernel then the plain GEMV: twelve of each chain
    (16-bit x [1, 1, K], float32 parameters) as one graph, microseconds per chain."""
    torch = g.torch
    out = {}
    for name, K, N in (("gpt2_qkv", 768, 2304), ("gpt2_head", 768, 50257), ("qwen_gate_up", 896, 9728)):
        x = g.randn((1, 1, K), torch.float16)
        gamma, beta = g.randn((K,), torch.float32, 0.1, 1.0), g.randn((K,), torch.float32, 0.1)
        w, bias = g.randn((N, K), torch.float16, K ** -0.5), g.randn((N,), torch.float16, 0.1)
        ln = torch.empty_like(x)
        y = torch.empty((1, 1, N), dtype=torch.float16, device="cuda")
        t = g.tvm_ffi.from_dlpack

        def unfused(stream):
            for _ in range(12):
                with g.tvm_ffi.use_raw_stream(g.dev, stream):
                    g.funcs[vendor_abi.NORM_LAYER_NORM](t(x), t(gamma), t(beta), g.tvm_ffi.Shape([eps_bits(1e-5)]),
                                                        t(ln), t(g.ws))
                g.call(ln, w, bias, y, stream=stream)

        def fused(stream):
            for _ in range(12):
                g.call(x, w, bias, y, 0, 1, gamma, beta, stream=stream)

        out[name] = {"unfused_us": graph_us(g, unfused) / 12, "fused_us": graph_us(g, fused) / 12}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print("gemv_check: no CUDA GPU is visible to PyTorch", file=sys.stderr)
        return 2
    g = Gemv()
    if args.child:
        cases = check_cases(g)
        bad = [c for c in cases if not c["ok"]]
        timing = {} if args.skip_timing else time_chain(g)
        print(json.dumps({**timing, "cases_ok": len(cases) - len(bad), "cases": len(cases), "failed": bad[:5]}))
        return 0
    log = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    log["cases"] = check_cases(g)
    log["graph"] = check_graph(g)
    if not args.skip_timing:
        log["fusion"] = time_fusion(g)
    log["timing"] = {}
    if not args.skip_timing:  # PyTorch's cuBLAS on the same products at those rows
        log["torch_rows_us"] = {str(r): graph_us(g, rows_chain(g, r, torch_linear=True)) for r in ROWS}
    runs = [("1", b, "5") for b in args.blocks_per_sm.split(",") if b]
    runs += [("1", "4", m) for m in args.mma_rows.split(",") if m and m != "5"]
    runs += [] if args.skip_timing else [("0", "0", "5")]
    for pdl, blocks, mma in runs:
        env = dict(os.environ, NIMBLE_PDL=pdl, NIMBLE_GEMV_BLOCKS_PER_SM=blocks, NIMBLE_GEMV_MMA_ROWS=mma)
        child = [sys.executable, os.path.abspath(__file__), "--child", "--out", args.out]
        done = subprocess.run(child + (["--skip-timing"] if args.skip_timing else []), env=env,
                              capture_output=True, text=True, timeout=300)
        key = f"pdl={pdl} blocks_per_sm={blocks} mma_rows={mma}"
        if done.returncode != 0:
            log["timing"][key] = {"error": done.stderr.strip().splitlines()[-1:]}
        else:
            log["timing"][key] = json.loads(done.stdout.strip().splitlines()[-1])
    with open(os.path.join(args.out, "gemv_check.json"), "w") as f:
        json.dump(log, f, indent=1)
    bad = [c for c in log["cases"] if not c["ok"]]
    worst = {}
    for c in log["cases"]:
        key = (c["dtype"], c["norm"])
        worst[key] = max(worst.get(key, 0.0), c["rel_l2"])
    print(f"{'dtype':9} {'norm':6} worst rel L2")
    for (d, n), v in sorted(worst.items()):
        print(f"{d:9} {n:6} {v:.2e}")
    print(f"cases: {len(log['cases']) - len(bad)}/{len(log['cases'])} ok; graph: "
          f"{'ok' if log['graph']['ok'] else 'FAIL'} {[round(r['rel_l2'], 6) for r in log['graph']['replays']]}")
    for c in bad[:10]:
        print("FAIL", c)
    for k, v in log.get("fusion", {}).items():
        print(f"{k}: LayerNorm kernel + GEMV {v['unfused_us']:.2f} us, norm in the GEMV {v['fused_us']:.2f} us")
    child_bad = False
    for k, v in log["timing"].items():
        child_bad |= "error" in v or v["cases_ok"] != v["cases"]
        print(f"{k}: cases {v.get('cases_ok')}/{v.get('cases')} ok; GPT-2 fp16 "
              f"{v.get('us_per_replay', v.get('error', '-'))} us per replay of 48 GEMVs, Qwen2.5-0.5B bf16 "
              f"{v.get('qwen_us_per_replay', '-')} us of 96; GPT-2 at rows {v.get('rows_us', '-')} us")
    if "torch_rows_us" in log:
        print(f"PyTorch addmm (cuBLAS, bias only) GPT-2 at rows: {log['torch_rows_us']} us")
    return 1 if bad or child_bad or not log["graph"]["ok"] else 0


if __name__ == "__main__":
    sys.exit(main())
