"""Experiment: where a TF32 build's error comes from, beside PyTorch's own TF32 error (#31).

Why: nasnetalarge's TF32 build was further from PyTorch's fp32 output than PyTorch's own TF32 (over #31's 1.2x),
on the bench's one seeded input, with two different kernel mixes. This
measures it on several inputs and takes the build apart: for each --models net (tv: / timm:, built as the
bench builds it), the relative L2 error against PyTorch fp32 (TF32 off) on inputs of seeds 0..SEEDS-1, of
- PyTorch: TF32 in cuDNN and cuBLAS (the bench's peer), TF32 in cuDNN only, channels-last with both;
- Nimble, one stream, kernels=best: tf32 with every default provider, without cuBLASLt, with cuDNN's legacy
  calls only (no graph-API engines, no cuBLASLt), and fp32 (TF32 off: the build's own distance from PyTorch).

GPU only (PyTorch with CUDA): `experiment tf32_error 560 --models timm:nasnetalarge` (about 500 s on a fresh
machine). Findings: benchmarks/findings.md, 'Where nasnetalarge's TF32 error comes from'; raw:
benchmarks/raw/2026-11-27-h100-s23/call06-*.
Writes DIR/tf32_error.json; prints one line per system: each seed's error and its mean ratio to PyTorch TF32's.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

import gpu_args  # beside this script in scripts/experiments/

SEEDS = 4
#: (label, build options beyond kernels=best and one stream)
NIMBLE = [
    ("nimble tf32", {"precision": "tf32"}),
    ("nimble tf32, no cuBLASLt", {"precision": "tf32", "providers": ("cudnn", "cudnn_graph", "depthwise")}),
    ("nimble tf32, cuDNN legacy only", {"precision": "tf32", "providers": ("cudnn", "depthwise")}),
    ("nimble fp32", {"precision": "fp32"}),
]


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def torch_errors(torch_model, inputs: list[np.ndarray], refs: list[np.ndarray]) -> dict[str, list[float]]:
    import torch

    model = torch_model.float().eval().cuda()
    configs = {"torch tf32 (cuDNN + cuBLAS)": (True, True, False), "torch tf32 (cuDNN only)": (True, False, False),
               "torch tf32 channels-last": (True, True, True)}
    out = {}
    for label, (cudnn_tf32, matmul_tf32, channels_last) in configs.items():
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn_tf32, matmul_tf32
        m = model.to(memory_format=torch.channels_last) if channels_last else model.to(
            memory_format=torch.contiguous_format)
        errs = []
        with torch.no_grad():
            for x, ref in zip(inputs, refs):
                t = torch.from_numpy(x).cuda()
                t = t.to(memory_format=torch.channels_last) if channels_last else t
                errs.append(rel_l2(m(t).float().cpu().numpy(), ref))
        out[label] = errs
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    return out


def main(argv=None) -> None:
    args, target = gpu_args.parse(__doc__, argv, "timm:nasnetalarge")
    import torch

    from tvm_nimble import NimbleExecutor, build, zoo
    from tvm_nimble.bench.harness import torch_reference
    from tvm_nimble.cli.bench import model_builders

    results = {}
    for spec in args.models.split(","):
        name, onnx_builder, torch_builder = model_builders(spec)
        model = onnx_builder(batch=1)
        inputs = [list(zoo.random_inputs(model, seed=s).values())[0] for s in range(SEEDS)]
        refs = [o[0] for o in torch_reference(torch_builder(batch=1), [[x] for x in inputs])]
        errors = torch_errors(torch_builder(batch=1), inputs, refs)
        for label, options in NIMBLE:
            result = build(model, target, kernels="best", max_streams=1, **options)
            ex = NimbleExecutor(result, mode="cuda-graph")
            errors[label] = [rel_l2(ex(x)[0].numpy(), ref) for x, ref in zip(inputs, refs)]
            kinds = [l.kernel.split(".")[1] if l.kernel.startswith("nimble.") else "tvm" for l in result.plan.launches]
            errors[label + " kernels"] = {k: kinds.count(k) for k in sorted(set(kinds))}
            ex.close()
            torch.cuda.empty_cache()
        own = errors["torch tf32 (cuDNN + cuBLAS)"]
        results[name] = errors
        print(f"== {name}: relative L2 against PyTorch fp32 on seeds 0..{SEEDS - 1}; ratio = mean over seeds of "
              "error / PyTorch TF32's", flush=True)
        for label, errs in errors.items():
            if label.endswith(" kernels"):
                continue
            ratio = np.mean([e / o for e, o in zip(errs, own)])
            kernels = errors.get(label + " kernels", "")
            print(f"  {label:34s} " + " ".join(f"{e:.2e}" for e in errs) + f"   ratio {ratio:.2f}  {kernels}",
                  flush=True)
    with open(os.path.join(args.out, "tf32_error.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
