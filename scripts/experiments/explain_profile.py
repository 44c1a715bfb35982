"""`tvm-nimble explain --profile` on a benchmark model: builds the ONNX file (zoo:NAME, tv:NAME or
timm:NAME, as `bench` does), then runs explain with the timeline picture written to DIR/timeline_NAME.png.

    python3 scripts/gpu_explain_profile.py --models zoo:incept6,tv:inception_v3 --out DIR
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
    from tvm_nimble.cli.tune import _load
    from tvm_nimble.compiler.explain import explain_model

    os.makedirs(args.out, exist_ok=True)
    for spec in args.models.split(","):
        name, model = _load(spec)
        path = zoo.save(model, os.path.join(args.out, f"{name}.onnx"))
        print(f"== {spec}")
        print(explain_model(path, {"kind": "cuda"}, profile_png=os.path.join(args.out, f"timeline_{name}.png")))
        os.remove(path)


if __name__ == "__main__":
    main()
