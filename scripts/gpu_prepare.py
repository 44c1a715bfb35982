"""Build, on the development machine, everything a runtime-only GPU run needs.

For each model: the Nimble artifact for the GPU arch, stock TVM VM libraries (plain and with
TVM's CUDA graph) from the same kernels, seeded inputs and the ONNX reference outputs. The
GPU machine then runs ``scripts/gpu_validate.py`` with the TVM runtime only.

    python scripts/gpu_prepare.py --out out/gpu --arch sm_90 --models incept6,nasnet,resnet
    python scripts/gpu_prepare.py --out out/cpu --arch cpu --small   # CPU dry run of the whole path
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/gpu")
    ap.add_argument("--arch", default="sm_90", help="GPU arch, or 'cpu' for an llvm dry run")
    ap.add_argument("--small", action="store_true", help="the zoo's small default sizes")
    ap.add_argument("--models", default="incept6,nasnet,resnet", help="names of zoo.BENCH_MODELS")
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()

    import onnx
    import tvm
    from onnx.reference import ReferenceEvaluator

    from tvm_nimble import zoo
    from tvm_nimble.compiler.build import build
    from tvm_nimble.compiler.target import resolve_target
    from tvm_nimble.compiler.frontend import from_onnx
    from tvm_nimble.compiler.stock import build_stock_vm

    target = resolve_target({"kind": "llvm"} if args.arch == "cpu" else {"kind": "cuda", "arch": args.arch})
    os.makedirs(args.out, exist_ok=True)
    index = {}
    for name in args.models.split(","):
        _, builder, kw = zoo.bench_model_spec(name, batch=args.batch, small=args.small)
        model = zoo.get_model(builder, **kw)
        inputs = zoo.random_inputs(model, seed=0)
        ref = ReferenceEvaluator(model).run(None, inputs)
        mod = from_onnx(model)
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        t0 = time.time()
        # the stock VM libs use TVM kernels too; a rerun into the same --out rebuilds the artifact
        build(mod, target, kernels="tvm").export(os.path.join(d, "nimble"), overwrite=True)
        build_stock_vm(mod, target).export_library(os.path.join(d, "vm.so"))
        build_stock_vm(mod, target, cuda_graph=True).export_library(os.path.join(d, "vm_graph.so"))
        onnx.save(model, os.path.join(d, "model.onnx"))  # for tuning / benchmarking it on the GPU machine
        np.savez(os.path.join(d, "io.npz"), **{f"in_{k}": v for k, v in inputs.items()},
                 **{f"ref_{i}": r for i, r in enumerate(ref)})
        index[name] = {"inputs": list(inputs), "num_outputs": len(ref), "batch": args.batch, "zoo": [builder, kw]}
        print(f"{name}: built in {time.time() - t0:.1f}s -> {d}")
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump({"arch": args.arch, "tvm": tvm.__version__, "models": index}, f, indent=1)


if __name__ == "__main__":
    main()
