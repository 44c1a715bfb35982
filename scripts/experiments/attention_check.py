"""Experiment: the fused attention kernels (nimble.attention.sdpa / sdpa_bias, the split-key
split_sdpa / split_sdpa_bias, and the tile kernel tile_sdpa / tile_sdpa_bias) against a float64 PyTorch reference, and timed against PyTorch's own fused attention
(F.scaled_dot_product_attention) on the same operands, in fp32, fp16 and bf16 (16-bit with an fp32 padding
mask at finfo(fp32).min, as the precision policy leaves a transformers mask).

cuDNN's SDPA is checked and timed on the 16-bit cases: without a mask (nimble.attention.cudnn_sdpa), and with one or
grouped K/V heads (cudnn_bias_sdpa; an fp32 causal mask read as it is, any other converted first, and every case
once more with NIMBLE_CUDNN_BIAS_CONVERT=1, the conversion forced; the causal cases also with cuDNN's causal mask on
top, cudnn_bias_causal_sdpa, and the padding mask alone as one row of keys with cuDNN's causal mask as part of the
call, cudnn_key_causal_sdpa; PyTorch's own causal kernel without a mask, ``is_causal=True``, timed beside them).

The tile kernel is checked and timed with the rows per block it chooses, then with each R it can take
(NIMBLE_ATTENTION_TILE_ROWS=8, 16, 32; an R whose shared memory does not fit is skipped). A case whose
head does not fit shared memory at all (long_tiled) runs the row-per-warp kernel inside the tile call:
the table says "fallback".

Q, K and V are read the way the provider hands them over: as strided views of one packed QKV tensor
[B, S, 3, H, D] (timm) or of three [B, S, H, D] tensors (Hugging Face), the output written as
[B, S, H, D]; a padding mask [B, 1, 1, S] for the BERT shapes.

    bash scripts/gpu_session.sh "experiment attention_check 120"
    bash scripts/gpu_session.sh "experiment attention_check 60 --cases gpt2_512,qwen_gqa_512 --dtypes float16"

Writes DIR/attention_check.json; prints per case the relative L2 error against float64 and the
microseconds per call (kernels back to back, the host enqueue hidden behind a GPU sleep), and each kernel's own
GPU time as CUPTI records it (torch.profiler; `*_kernel_us`): what it costs inside a CUDA graph.
"""
from __future__ import annotations

import json
import os
import struct

import gpu_args  # the shared command line, beside this script in scripts/experiments/

# (name, B, H, S, D, packed QKV, mask[, Sk: keys, when not S[, query heads per KV head]])
CASES = [
    ("vit_s", 1, 6, 197, 64, True, False), ("vit_b", 1, 12, 197, 64, True, False),
    ("bert_base", 1, 12, 128, 64, False, True), ("odd", 2, 3, 37, 40, False, True),
    ("vit_s_b8", 8, 6, 197, 64, True, False), ("d128", 1, 4, 77, 128, False, False),
    ("one_block_1tile", 1, 1, 8, 64, False, False, 32), ("one_block_7tiles", 1, 1, 8, 64, False, False, 197),
    ("long_tiled", 1, 2, 1500, 64, False, True),  # keys past shared memory: the tiled kernel
    # decode steps: one query row over a cache of Sk slots, its last quarter masked (16-bit: the decode kernel)
    ("decode_gpt2", 1, 12, 1, 64, False, True, 384), ("decode_odd", 1, 12, 1, 64, False, True, 203),
    ("decode_b4", 4, 12, 1, 64, False, True, 384), ("decode_long", 1, 12, 1, 64, False, True, 4000),
    ("decode_d128", 1, 4, 1, 128, False, True, 300), ("decode_nomask", 1, 12, 1, 64, False, False, 190),
    ("decode_gqa", 1, 14, 1, 64, False, True, 384, 7),  # Qwen2.5-0.5B's 14 query heads over 2 KV heads
    # decoders' full sequences: a causal + padding mask [B, 1, S, S] (cuDNN reads it as it is in fp32)
    ("gpt2_128", 1, 12, 128, 64, False, "causal"), ("gpt2_512", 1, 12, 512, 64, False, "causal"),
    ("qwen_gqa_128", 1, 14, 128, 64, False, "causal", 128, 7),
    ("qwen_gqa_512", 1, 14, 512, 64, False, "causal", 512, 7),
]
CUDNN_CONVERT_ENV = "NIMBLE_CUDNN_BIAS_CONVERT"


TILE_ROWS = (8, 16, 32)
TILE_ENV = "NIMBLE_ATTENTION_TILE_ROWS"
CLUSTER_SPLITS = (1, 2, 4, 8)
CLUSTER_ENV = "NIMBLE_ATTENTION_CLUSTER"


def tile_bytes(rows: int, sk: int, d: int, dv: int) -> int:
    """The tile kernel's shared memory for R = rows (codegen/vendor/attention_tile.h, MakeTileLayout)."""
    def odd_quads(n):
        return n if (n // 4) % 2 else n + 4

    dp, vdp, skp = -(-d // 4) * 4, -(-dv // 4) * 4, -(-sk // 4) * 4
    kp, sp = odd_quads(dp), odd_quads(skp)
    return 4 * (rows * kp + skp * max(kp, vdp) + rows * sp + -(-rows // 4) * 4)


def main(argv=None) -> int:
    import argparse

    only = argparse.ArgumentParser(add_help=False)
    only.add_argument("--cases", help="NAME,... of CASES (default: all)")
    only.add_argument("--dtypes", default="float32,float16,bfloat16", help="of float32, float16, bfloat16")
    only, argv = only.parse_known_args(argv)
    args = gpu_args.parse_kernel_bench(__doc__, argv, "out/attention_check")
    import torch
    import torch.nn.functional as F
    import tvm_ffi

    from tvm_nimble.contract import vendor_abi

    sdpa = tvm_ffi.get_global_func(vendor_abi.ATTENTION_SDPA)
    sdpa_bias = tvm_ffi.get_global_func(vendor_abi.ATTENTION_SDPA_BIAS)
    split = tvm_ffi.get_global_func(vendor_abi.ATTENTION_SPLIT_SDPA)
    split_bias = tvm_ffi.get_global_func(vendor_abi.ATTENTION_SPLIT_SDPA_BIAS)
    cudnn_sdpa = tvm_ffi.get_global_func(vendor_abi.ATTENTION_CUDNN_SDPA)
    cudnn_bias = tvm_ffi.get_global_func(vendor_abi.ATTENTION_CUDNN_BIAS_SDPA)
    cudnn_causal = tvm_ffi.get_global_func(vendor_abi.ATTENTION_CUDNN_BIAS_CAUSAL_SDPA)
    cudnn_key_causal = tvm_ffi.get_global_func(vendor_abi.ATTENTION_CUDNN_KEY_CAUSAL_SDPA)
    tile = tvm_ffi.get_global_func(vendor_abi.ATTENTION_TILE_SDPA)
    tile_bias = tvm_ffi.get_global_func(vendor_abi.ATTENTION_TILE_SDPA_BIAS)
    cluster = tvm_ffi.get_global_func(vendor_abi.ATTENTION_CLUSTER_SDPA)
    cluster_bias = tvm_ffi.get_global_func(vendor_abi.ATTENTION_CLUSTER_SDPA_BIAS)
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    os.environ.pop(TILE_ENV, None)
    os.environ.pop(CLUSTER_ENV, None)
    os.environ.pop(CUDNN_CONVERT_ENV, None)
    big_ws = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    dev = tvm_ffi.device("cuda", 0)
    ws = torch.empty(1, dtype=torch.uint8, device="cuda")
    t = tvm_ffi.from_dlpack
    gen = torch.Generator(device="cuda").manual_seed(0)

    rows = []
    cases = [c for c in CASES if only.cases is None or c[0] in only.cases.split(",")]
    for dtype in [getattr(torch, d) for d in only.dtypes.split(",")]:
        for name, B, H, S, D, packed, masked, *rest in cases:
            Sk = rest[0] if rest else S
            group = rest[1] if len(rest) > 1 else 1
            scale = D ** -0.5
            if packed:
                qkv = torch.randn(B, S, 3, H, D, device="cuda", generator=gen).to(dtype)
                tensors = [qkv, qkv, qkv]
                q4, k4, v4 = (qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
                offs = [0, H * D, 2 * H * D]
                st = kst = [S * 3 * H * D, D, 3 * H * D]
            else:
                hkv = H // group
                tensors = [torch.randn(B, n, h, D, device="cuda", generator=gen).to(dtype)
                           for n, h in ((S, H), (Sk, hkv), (Sk, hkv))]
                q4, k4, v4 = (x.permute(0, 2, 1, 3) for x in tensors)
                k4, v4 = (x.repeat_interleave(group, dim=1) for x in (k4, v4))  # query head h reads KV head h // g
                offs = [0, 0, 0]
                st = [S * H * D, D, H * D]
                kst = [Sk * hkv * D, D, hkv * D]
            mask = key_mask = None
            if masked:
                keep = torch.ones(B, Sk, device="cuda")
                keep[:, Sk - Sk // 4:] = 0  # the last quarter is padding
                # a 16-bit model's mask stays fp32 (the precision policy), at finfo(fp32).min as in transformers
                low = -10000.0 if dtype == torch.float32 else torch.finfo(torch.float32).min
                key_mask = ((1.0 - keep) * low).view(B, 1, 1, Sk)  # the padding alone: one row of keys
                if masked == "causal":  # and key j > query i + Sk - S masked: [B, 1, S, Sk]
                    keep = keep.view(B, 1, 1, Sk) * torch.ones(S, Sk, device="cuda").tril(Sk - S)
                mask = ((1.0 - keep) * low).view(B, 1, -1, Sk)
            y = torch.empty(B, S, H, D, device="cuda", dtype=dtype)
            attrs = [B, H, S, Sk, D, D]
            for off, strides in zip(offs, (st, kst, kst)):
                attrs += [off, *strides]
            attrs += [S * H * D, D, H * D]
            if masked == "causal":
                attrs += [S * Sk, 0, Sk, 1]
            else:
                attrs += [Sk, 0, 0, 1] if masked else [0, 0, 0, 0]
            attrs.append(struct.unpack("<I", struct.pack("<f", scale))[0])
            if group > 1:
                attrs.append(group)
            shape = tvm_ffi.Shape(attrs)
            key_shape = tvm_ffi.Shape(attrs[:21] + [Sk, 0, 0, 1] + attrs[25:])  # the mask strides of key_mask
            targs = [t(x) for x in tensors]
            stream = torch.cuda.current_stream().cuda_stream

            def caller(plain, biased, workspace=ws, keys=False):  # one of our calls on this case's operands and attrs
                # keys: the padding mask alone (one row of keys broadcast over the queries), for cudnn_key_causal_sdpa
                m, a = (key_mask, key_shape) if keys else (mask, shape)

                def call():
                    with tvm_ffi.use_raw_stream(dev, stream):
                        if masked:
                            biased(*targs, t(m), a, t(y), t(workspace))
                        else:
                            plain(*targs, shape, t(y), t(workspace))
                return call

            ours = caller(sdpa, sdpa_bias)  # the row-per-warp kernel (provider attention)
            ours()
            torch.cuda.synchronize()
            ref = F.scaled_dot_product_attention(q4.double(), k4.double(), v4.double(),
                                                 attn_mask=None if mask is None else mask.double(), scale=scale)
            ref = ref.permute(0, 2, 1, 3)
            err = ((y.double() - ref).norm() / ref.norm()).item()

            def checked(call):  # (rel L2 against float64, us back to back, us of kernel time, the kernels that ran)
                y.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                us, names = gpu_args.kernel_us(call)
                return (((y.double() - ref).norm() / ref.norm()).item(), gpu_args.back_to_back_us(call, args.reps), us,
                        sorted(names))

            tmask = None if mask is None else mask.to(dtype)  # PyTorch takes a mask of q's dtype

            def theirs():
                F.scaled_dot_product_attention(q4, k4, v4, attn_mask=tmask, scale=scale)

            torch_err = ((F.scaled_dot_product_attention(q4, k4, v4, attn_mask=tmask, scale=scale).permute(0, 2, 1, 3)
                          .double() - ref).norm() / ref.norm()).item()
            row = {"case": name, "dtype": str(dtype).split(".")[-1], "rel_l2": err, "torch_rel_l2": torch_err,
                   "nimble_us": gpu_args.back_to_back_us(ours, args.reps),
                   "torch_us": gpu_args.back_to_back_us(theirs, args.reps)}
            row["nimble_kernel_us"], _ = gpu_args.kernel_us(ours)
            row["torch_kernel_us"], row["torch_kernels"] = gpu_args.kernel_us(theirs)
            # the split-key kernel (provider attention_split), same operands and attrs
            row["split_rel_l2"], row["split_us"], row["split_kernel_us"], _ = checked(caller(split, split_bias))

            def check_tile():  # the tile kernel (provider attention_tile)
                return checked(caller(tile, tile_bias))[:3]

            fits = [r for r in TILE_ROWS if tile_bytes(r, Sk, D, D) <= optin]
            row["tile_fallback"] = not fits  # the row-per-warp kernel, inside the tile call
            row["tile_rel_l2"], row["tile_us"], row["tile_kernel_us"] = check_tile()  # the R the launch chooses
            for r in fits:
                os.environ[TILE_ENV] = str(r)
                try:
                    row[f"tile_r{r}_rel_l2"], row[f"tile_r{r}_us"], row[f"tile_r{r}_kernel_us"] = check_tile()
                finally:
                    os.environ.pop(TILE_ENV, None)
            if dtype == torch.float32:  # the key-split kernel (fp32; a call it does not take runs the tile kernel)
                (row["cluster_rel_l2"], row["cluster_us"], row["cluster_kernel_us"],
                 row["cluster_kernels"]) = checked(caller(cluster, cluster_bias))
                for c in CLUSTER_SPLITS:
                    if -(-Sk // c) > 64:
                        continue
                    os.environ[CLUSTER_ENV] = str(c)
                    try:
                        (row[f"cluster_c{c}_rel_l2"], row[f"cluster_c{c}_us"], row[f"cluster_c{c}_kernel_us"],
                         _) = checked(caller(cluster, cluster_bias))
                    finally:
                        os.environ.pop(CLUSTER_ENV, None)
            if dtype != torch.float32 and not masked and D % 8 == 0:  # cuDNN's SDPA, the other 16-bit provider
                try:
                    (row["cudnn_rel_l2"], row["cudnn_us"], row["cudnn_kernel_us"],
                     _) = checked(caller(cudnn_sdpa, None, big_ws))
                except Exception as e:  # noqa: BLE001
                    row["cudnn_error"] = " ".join(str(e).split())[:300]
            if dtype != torch.float32 and masked and S > 1 and D % 8 == 0:  # cuDNN with the mask
                # (key, function, the conversion forced, the padding alone as keys)
                variants = [("cudnn_bias", cudnn_bias, False, False), ("cudnn_bias_converted", cudnn_bias, True, False)]
                if masked == "causal":  # and cuDNN's causal mask on top, as the provider emits it for decoders
                    variants.append(("cudnn_bias_causal", cudnn_causal, False, False))
                    if S == Sk:  # the padding mask alone, cuDNN's causal mask part of the call
                        variants.append(("cudnn_key_causal", cudnn_key_causal, False, True))
                        row["torch_causal_kernel_us"], _ = gpu_args.kernel_us(
                            lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale))
                        print(f"  PyTorch is_causal=True, no mask: {row['torch_causal_kernel_us']:.1f} us kernel",
                              flush=True)
                for key, fn, convert, keys in variants:
                    if convert:
                        os.environ[CUDNN_CONVERT_ENV] = "1"
                    try:
                        (row[f"{key}_rel_l2"], row[f"{key}_us"], row[f"{key}_kernel_us"],
                         row[f"{key}_kernels"]) = checked(caller(cudnn_sdpa, fn, big_ws, keys))
                    except Exception as e:  # noqa: BLE001
                        row[f"{key}_error"] = " ".join(str(e).split())[:300]
                    finally:
                        os.environ.pop(CUDNN_CONVERT_ENV, None)
                    if f"{key}_us" in row:
                        print(f"  {key}: rel L2 {row[f'{key}_rel_l2']:.2e}, {row[f'{key}_kernel_us']:.1f} us kernel, "
                              f"{row[f'{key}_us']:.1f} us back to back, ran {row[f'{key}_kernels']}", flush=True)
            rows.append(row)
            per_r = " ".join(f"R{n} {row[f'tile_r{n}_kernel_us']:.1f}" for n in TILE_ROWS if f"tile_r{n}_kernel_us" in row)
            print(f"  kernel time (CUPTI, us): row-per-warp {row['nimble_kernel_us']:.1f}, split-key "
                  f"{row['split_kernel_us']:.1f}, tile {row['tile_kernel_us']:.1f} ({per_r}), PyTorch "
                  f"{row['torch_kernel_us']:.1f}" + (f", cuDNN {row['cudnn_kernel_us']:.1f}" if "cudnn_kernel_us" in row
                                                     else ""), flush=True)
            if "cluster_kernel_us" in row:
                per_c = " ".join(f"C{c} {row[f'cluster_c{c}_kernel_us']:.1f} ({row[f'cluster_c{c}_rel_l2']:.1e})"
                                 for c in CLUSTER_SPLITS if f"cluster_c{c}_kernel_us" in row)
                print(f"  key-split: {row['cluster_kernel_us']:.1f} us kernel, {row['cluster_us']:.1f} us back to back, "
                      f"rel L2 {row['cluster_rel_l2']:.2e} [{per_c}] ran {row['cluster_kernels']}", flush=True)
            print(f"{name} {row['dtype']}: rel L2 {row['rel_l2']:.2e}, split-key {row['split_rel_l2']:.2e}, "
                  f"tile {row['tile_rel_l2']:.2e}; {row['nimble_us']:.1f} / {row['split_us']:.1f} / "
                  f"{row['tile_us']:.1f} us, PyTorch {row['torch_us']:.1f} us", flush=True)
    with open(os.path.join(args.out, "attention_check.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    print(f"{'case':10} {'dtype':8} {'rel L2':>9} {'torch L2':>9} {'nimble us':>10} {'torch us':>9}")
    ok = True
    for r in rows:
        bound = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 3e-2}[r["dtype"]]
        ok &= r["rel_l2"] < bound and r["split_rel_l2"] < bound
        extra = (f"  split-key {r['split_rel_l2']:.2e} {r['split_us']:.2f} us "
                 f"{'ok' if r['split_rel_l2'] < bound else 'FAIL'}")
        tile_errs = [r["tile_rel_l2"]] + [r[f"tile_r{n}_rel_l2"] for n in TILE_ROWS if f"tile_r{n}_rel_l2" in r]
        ok &= all(e < bound for e in tile_errs)
        ok &= all(r[key] < bound for key in r if key.startswith("cluster") and key.endswith("rel_l2"))
        per_r = " / ".join(f"R{n} {r[f'tile_r{n}_us']:.2f}" for n in TILE_ROWS if f"tile_r{n}_us" in r)
        extra += (f"  tile {r['tile_rel_l2']:.2e} {r['tile_us']:.2f} us "
                  f"({'fallback' if r['tile_fallback'] else per_r}; worst L2 {max(tile_errs):.2e}) "
                  f"{'ok' if all(e < bound for e in tile_errs) else 'FAIL'}")
        if "cudnn_us" in r:
            ok &= r["cudnn_rel_l2"] < bound
            extra += f"  cuDNN SDPA {r['cudnn_rel_l2']:.2e} {r['cudnn_us']:.2f} us"
        elif "cudnn_error" in r:
            ok = False
            extra += f"  cuDNN SDPA error: {r['cudnn_error']}"
        for key in ("cudnn_bias", "cudnn_bias_converted", "cudnn_bias_causal", "cudnn_key_causal"):
            if f"{key}_us" in r:
                ok &= r[f"{key}_rel_l2"] < bound
                extra += f"  {key} {r[f'{key}_rel_l2']:.2e} {r[f'{key}_us']:.2f} us"
            elif f"{key}_error" in r:
                ok = False
                extra += f"  {key} error: {r[f'{key}_error']}"
        print(f"{r['case']:10} {r['dtype']:8} {r['rel_l2']:9.2e} {r['torch_rel_l2']:9.2e} {r['nimble_us']:10.2f} "
              f"{r['torch_us']:9.2f} {'ok' if r['rel_l2'] < bound else 'FAIL'}{extra}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
