#!/usr/bin/env python3
"""Experiment: on a GPU machine, check the vendor-kernel extension (cuDNN conv, cuBLASLt GEMM) against
PyTorch, and time its convolutions against PyTorch's.

Needs PyTorch (a CUDA build), cuda-bindings, the nvidia-cudnn-cu13 / nvidia-cublas wheels and the
TVM runtime (tvm_ffi; ``tvm.relax`` is not needed). Steps, all on cuda:0:

1. load the extension through ``tvm_nimble.runtime.vendor`` (``--lib``, else build it here with
   ``codegen.vendor_build`` for this GPU's arch);
2. correctness: every conv configuration x activation x dtype, conv2d_add, matmul (transpose_b 0/1,
   identity/relu/relu6/gelu, every algorithm candidate with and without the bias epilogue, batched,
   misaligned, a classifier head), the convolution gradients (conv2d_bwd_data / _bwd_filter against
   PyTorch's float64 autograd) against a float64 PyTorch
   reference: relative L2 error, fp32 (TF32 off) tolerance 1e-5, fp16 1e-2; forced algorithms;
   the argument checks on real CUDA tensors (one-line errors);
3. a CUDA graph: calls on two streams (each with its own workspace) captured in relaxed mode, the
   way the executor does it (live run first), replayed twice with new inputs, checked again;
4. timing: one conv per configuration (relu, fp32 and fp16), this extension vs PyTorch's
   conv2d+relu, median of 200 CUDA-event-timed calls (a GPU sleep before each hides launch cost).

Writes ``vendor_check.json`` into ``--out`` and prints a short table last; exits 1 when a check
fails, 2 when the environment is not usable. Rerun it after changing the extension.

Findings: benchmarks/findings.md, 'The vendor extension'. Raw outputs: benchmarks/raw/2026-11-23-h100-s5/vendor_check.json
and call2-session.log beside it.

    bash scripts/gpu_session.sh "experiment vendor_check 150"
    python3 scripts/experiments/vendor_check.py --lib out/libnimble_vendor.so --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for tvm_nimble
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tvm_nimble.contract import vendor_abi  # noqa: E402

TOL = {"float32": 1e-5, "float16": 1e-2}
WORKSPACE_BYTES = 64 << 20

# name: (x shape, w shape, stride (h, w), pad (h, w), dilation (h, w), groups)
CONVS = {
    "1x1": ((8, 64, 28, 28), (128, 64, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    "3x3_p1": ((8, 64, 28, 28), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    "3x3_s2": ((8, 64, 56, 56), (128, 64, 3, 3), (2, 2), (1, 1), (1, 1), 1),
    "7x7_s2_p3": ((8, 3, 224, 224), (64, 3, 7, 7), (2, 2), (3, 3), (1, 1), 1),
    "1x7_p0_3": ((8, 64, 17, 17), (96, 64, 1, 7), (1, 1), (0, 3), (1, 1), 1),
    "7x1_p3_0": ((8, 64, 17, 17), (96, 64, 7, 1), (1, 1), (3, 0), (1, 1), 1),
    "grouped_g4": ((8, 64, 28, 28), (128, 16, 3, 3), (1, 1), (1, 1), (1, 1), 4),
    "depthwise": ((8, 96, 56, 56), (96, 1, 3, 3), (1, 1), (1, 1), (1, 1), 96),
    "depthwise_s2": ((8, 96, 56, 56), (96, 1, 3, 3), (2, 2), (1, 1), (1, 1), 96),
    "3x3_dil2": ((4, 32, 33, 33), (48, 32, 3, 3), (1, 1), (2, 2), (2, 2), 1),
}
CONV_ADDS = ["1x1", "3x3_p1", "grouped_g4"]
# name: (a shape, N, transpose_b)
MATMULS = {
    "mm_tb1": ((256, 512), 1024, 1),
    "vit_b_fc2": ((1, 197, 3072), 768, 0),  # split-K candidates without the bias epilogue
    "mm_tb0": ((256, 512), 1024, 0),
    "mm_batched_tb1": ((4, 64, 512), 384, 1),
    "mm_head_tb1": ((1, 1280), 1000, 1),
}
ACTS = {0: "identity", 1: "relu", 2: "relu6"}
MATMUL_ACTS = {**ACTS, 3: "gelu"}  # the erf GELU: matmul only


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", default=None, help="the extension (libnimble_vendor.so); built here if absent")
    p.add_argument("--out", required=True, help="folder for vendor_check.json")
    p.add_argument("--iters", type=int, default=200, help="timed calls per configuration (median)")
    p.add_argument("--skip-timing", action="store_true", help="correctness and graph checks only")
    return p.parse_args(argv)


def fail(msg: str, code: int = 2):
    print(f"vendor_check: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"


class Check:
    def __init__(self, args):
        import torch
        import tvm_ffi

        self.torch, self.tvm_ffi, self.F = torch, tvm_ffi, torch.nn.functional
        self.args = args
        self.dev = tvm_ffi.device("cuda", 0)
        self.cases: list[dict] = []
        self.errors: list[dict] = []
        self.gen = torch.Generator(device="cuda").manual_seed(0)

    # -- helpers ------------------------------------------------------------------------------
    def t(self, x):
        return self.tvm_ffi.from_dlpack(x)

    def randn(self, shape, dtype, scale=1.0):
        return (self.torch.randn(shape, device="cuda", generator=self.gen, dtype=self.torch.float32) * scale).to(dtype)

    def workspace(self, nbytes=WORKSPACE_BYTES):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")

    def call(self, name, *args, stream=None):
        stream = self.torch.cuda.current_stream().cuda_stream if stream is None else stream
        with self.tvm_ffi.use_raw_stream(self.dev, stream):
            self.funcs[name](*[self.t(a) if isinstance(a, self.torch.Tensor) else a for a in args])

    @staticmethod
    def act(r, act):
        if act == 3:
            return 0.5 * r * (1 + (r / 2 ** 0.5).erf())
        if act >= 1:
            r = r.clamp_min(0)
        if act == 2:
            r = r.clamp_max(6)
        return r

    def rel_l2(self, out, ref):
        d = (out.double() - ref).norm().item()
        n = ref.norm().item()
        return d / n if n > 0 else d

    @staticmethod
    def conv_attrs(cfg, act, algo=-1, tf32=0):
        _, _, (sh, sw), (ph, pw), (dh, dw), g = cfg
        return [sh, sw, ph, pw, dh, dw, g, act, algo, tf32]

    def conv_ref(self, x, w, b, z, cfg, act, dtype=None):
        _, _, stride, pad, dil, g = cfg
        dt = dtype or self.torch.float64
        r = self.F.conv2d(x.to(dt), w.to(dt), b.to(dt), stride, pad, dil, g)
        if z is not None:
            r = r + z.to(dt)
        return self.act(r, act)

    def conv_data(self, cfg, dtype):
        xs, wsh = cfg[0], cfg[1]
        fan_in = wsh[1] * wsh[2] * wsh[3]
        x = self.randn(xs, dtype)
        w = self.randn(wsh, dtype, 3.0 / fan_in ** 0.5)  # outputs ~N(0, 9): relu6 clips a good share
        b = self.randn((wsh[0],), dtype, 0.5)
        return x, w, b

    def record(self, **case):
        case["ok"] = bool(case.get("error") is None and case["rel_l2"] <= case["tol"])
        self.cases.append(case)
        return case

    # -- correctness ----------------------------------------------------------------------------
    def check_convs(self):
        torch = self.torch
        ws = self.workspace()
        for dname, dtype in (("float32", torch.float32), ("float16", torch.float16)):
            for name, cfg in CONVS.items():
                x, w, b = self.conv_data(cfg, dtype)
                ref_plain = self.F.conv2d(x.double(), w.double(), b.double(), cfg[2], cfg[3], cfg[4], cfg[5])
                for act in ACTS:
                    ref = self.act(ref_plain, act)
                    y = torch.full(ref.shape, float("nan"), dtype=dtype, device="cuda")
                    err, rel = None, float("inf")
                    try:
                        self.call(vendor_abi.CUDNN_CONV2D, x, w, b, self.tvm_ffi.Shape(self.conv_attrs(cfg, act)), y, ws)
                        rel = self.rel_l2(y, ref)
                    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                        err = one_line(e)
                    torch_rel = self.rel_l2(self.act(self.F.conv2d(x, w, b, cfg[2], cfg[3], cfg[4], cfg[5]), act), ref)
                    self.record(op="conv2d", name=name, dtype=dname, act=ACTS[act], rel_l2=rel,
                                torch_rel_l2=torch_rel, tol=TOL[dname], error=err)
            for name in CONV_ADDS:
                cfg = CONVS[name]
                x, w, b = self.conv_data(cfg, dtype)
                for act in ACTS:
                    z = self.randn(self.conv_ref(x, w, b, None, cfg, 0).shape, dtype)
                    ref = self.conv_ref(x, w, b, z, cfg, act)
                    for inplace in (False, True):
                        y = z.clone() if inplace else torch.full(ref.shape, float("nan"), dtype=dtype, device="cuda")
                        err, rel = None, float("inf")
                        try:
                            self.call(vendor_abi.CUDNN_CONV2D_ADD, x, w, b, y if inplace else z,
                                      self.tvm_ffi.Shape(self.conv_attrs(cfg, act)), y, ws)
                            rel = self.rel_l2(y, ref)
                        except Exception as e:  # noqa: BLE001
                            err = one_line(e)
                        self.record(op="conv2d_add" + ("(z=y)" if inplace else ""), name=name, dtype=dname,
                                    act=ACTS[act], rel_l2=rel, tol=TOL[dname], error=err)
            # forced algorithms: 0 = IMPLICIT_GEMM, 1 = IMPLICIT_PRECOMP_GEMM (the fused identity path)
            cfg = CONVS["3x3_p1"]
            x, w, b = self.conv_data(cfg, dtype)
            for algo in (0, 1):
                for act in (0, 2):
                    ref = self.conv_ref(x, w, b, None, cfg, act)
                    y = torch.full(ref.shape, float("nan"), dtype=dtype, device="cuda")
                    err, rel = None, float("inf")
                    try:
                        self.call(vendor_abi.CUDNN_CONV2D, x, w, b, self.tvm_ffi.Shape(self.conv_attrs(cfg, act, algo)),
                                  y, ws)
                        rel = self.rel_l2(y, ref)
                    except Exception as e:  # noqa: BLE001
                        err = one_line(e)
                    self.record(op=f"conv2d algo={algo}", name="3x3_p1", dtype=dname, act=ACTS[act], rel_l2=rel,
                                tol=TOL[dname], error=err)

    def check_conv_gradients(self):
        """nimble.cudnn.conv2d_bwd_data / _bwd_filter (a training step's convolution gradients, #34) against
        PyTorch's float64 autograd of the same forward convolution (groups 1; an odd size leaves rows unread)."""
        torch = self.torch
        ws = self.workspace()
        cfgs = {k: v for k, v in CONVS.items() if v[5] == 1}
        cfgs["3x3_s2_odd"] = ((4, 32, 29, 29), (48, 32, 3, 3), (2, 2), (0, 0), (1, 1), 1)
        for dname, dtype in (("float32", torch.float32), ("float16", torch.float16)):
            for name, cfg in cfgs.items():
                x, w, _ = self.conv_data(cfg, dtype)
                xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
                y = self.F.conv2d(xd, wd, None, cfg[2], cfg[3], cfg[4])
                dy = self.randn(y.shape, dtype)
                y.backward(dy.double())
                attrs = self.tvm_ffi.Shape(self.conv_attrs(cfg, 0))
                for op, args, out, ref in (("conv2d_bwd_data", (dy, w), torch.empty_like(x), xd.grad),
                                           ("conv2d_bwd_filter", (x, dy), torch.empty_like(w), wd.grad)):
                    out.fill_(float("nan"))
                    err, rel = None, float("inf")
                    try:
                        self.call(f"{vendor_abi.CUDNN.prefix}{op}", *args, attrs, out, ws)
                        torch.cuda.synchronize()
                        rel = self.rel_l2(out, ref)
                    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                        err = one_line(e)
                    self.record(op=op, name=name, dtype=dname, act="identity", rel_l2=rel, tol=TOL[dname], error=err)

    def check_matmuls(self):
        torch = self.torch
        ws = self.workspace()
        for dname, dtype in (("float32", torch.float32), ("float16", torch.float16)):
            cases = [(n, *spec, False) for n, spec in MATMULS.items()] + [("mm_misaligned_tb0", (96, 200), 130, 0, True)]
            for name, ashape, n, tb, misaligned in cases:
                k = ashape[-1]
                if misaligned:  # a and y one element off their allocation's alignment
                    a = self.randn((a_numel(ashape) + 1,), dtype)[1:].view(ashape)
                else:
                    a = self.randn(ashape, dtype)
                bmat = self.randn((n, k) if tb else (k, n), dtype, 3.0 / k ** 0.5)
                bias = self.randn((n,), dtype, 0.5)
                full_b = bmat.double().t() if tb else bmat.double()
                ref_plain = a.double() @ full_b + bias.double()
                # every candidate (with the bias epilogue, then without: our bias kernel), identity and gelu
                n_cand = len(self.funcs[vendor_abi.CUBLAS_MATMUL_TIMINGS](
                    self.t(a), self.t(bmat), self.t(bias), self.tvm_ffi.Shape([tb, 0, 0]),
                    self.t(torch.empty(ref_plain.shape, dtype=dtype, device="cuda")), self.t(ws), 1))
                for act, algo in [(a_, 0) for a_ in MATMUL_ACTS] + [(a_, i) for a_ in (0, 3) for i in range(1, n_cand)]:
                    ref = self.act(ref_plain, act)
                    if misaligned:
                        y = torch.full((a_numel(ref.shape) + 1,), float("nan"), dtype=dtype, device="cuda")[1:].view(ref.shape)
                    else:
                        y = torch.full(ref.shape, float("nan"), dtype=dtype, device="cuda")
                    err, rel = None, float("inf")
                    try:
                        self.call(vendor_abi.CUBLAS_MATMUL, a, bmat, bias, self.tvm_ffi.Shape([tb, act, 0, algo]), y, ws)
                        rel = self.rel_l2(y, ref)
                    except Exception as e:  # noqa: BLE001
                        err = one_line(e)
                    tref = self.act(a @ (bmat.t() if tb else bmat) + bias, act)
                    self.record(op=f"matmul algo={algo}/{n_cand}", name=name, dtype=dname, act=MATMUL_ACTS[act], rel_l2=rel,
                                torch_rel_l2=self.rel_l2(tref, ref), tol=TOL[dname], error=err)
                # the residual form (identity activation, as the offload emits it): y = a @ op(b) + bias + z
                z = self.randn(ref_plain.shape, dtype)
                ref = ref_plain + z.double()
                for algo in range(n_cand):
                    y = torch.full(ref.shape, float("nan"), dtype=dtype, device="cuda")
                    err, rel = None, float("inf")
                    try:
                        self.call(vendor_abi.CUBLAS_MATMUL_ADD, a, bmat, bias, z, self.tvm_ffi.Shape([tb, 0, 0, algo]), y, ws)
                        rel = self.rel_l2(y, ref)
                    except Exception as e:  # noqa: BLE001
                        err = one_line(e)
                    tref = a @ (bmat.t() if tb else bmat) + bias + z
                    self.record(op=f"matmul_add algo={algo}", name=name, dtype=dname, act="identity", rel_l2=rel,
                                torch_rel_l2=self.rel_l2(tref, ref), tol=TOL[dname], error=err)

    def check_batched_matmuls(self):
        """nimble.cublas.batched_matmul (attention's Q·Kᵀ with transpose_b=1, ·V with 0) against float64."""
        torch = self.torch
        ws = self.workspace()
        for dname, dtype in (("float32", torch.float32), ("float16", torch.float16)):
            for name, (batch, m, k, n) in {"vit_s_qk": ((1, 6), 197, 64, 197), "bert_av": ((1, 12), 128, 128, 64),
                                           "odd": ((3,), 5, 7, 9)}.items():
                for tb in (0, 1):
                    a = self.randn((*batch, m, k), dtype)
                    b = self.randn((*batch, n, k) if tb else (*batch, k, n), dtype, 3.0 / k ** 0.5)
                    ref = a.double() @ (b.double().transpose(-1, -2) if tb else b.double())
                    y = torch.full(ref.shape, float("nan"), dtype=dtype, device="cuda")
                    err, rel = None, float("inf")
                    try:
                        self.call(vendor_abi.CUBLAS_BATCHED_MATMUL, a, b, self.tvm_ffi.Shape([tb, 0]), y, ws)
                        rel = self.rel_l2(y, ref)
                    except Exception as e:  # noqa: BLE001
                        err = one_line(e)
                    tref = a @ (b.transpose(-1, -2) if tb else b)
                    self.record(op=f"batched_matmul tb={tb}", name=name, dtype=dname, act="identity", rel_l2=rel,
                                torch_rel_l2=self.rel_l2(tref, ref), tol=TOL[dname], error=err)

    def check_errors(self):
        """Argument checks on real CUDA tensors: each must fail with a one-line error."""
        torch = self.torch
        cfg = CONVS["3x3_p1"]
        x, w, b = self.conv_data(cfg, torch.float32)
        y = torch.empty((8, 64, 28, 28), device="cuda")
        ws = self.workspace()
        attrs = self.tvm_ffi.Shape(self.conv_attrs(cfg, 1))
        # an algorithm that needs a workspace on this cuDNN (GEMM, algo 2, needs none on cuDNN 9.19): forced with
        # a 1-byte workspace, the call must refuse it
        from tvm_nimble.runtime.vendor import conv2d_algos

        needy = [a["algo"] for a in conv2d_algos(x.shape, w.shape, self.conv_attrs(cfg, 1))
                 if a["status"] == 0 and a["workspace_bytes"] > 256]
        bad = {
            "y wrong shape": (vendor_abi.CUDNN_CONV2D, x, w, b, attrs, torch.empty((8, 64, 27, 28), device="cuda"), ws),
            "w dtype mismatch": (vendor_abi.CUDNN_CONV2D, x, w.half(), b, attrs, y, ws),
            "x not contiguous": (vendor_abi.CUDNN_CONV2D, x.transpose(2, 3), w, b, attrs, y, ws),
            **({"forced algo needing a workspace, 1-byte workspace": (
                vendor_abi.CUDNN_CONV2D, x, w, b, self.tvm_ffi.Shape(self.conv_attrs(cfg, 1, algo=needy[0])), y,
                self.workspace(1))} if needy else {}),
            "matmul K mismatch": (vendor_abi.CUBLAS_MATMUL, torch.empty((4, 8), device="cuda"),
                                  torch.empty((16, 9), device="cuda"), torch.empty((16,), device="cuda"),
                                  self.tvm_ffi.Shape([1, 0, 0]), torch.empty((4, 16), device="cuda"), ws),
        }
        for what, (fn, *args) in bad.items():
            try:
                self.call(fn, *args)
                msg, ok = "no error raised", False
            except Exception as e:  # noqa: BLE001
                msg = str(e).strip()
                ok = "\n" not in msg and fn in msg
            self.errors.append({"case": what, "message": msg, "ok": ok})
        torch.cuda.synchronize()

    # -- CUDA graph on two streams ---------------------------------------------------------------
    def check_graph(self):
        from tvm_nimble.runtime.cuda_graph import CapturedGraph, StreamSet, check, create_events

        from cuda.bindings import runtime as rt

        torch = self.torch
        streams = StreamSet(2)
        fork, join = create_events(2)
        ws = [self.workspace(), self.workspace()]
        c3, c1 = CONVS["3x3_p1"], CONVS["1x1"]
        h = torch.float16
        x3, w3, b3 = self.conv_data(c3, h)
        x1, w1, b1 = self.conv_data(c1, torch.float32)
        y3 = torch.empty((8, 64, 28, 28), dtype=h, device="cuda")
        y3b = torch.empty_like(y3)
        z1 = self.randn((8, 128, 28, 28), torch.float32)
        y1 = torch.empty((8, 128, 28, 28), device="cuda")
        am = self.randn((256, 512), h)
        bm = self.randn((1024, 512), h, 3.0 / 512 ** 0.5)
        biasm = self.randn((1024,), h, 0.5)
        ym = torch.empty((256, 1024), dtype=h, device="cuda")
        a3 = self.tvm_ffi.Shape(self.conv_attrs(c3, 1))
        a3b = self.tvm_ffi.Shape(self.conv_attrs(c3, 2))
        a1 = self.tvm_ffi.Shape(self.conv_attrs(c1, 2))
        calls = [  # (stream index, function, args)
            (0, vendor_abi.CUDNN_CONV2D, (x3, w3, b3, a3, y3, ws[0])),
            (1, vendor_abi.CUDNN_CONV2D_ADD, (x1, w1, b1, z1, a1, y1, ws[1])),
            (1, vendor_abi.CUBLAS_MATMUL, (am, bm, biasm, self.tvm_ffi.Shape([1, 1, 0]), ym, ws[1])),
            (0, vendor_abi.CUDNN_CONV2D, (y3, w3, b3, a3b, y3b, ws[0])),
        ]
        converted = [(s, fn, [self.t(a) if isinstance(a, torch.Tensor) else a for a in args]) for s, fn, args in calls]

        def issue():
            check(rt.cudaEventRecord(fork, streams.streams[0]), "cudaEventRecord(fork)")
            check(rt.cudaStreamWaitEvent(streams.streams[1], fork, 0), "cudaStreamWaitEvent(fork)")
            for s, fn, args in converted:
                with self.tvm_ffi.use_raw_stream(self.dev, streams.handle(s)):
                    self.funcs[fn](*args)
            check(rt.cudaEventRecord(join, streams.streams[1]), "cudaEventRecord(join)")
            check(rt.cudaStreamWaitEvent(streams.streams[0], join, 0), "cudaStreamWaitEvent(join)")

        def refs():
            r3 = self.conv_ref(x3, w3, b3, None, c3, 1)
            r3b = self.conv_ref(y3, w3, b3, None, c3, 2)  # the second conv reads the first one's fp16 output
            return {"conv2d(s0)": (y3, r3, "float16"), "conv2d_add(s1)": (y1, self.conv_ref(x1, w1, b1, z1, c1, 2), "float32"),
                    "matmul(s1)": (ym, self.act(am.double() @ bm.double().t() + biasm.double(), 1), "float16"),
                    "conv2d after conv2d(s0)": (y3b, r3b, "float16")}

        torch.cuda.synchronize()
        issue()  # the live run: handles and plans are created here, never during capture
        check(rt.cudaStreamSynchronize(streams.streams[0]), "cudaStreamSynchronize")
        graph = CapturedGraph(issue, streams)
        result = {"replays": []}
        for replay in range(2):
            with torch.no_grad():
                for y in (y3, y3b, y1, ym):
                    y.fill_(float("nan"))
                if replay:  # new inputs in place: the graph reads live memory
                    x3.copy_(self.randn(x3.shape, h))
                    z1.copy_(self.randn(z1.shape, torch.float32))
                    am.copy_(self.randn(am.shape, h))
            torch.cuda.synchronize()
            graph.launch()
            check(rt.cudaStreamSynchronize(streams.streams[0]), "cudaStreamSynchronize")
            outs = {}
            for name, (y, ref, dname) in refs().items():
                rel = self.rel_l2(y, ref)
                outs[name] = {"rel_l2": rel, "tol": TOL[dname], "ok": rel <= TOL[dname]}
            result["replays"].append(outs)
        result["ok"] = all(o["ok"] for r in result["replays"] for o in r.values())
        graph.close()
        return result

    # -- timing --------------------------------------------------------------------------------------
    def time_fn(self, fn):
        torch = self.torch
        for _ in range(10):
            fn()
        times = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(self.args.iters):
            torch.cuda._sleep(100_000)  # keep the GPU busy while the host enqueues: time the kernels alone
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def timing(self):
        torch = self.torch
        ws = self.workspace()
        rows = []
        stream = torch.cuda.current_stream().cuda_stream
        for dname, dtype in (("float32", torch.float32), ("float16", torch.float16)):
            for name, cfg in CONVS.items():
                x, w, b = self.conv_data(cfg, dtype)
                y = torch.empty(self.conv_ref(x, w, b, None, cfg, 0).shape, dtype=dtype, device="cuda")
                args = [self.t(v) for v in (x, w, b)] + [self.tvm_ffi.Shape(self.conv_attrs(cfg, 1)), self.t(y), self.t(ws)]
                fn = self.funcs[vendor_abi.CUDNN_CONV2D]

                def ours():
                    with self.tvm_ffi.use_raw_stream(self.dev, stream):
                        fn(*args)

                def theirs():
                    self.F.relu(self.F.conv2d(x, w, b, cfg[2], cfg[3], cfg[4], cfg[5]))

                t_ours, t_torch = self.time_fn(ours), self.time_fn(theirs)
                rows.append({"name": name, "dtype": dname, "act": "relu", "nimble_ms": t_ours, "torch_ms": t_torch,
                             "speedup": t_torch / t_ours if t_ours > 0 else None})
        return rows


def a_numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    try:
        import torch
    except ImportError:
        fail("PyTorch is required here (a CUDA build, e.g. torch 2.11+cu130): pip install torch")
    if not torch.cuda.is_available():
        fail("no CUDA GPU is visible to PyTorch (torch.cuda.is_available() is False)")
    try:
        import cuda.bindings.runtime  # noqa: F401
    except ImportError:
        fail("cuda-bindings is required for the CUDA graph check: pip install cuda-bindings")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

    from tvm_nimble.runtime.vendor import load_vendor_library

    lib = args.lib
    built_here = False
    if not lib or not os.path.isfile(lib):
        from tvm_nimble.codegen.vendor_build import build_vendor_library

        major, minor = torch.cuda.get_device_capability(0)
        print(f"building the extension for sm_{major}{minor} (--lib {'absent' if not lib else lib + ' not found'})",
              flush=True)
        lib = build_vendor_library(f"sm_{major}{minor}")
        built_here = True
    try:
        funcs = load_vendor_library(lib)
    except Exception as e:  # noqa: BLE001
        fail(f"cannot load the extension {lib}: {one_line(e)}")

    chk = Check(args)
    chk.funcs = funcs
    log = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "lib": os.path.abspath(lib),
           "built_here": built_here, "versions": str(funcs[vendor_abi.VENDOR_VERSIONS]())}
    print(f"{log['device']}: {log['versions']}; torch {torch.__version__}", flush=True)
    out_path = os.path.join(args.out, "vendor_check.json")

    def save():
        log["elapsed_s"] = round(time.time() - t0, 1)
        with open(out_path, "w") as f:
            json.dump(log, f, indent=1, default=str)

    sections = [("convs", chk.check_convs), ("conv gradients", chk.check_conv_gradients), ("matmuls", chk.check_matmuls), ("batched matmuls", chk.check_batched_matmuls), ("errors", chk.check_errors),
                ("graph", chk.check_graph)]
    if not args.skip_timing:
        sections.append(("timing", chk.timing))
    log["section_errors"] = {}
    for name, fn in sections:
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        try:
            res = fn()
            if res is not None:
                log[name] = res
        except Exception as e:  # noqa: BLE001 - a section failure is logged; the others still run
            import traceback

            log["section_errors"][name] = traceback.format_exc()
            print(f"  {name} failed: {one_line(e)}", flush=True)
        log["cases"], log["error_checks"] = chk.cases, chk.errors
        log["plans"] = [str(p) for p in funcs[vendor_abi.VENDOR_PLANS]()]
        save()

    ok_cases = all(c["ok"] for c in chk.cases) and bool(chk.cases)
    ok_errors = all(e["ok"] for e in chk.errors) and bool(chk.errors)
    ok_graph = bool(log.get("graph", {}).get("ok"))
    log["ok"] = ok_cases and ok_errors and ok_graph and not log["section_errors"]
    save()

    # the short table, last
    print(f"\n{'op':<22} {'config':<18} {'dtype':<8} {'act':<8} {'rel_l2':>10} {'torch':>10} {'tol':>7}  ok")
    for c in chk.cases:
        tr = c.get("torch_rel_l2")
        print(f"{c['op']:<22} {c['name']:<18} {c['dtype']:<8} {c['act']:<8} {c['rel_l2']:>10.2e} "
              f"{(f'{tr:.2e}' if tr is not None else '-'):>10} {c['tol']:>7.0e}  {'ok' if c['ok'] else 'FAIL ' + (c.get('error') or '')}")
    for e in chk.errors:
        print(f"error check: {e['case']:<36} {'ok' if e['ok'] else 'FAIL'}  {e['message'][:150]}")
    for i, r in enumerate(log.get("graph", {}).get("replays", [])):
        print(f"graph replay {i}: " + ", ".join(f"{k} {v['rel_l2']:.1e}{'' if v['ok'] else ' FAIL'}" for k, v in r.items()))
    if log.get("timing"):
        print(f"\n{'conv (relu)':<16} {'dtype':<8} {'nimble ms':>10} {'torch ms':>10} {'speedup':>8}")
        for r in log["timing"]:
            print(f"{r['name']:<16} {r['dtype']:<8} {r['nimble_ms']:>10.4f} {r['torch_ms']:>10.4f} {r['speedup']:>8.2f}")
    for name, tb in log["section_errors"].items():
        print(f"section {name} failed: {tb.strip().splitlines()[-1]}")
    bad = sum(not c["ok"] for c in chk.cases)
    print(f"\nvendor check: {len(chk.cases) - bad} passed, {bad} failed; error checks "
          f"{sum(e['ok'] for e in chk.errors)}/{len(chk.errors)}; graph {'ok' if ok_graph else 'FAILED'}; "
          f"{log['elapsed_s']} s; {'OK' if log['ok'] else 'FAILED'} -> {out_path}")
    return 0 if log["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
