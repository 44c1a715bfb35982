"""Experiment: our depthwise-convolution and pool kernel (codegen/vendor/depthwise.cu, provider ``depthwise``) against
a float64 PyTorch reference on nasnetalarge's shapes (and a few that take the narrower vector paths and NCHW), and
its GPU time against cuDNN through our legacy call (``nimble.cudnn.conv2d``: what the provider competes with) and
PyTorch's own kernel for the same operator (channels-last where the case is NHWC).

Every case runs with what the provider folds into the kernel: a ReLU on the input, bias, a residual and ReLU6
where the case says so; asymmetric ("SAME") padding as the importer folds it.

    bash scripts/gpu_session.sh "experiment depthwise_check 120"

Writes DIR/depthwise_check.json; prints per case and dtype the relative L2 error against float64 and each kernel's
GPU time as CUPTI records it (what it costs inside a CUDA graph), microseconds.
"""
from __future__ import annotations

import json
import os

import gpu_args  # the shared command line, beside this script in scripts/experiments/

# name: (op, C, H, W, k, stride, (top, left, bottom, right), layout, relu_in, residual, act)
CASES = {
    "dw3_42x168": ("conv", 168, 42, 42, 3, 1, (1, 1, 1, 1), "nhwc", 1, 0, 0),
    "dw5_42x168": ("conv", 168, 42, 42, 5, 1, (2, 2, 2, 2), "nhwc", 0, 0, 1),
    "dw3_21x336": ("conv", 336, 21, 21, 3, 1, (1, 1, 1, 1), "nhwc", 1, 0, 0),
    "dw5_21x336": ("conv", 336, 21, 21, 5, 1, (2, 2, 2, 2), "nhwc", 0, 0, 0),
    "dw7_21x336": ("conv", 336, 21, 21, 7, 1, (3, 3, 3, 3), "nhwc", 0, 0, 0),
    "dw3_11x672": ("conv", 672, 11, 11, 3, 1, (1, 1, 1, 1), "nhwc", 1, 0, 0),
    "dw5_11x672": ("conv", 672, 11, 11, 5, 1, (2, 2, 2, 2), "nhwc", 0, 0, 0),
    "dw7_s2_42x336_same": ("conv", 336, 42, 42, 7, 2, (2, 2, 3, 3), "nhwc", 1, 0, 0),
    "dw5_s2_83x84_same": ("conv", 84, 83, 83, 5, 2, (2, 2, 2, 2), "nhwc", 1, 0, 0),
    "dw5_s2_165x42_v2": ("conv", 42, 165, 165, 5, 2, (2, 2, 2, 2), "nhwc", 1, 0, 0),
    "dw3_res_relu6_21x21ch": ("conv", 21, 21, 21, 3, 1, (1, 1, 1, 1), "nhwc", 0, 1, 2),
    "dw3_112x32_nchw": ("conv", 32, 112, 112, 3, 1, (1, 1, 1, 1), "nchw", 0, 0, 2),
    "dw5_s2_28x240_nchw": ("conv", 240, 28, 28, 5, 2, (1, 1, 2, 2), "nchw", 0, 0, 0),
    "avg3_valid_42x168_res": ("avg_valid", 168, 42, 42, 3, 1, (1, 1, 1, 1), "nhwc", 0, 1, 0),
    "avg3_all_s2_83x84_same": ("avg_all", 84, 83, 83, 3, 2, (1, 1, 1, 1), "nhwc", 0, 0, 0),
    "max3_s2_42x336_same": ("max", 336, 42, 42, 3, 2, (0, 0, 1, 1), "nhwc", 0, 0, 1),
    "max3_s2_35x288_nchw": ("max", 288, 35, 35, 3, 2, (0, 0, 0, 0), "nchw", 0, 0, 0),
}
MODES = {"conv": 0, "avg_valid": 1, "avg_all": 2, "max": 3}
VECTOR_ENV = "NIMBLE_DEPTHWISE_VECTOR"


def main(argv=None) -> int:
    args = gpu_args.parse_kernel_bench(__doc__, argv, "out/depthwise_check")
    import torch
    import torch.nn.functional as F
    import tvm_ffi

    from tvm_nimble.contract import vendor_abi

    os.environ.pop(VECTOR_ENV, None)
    fns = {n: tvm_ffi.get_global_func(vendor_abi.DEPTHWISE.prefix + n) for n in ("conv2d", "conv2d_add", "pool2d", "pool2d_add")}
    cudnn_conv = tvm_ffi.get_global_func(vendor_abi.CUDNN_CONV2D)
    dev = tvm_ffi.device("cuda", 0)
    t = tvm_ffi.from_dlpack
    ws = torch.empty(1, dtype=torch.uint8, device="cuda")
    cudnn_ws = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    rows, failed = [], 0
    for name, (op, c, h, w, k, s, pads, layout, relu_in, residual, act) in CASES.items():
        top, left, bottom, right = pads
        oh, ow = (h + top + bottom - k) // s + 1, (w + left + right - k) // s + 1
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = torch.randn(1, c, h, w, device="cuda", generator=gen).to(dtype)
            weight = (torch.randn(c, 1, k, k, device="cuda", generator=gen) / k).to(dtype)
            bias = torch.randn(c, device="cuda", generator=gen).to(dtype)
            z = torch.randn(1, c, oh, ow, device="cuda", generator=gen).to(dtype)
            # the float64 reference, NCHW
            xr = x.double().relu() if relu_in else x.double()
            if op == "conv":
                ref = F.conv2d(F.pad(xr, (left, right, top, bottom)), weight.double(), bias.double(), s, groups=c)
            elif op == "max":
                ref = F.max_pool2d(F.pad(xr, (left, right, top, bottom), value=float("-inf")), k, s)
            elif op == "avg_all":
                ref = F.avg_pool2d(F.pad(xr, (left, right, top, bottom)), k, s)
            else:
                ones = F.pad(torch.ones_like(xr[:, :1]), (left, right, top, bottom))
                ref = F.avg_pool2d(F.pad(xr, (left, right, top, bottom)), k, s) / F.avg_pool2d(ones, k, s)
            ref = ref + z.double() if residual else ref
            ref = ref.relu() if act == 1 else ref.clamp(0, 6) if act == 2 else ref
            nhwc = layout == "nhwc"

            def phys(tensor):  # the kernel's layout
                return tensor.permute(0, 2, 3, 1).contiguous() if nhwc else tensor.contiguous()

            xk, zk = phys(x), phys(z)
            y = torch.empty_like(phys(ref.to(dtype)))
            attrs = tvm_ffi.Shape([k, k, s, s, top, left, 1, 1, act, relu_in, int(nhwc), MODES[op]])
            taps = weight[:, 0].permute(1, 2, 0).contiguous()  # [KH, KW, C]
            if op == "conv":
                fn, call_args = ((fns["conv2d_add"], (t(xk), t(taps), t(bias), t(zk))) if residual else
                                 (fns["conv2d"], (t(xk), t(taps), t(bias))))
            else:
                fn, call_args = (fns["pool2d_add"], (t(xk), t(zk))) if residual else (fns["pool2d"], (t(xk),))

            def ours():
                with tvm_ffi.use_raw_stream(dev, stream):
                    fn(*call_args, attrs, t(y), t(ws))

            y.fill_(float("nan"))
            ours()
            torch.cuda.synchronize()
            got = y.permute(0, 3, 1, 2) if nhwc else y
            err = ((got.double() - ref).norm() / ref.norm()).item()
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            row = {"case": name, "dtype": str(dtype).split(".")[-1], "rel_l2": err, "ok": err < tol}
            failed += not row["ok"]
            row["nimble_kernel_us"], _ = gpu_args.kernel_us(ours)
            if nhwc:  # each vector width the kernel can take here (NIMBLE_DEPTHWISE_VECTOR), checked and timed
                row["vector_us"] = {}
                for v in (16 // x.element_size(), 2, 1):
                    if c % v:
                        continue
                    os.environ[VECTOR_ENV] = str(v)
                    y.fill_(float("nan"))
                    ours()
                    torch.cuda.synchronize()
                    got = y.permute(0, 3, 1, 2)
                    verr = ((got.double() - ref).norm() / ref.norm()).item()
                    row["ok"] = row["ok"] and verr < tol
                    row["vector_us"][v] = gpu_args.kernel_us(ours)[0]
                os.environ.pop(VECTOR_ENV, None)
                failed += not row["ok"] and err < tol
            # PyTorch's kernel for the same operator (without what we fold in), in the case's layout
            xt = x.contiguous(memory_format=torch.channels_last) if nhwc else x
            wt = weight.contiguous(memory_format=torch.channels_last) if nhwc else weight
            if op == "conv":
                def theirs():
                    F.conv2d(F.pad(xt, (left, right, top, bottom)) if top != bottom or left != right else xt, wt,
                             bias, s, padding=0 if top != bottom or left != right else top, groups=c)
            elif op == "max":
                def theirs():
                    F.max_pool2d(xt, k, s, padding=top) if top == bottom else F.max_pool2d(
                        F.pad(xt, (left, right, top, bottom), value=float("-inf")), k, s)
            else:
                def theirs():
                    F.avg_pool2d(xt, k, s, padding=top, count_include_pad=op == "avg_all")
            row["torch_kernel_us"], row["torch_kernels"] = gpu_args.kernel_us(theirs)
            if op in ("conv", "avg_all", "avg_valid") and top == bottom and left == right:
                # our cuDNN legacy call: what the provider competes with (a pool as a depthwise convolution of 1/k²)
                wc = (weight if op == "conv" else torch.full_like(weight, 1.0 / (k * k)))
                wc = wc.permute(0, 2, 3, 1).contiguous() if nhwc else wc
                yc = torch.empty_like(y)
                cattrs = tvm_ffi.Shape([s, s, top, left, 1, 1, c, act if not residual else 0, -1, 0, int(nhwc)])

                def cudnn():
                    with tvm_ffi.use_raw_stream(dev, stream):
                        cudnn_conv(t(xk), t(wc), t(bias), cattrs, t(yc), t(cudnn_ws))
                row["cudnn_kernel_us"], row["cudnn_kernels"] = gpu_args.kernel_us(cudnn)
            rows.append(row)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "depthwise_check.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'case':28s} {'dtype':9s} {'rel_l2':>9s} {'ours us':>8s} {'cuDNN us':>9s} {'torch us':>9s}  ours by vector")
    for r in rows:
        cudnn = f"{r['cudnn_kernel_us']:9.2f}" if "cudnn_kernel_us" in r else f"{'-':>9s}"
        vectors = " ".join(f"{v}:{us:.2f}" for v, us in r.get("vector_us", {}).items())
        print(f"{r['case']:28s} {r['dtype']:9s} {r['rel_l2']:9.2e} {r['nimble_kernel_us']:8.2f} {cudnn} "
              f"{r['torch_kernel_us']:9.2f}  {vectors}{'' if r['ok'] else '  FAIL'}")
    print(f"{len(rows) - failed} of {len(rows)} cases within tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
