"""Experiment: a decode step's cache write inside its attention (nimble.attention.append_sdpa_bias) against the two
calls it replaces, on the GPU.

For each case (one query row per head over a cache of Sk slots, a random cache, new keys/values and a position per
sequence; fp32, fp16 and bf16, 16-bit with an fp32 mask at finfo(fp32).min as the precision policy leaves it):
- the caches after the call equal, bit for bit, the caches with the new key and value written at the position (none
  written for a position outside the cache);
- the output equals, bit for bit, split_sdpa_bias over those written caches (the call it replaces), and is within
  tolerance of a float64 PyTorch reference;
- microseconds per call back to back, against split_sdpa_bias alone (the attention without the write);
- append_rope_sdpa_bias (the rotary embedding of q and the new key first, cos/sin of each sequence's position):
  caches and output bit for bit against append_sdpa_bias of q and the new key rotated by PyTorch in float32 (a
  multiply, a multiply, an add, rounded to the dtype), where the head's halves are whole 16-byte loads.
The cases cover the decode kernel (D 64 / 128, GQA, batch 4 with a position each) and the calls it does not take (D
40: the write, then the split-key kernel).

    bash scripts/gpu_session.sh "experiment append_check 120"

Writes DIR/append_check.json and prints a table; exits 1 when a check fails.
"""
from __future__ import annotations

import json
import os
import struct
import sys

import gpu_args  # the shared command line, beside this script in scripts/experiments/

# (name, B, H, KV heads, D, Sk, positions)
CASES = [
    ("gpt2", 1, 12, 12, 64, 384, [200]), ("gpt2_first", 1, 12, 12, 64, 384, [0]),
    ("gpt2_last", 1, 12, 12, 64, 384, [383]), ("qwen_gqa", 1, 14, 2, 64, 384, [150]),
    ("d128", 1, 8, 8, 128, 300, [77]), ("batch4", 4, 12, 12, 64, 384, [5, 130, 250, 383]),
    ("outside", 2, 4, 4, 64, 128, [-1, 128]), ("odd_d40", 1, 6, 3, 40, 97, [50]), ("d48", 1, 6, 3, 48, 97, [50]),
]
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}


def main(argv=None) -> int:
    args = gpu_args.parse_kernel_bench(__doc__, argv, "out/append_check")
    import torch
    import torch.nn.functional as F
    import tvm_ffi

    from tvm_nimble.contract import vendor_abi

    append = tvm_ffi.get_global_func(vendor_abi.ATTENTION_APPEND_SDPA_BIAS)
    rope = tvm_ffi.get_global_func(vendor_abi.ATTENTION_APPEND_ROPE_SDPA_BIAS)
    split_bias = tvm_ffi.get_global_func(vendor_abi.ATTENTION_SPLIT_SDPA_BIAS)
    dev = tvm_ffi.device("cuda", 0)
    ws = torch.empty(1, dtype=torch.uint8, device="cuda")
    t = tvm_ffi.from_dlpack
    gen = torch.Generator(device="cuda").manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for name, B, H, G, D, Sk, positions in CASES:
            group = H // G
            q = torch.randn(B, 1, H, D, device="cuda", generator=gen).to(dtype)
            cache_k, cache_v = (torch.randn(B, G, Sk, D, device="cuda", generator=gen).to(dtype) for _ in range(2))
            new_k, new_v = (torch.randn(B, 1, G, D, device="cuda", generator=gen).to(dtype) for _ in range(2))
            pos = torch.tensor(positions, dtype=torch.int64, device="cuda").view(B, 1)
            keep = torch.zeros(B, Sk, device="cuda")
            for b, p in enumerate(positions):
                keep[b, :max(0, min(p, Sk - 1)) + 1] = 1  # the slots up to the position hold tokens
            low = -10000.0 if dtype == torch.float32 else torch.finfo(torch.float32).min
            mask = ((1.0 - keep) * low).view(B, 1, 1, Sk)
            scale = D ** -0.5
            attrs = [B, H, 1, Sk, D, D, 0, H * D, D, H * D, 0, G * Sk * D, Sk * D, D, 0, G * Sk * D, Sk * D, D,
                     H * D, D, H * D, Sk, 0, 0, 1, struct.unpack("<I", struct.pack("<f", scale))[0], group]
            shape = tvm_ffi.Shape(attrs)
            written_k, written_v = cache_k.clone(), cache_v.clone()
            for b, p in enumerate(positions):
                if 0 <= p < Sk:
                    written_k[b, :, p] = new_k[b, 0]
                    written_v[b, :, p] = new_v[b, 0]
            y = torch.empty(B, 1, H, D, device="cuda", dtype=dtype)
            y_split = torch.empty_like(y)
            work_k, work_v = cache_k.clone(), cache_v.clone()

            def ours():
                with tvm_ffi.use_raw_stream(dev, stream):
                    append(t(q), t(work_k), t(work_v), t(mask), t(new_k), t(new_v), t(pos), shape, t(y), t(ws))

            def split():  # the attention it replaces, over the caches as they are
                with tvm_ffi.use_raw_stream(dev, stream):
                    split_bias(t(q), t(work_k), t(work_v), t(mask), shape, t(y_split), t(ws))

            y.fill_(float("nan"))
            ours()
            torch.cuda.synchronize()
            caches_ok = torch.equal(work_k, written_k) and torch.equal(work_v, written_v)
            work_k.copy_(written_k)
            work_v.copy_(written_v)
            split()
            torch.cuda.synchronize()
            same = torch.equal(y, y_split)
            k4, v4 = (x.repeat_interleave(group, dim=1).double() for x in (written_k, written_v))
            ref = F.scaled_dot_product_attention(q.permute(0, 2, 1, 3).double(), k4, v4, attn_mask=mask.double(),
                                                 scale=scale).permute(0, 2, 1, 3)
            err = ((y.double() - ref).norm() / ref.norm()).item()
            dt = str(dtype).split(".")[-1]
            ok = caches_ok and same and err < TOL[dt]
            row = {"case": name, "dtype": dt, "caches_written": caches_ok, "equals_split": same, "rel_l2": err,
                   "append_us": gpu_args.back_to_back_us(ours, args.reps),
                   "split_us": gpu_args.back_to_back_us(split, args.reps)}
            if (D // 2) % (16 // q.element_size()) == 0:  # the rotary variant
                inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
                angles = torch.tensor(positions, device="cuda", dtype=torch.float32).clamp(min=0)[:, None] * inv
                cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # [B, D]

                def rotated(x):  # [B, 1, heads, D] as the graph computes it: float32, rounded to the dtype
                    xf = x.float()
                    half = torch.cat([-xf[..., D // 2:], xf[..., :D // 2]], -1)
                    return (xf * cos[:, None, None] + half * sin[:, None, None]).to(dtype)

                q_rot, k_rot = rotated(q), rotated(new_k)
                ws_rope = torch.empty(B * H * D * 4 + 256, dtype=torch.uint8, device="cuda")
                y_rope, y_want = torch.empty_like(y), torch.empty_like(y)
                rope_k, rope_v, want_k, want_v = (c.clone() for c in (cache_k, cache_v, cache_k, cache_v))

                def roped():
                    with tvm_ffi.use_raw_stream(dev, stream):
                        rope(t(q), t(rope_k), t(rope_v), t(mask), t(new_k), t(new_v), t(pos), t(cos), t(sin), shape,
                             t(y_rope), t(ws_rope))

                y_rope.fill_(float("nan"))
                roped()
                with tvm_ffi.use_raw_stream(dev, stream):
                    append(t(q_rot), t(want_k), t(want_v), t(mask), t(k_rot), t(new_v), t(pos), shape, t(y_want), t(ws))
                torch.cuda.synchronize()
                row["rope_equal"] = (torch.equal(rope_k, want_k) and torch.equal(rope_v, want_v)
                                     and torch.equal(y_rope, y_want))
                row["rope_max_diff"] = (y_rope.float() - y_want.float()).abs().max().item()
                row["rope_us"] = gpu_args.back_to_back_us(roped, args.reps)
                ok = ok and row["rope_equal"]
            row["ok"] = ok
            rows.append(row)
    with open(os.path.join(args.out, "append_check.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "cases": rows}, f, indent=1)
    print(f"{'case':11} {'dtype':9} {'caches':6} {'=split':6} {'rel L2':>9} {'append us':>9} {'split us':>9} "
          f"{'=rope':6} {'rope us':>8}")
    for r in rows:
        print(f"{r['case']:11} {r['dtype']:9} {str(r['caches_written']):6} {str(r['equals_split']):6} "
              f"{r['rel_l2']:9.2e} {r['append_us']:9.2f} {r['split_us']:9.2f} {str(r.get('rope_equal', '-')):6} "
              f"{r.get('rope_us', float('nan')):8.2f}")
    bad = [r for r in rows if not r["ok"]]
    print(f"append_check: {len(rows) - len(bad)}/{len(rows)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
