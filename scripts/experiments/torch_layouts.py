"""Experiment: how much faster half precision is than TF32 for PyTorch itself at small batch, in NCHW and in
channels-last (NHWC) memory format, as CUDA graphs (issue #31 asks fp16/bf16 builds >= 1.3x their tf32 build on
inception_v3 and nasnetalarge; cuDNN's fast half-precision convolutions want NHWC). No TVM: this says whether
an NHWC layout pass can pay at all before one is written.

    bash scripts/gpu_session.sh "experiment torch_layouts 240 --models tv:inception_v3,timm:nasnetalarge"

Writes DIR/torch_layouts.json (per model and batch: ms per forward of each precision x memory format, cuDNN
benchmark mode on) and prints a table with each row's speed-up over tf32 NCHW.
"""
from __future__ import annotations

import json
import os

import gpu_args  # the shared command line, beside this script in scripts/experiments/

VARIANTS = [("tf32", "nchw"), ("tf32", "nhwc"), ("fp16", "nchw"), ("fp16", "nhwc"), ("bf16", "nchw"),
            ("bf16", "nhwc")]


def _torch_model(spec: str):
    import timm
    import torchvision

    kind, name = spec.split(":", 1)
    if kind == "tv":
        kw = {"aux_logits": False, "init_weights": True} if name in ("inception_v3", "googlenet") else {}
        return getattr(torchvision.models, name)(weights=None, **kw)
    if kind == "timm":
        return timm.create_model(name, pretrained=False)
    raise SystemExit(f"torch_layouts: {spec}: give tv:NAME or timm:NAME")


def main(argv=None) -> int:
    args, _ = gpu_args.parse(__doc__, argv, "tv:inception_v3", batches_and_kernels=True)
    import torch

    torch.backends.cudnn.benchmark = True
    rows = []
    for spec in args.models.split(","):
        torch.manual_seed(0)
        base = _torch_model(spec).eval().cuda()
        size = 299 if "inception" in spec else (331 if "nasnet" in spec else 224)
        for batch in [int(b) for b in args.batch.split(",")]:
            x = torch.randn(batch, 3, size, size, device="cuda")
            for precision, layout in VARIANTS:
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
                dtype = {"tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
                fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
                model = base.to(dtype=dtype, memory_format=fmt)
                xi = x.to(dtype=dtype).contiguous(memory_format=fmt)
                with torch.inference_mode():
                    ms = gpu_args.graph_us(lambda: model(xi), n=10, reps=20) / 1000
                rows.append({"model": spec, "batch": batch, "precision": precision, "layout": layout, "ms": ms})
                print(f"{spec} b{batch} {precision} {layout}: {ms:.3f} ms", flush=True)
    with open(os.path.join(args.out, "torch_layouts.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"\n{'model':24s} {'batch':>5s} {'precision':9s} {'layout':6s} {'ms':>8s} {'vs tf32 nchw':>12s}")
    for r in rows:
        ref = next(q["ms"] for q in rows if q["model"] == r["model"] and q["batch"] == r["batch"]
                   and (q["precision"], q["layout"]) == ("tf32", "nchw"))
        print(f"{r['model']:24s} {r['batch']:5d} {r['precision']:9s} {r['layout']:6s} {r['ms']:8.3f} {ref / r['ms']:11.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
