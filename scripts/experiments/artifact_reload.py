"""Experiment: a reduced-precision artifact exported, reloaded in a fresh process and run gives the build's output
(issue #54: bf16 artifacts did not load). Per model and precision: build (kernels best on a GPU), export, then a
new Python process loads the artifact with the TVM runtime and runs it on a seeded input; its output is compared
with the building process's and with PyTorch's fp32 output of the same model (relative L2).

    bash scripts/gpu_session.sh "experiment artifact_reload 400 --models tv:inception_v3 --precisions fp16,bf16"
    python3 scripts/experiments/artifact_reload.py --models zoo:inception --target llvm --precisions bf16 --out DIR

Writes DIR/artifact_reload.json and prints one line per artifact.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

import gpu_args  # the shared command line, beside this script in scripts/experiments/

_RUN = """
import sys, numpy as np, tvm_nimble
ex = tvm_nimble.NimbleExecutor(sys.argv[1])
np.save(sys.argv[3], ex(np.load(sys.argv[2]))[0].numpy())
"""


def _rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _torch_reference(spec: str, x: np.ndarray):
    """PyTorch's fp32 output (TF32 off) of a tv:/timm: model, or None for other models."""
    if not spec.startswith(("tv:", "timm:")):
        return None
    import torch

    from tvm_nimble.cli.bench import model_builders

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = model_builders(spec)[2]().eval()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.no_grad():
        return model.to(dev)(torch.from_numpy(x).to(dev)).float().cpu().numpy()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="zoo:inception")
    ap.add_argument("--precisions", default="fp16,bf16")
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    ap.add_argument("--out", required=True)
    gpu_args.add_small(ap)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import tvm_nimble
    from tvm_nimble.cli.models import load_model

    rows = []
    for spec in args.models.split(","):
        name, model = load_model(spec, small=args.small)
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = np.random.default_rng(0).standard_normal(shape).astype("float32")
        x_path = os.path.join(args.out, f"{name}-x.npy")
        np.save(x_path, x)
        ref = _torch_reference(spec, x)
        for precision in args.precisions.split(","):
            result = tvm_nimble.build(model, args.target, precision=precision,
                                      kernels="best" if args.target == "cuda" else "tvm")
            here = tvm_nimble.NimbleExecutor(result)(x)[0].numpy()
            art = os.path.join(args.out, f"{name}-{precision}.nimble")
            result.export(art, overwrite=True)
            y_path = os.path.join(args.out, f"{name}-{precision}-y.npy")
            proc = subprocess.run([sys.executable, "-c", _RUN, art, x_path, y_path], capture_output=True, text=True)
            row = {"model": name, "precision": precision, "reloaded": proc.returncode == 0}
            if proc.returncode == 0:
                y = np.load(y_path)
                row["vs_build"] = _rel_l2(y, here)
                row["finite"] = bool(np.isfinite(y).all())
                if ref is not None:
                    row["vs_torch_fp32"] = _rel_l2(y, ref)
            else:
                row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
            rows.append(row)
            print("artifact_reload " + json.dumps(row), flush=True)
            with open(os.path.join(args.out, "artifact_reload.json"), "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
