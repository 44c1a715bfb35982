"""Experiment: `tvm-nimble explain --profile` on benchmark models, on a GPU: builds the ONNX file
(zoo:NAME, tv:NAME or timm:NAME, as `bench` does), then runs explain with the measured and planned
timeline picture written to DIR/timeline_NAME.png.

Findings: benchmarks/findings.md, '`explain --profile` on the GPU'. Raw outputs: benchmarks/raw/2026-11-24-h100-s8/timeline_incept6.png, timeline_googlenet.png and
session_call1.log beside them.

    bash scripts/gpu_session.sh "experiment explain_profile 200 --models zoo:incept6,tv:googlenet"
"""
from __future__ import annotations

import argparse
import os


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="zoo:incept6")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from tvm_nimble import zoo
    from tvm_nimble.cli.models import load_model
    from tvm_nimble.compiler.explain import explain_model

    os.makedirs(args.out, exist_ok=True)
    for spec in args.models.split(","):
        name, model = load_model(spec)
        path = zoo.save(model, os.path.join(args.out, f"{name}.onnx"))
        print(f"== {spec}")
        print(explain_model(path, {"kind": "cuda"}, profile_png=os.path.join(args.out, f"timeline_{name}.png")))
        os.remove(path)


if __name__ == "__main__":
    main()
