"""tvm-nimble train: a quick training run of a model with Nimble on random data, loss shown as it goes.

  tvm-nimble train zoo:inception --steps 20 --lr 0.01 --target llvm
  tvm-nimble train model.onnx --steps 100 --optimizer momentum --target cuda -o trained.onnx

Inputs and labels are seeded standard-normal batches (a smoke run of the training step, not a data
pipeline); ``-o`` writes the model with the trained weights as ONNX.
"""
from __future__ import annotations

import argparse


def main(argv=None):
    from tvm_nimble.cli.options import target_args
    from tvm_nimble.compiler.training import LOSSES, OPTIMIZERS

    ap = argparse.ArgumentParser(prog="tvm-nimble train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="ONNX file or zoo:<name> (the zoo's small size, --batch rows)")
    target_args(ap, default="llvm")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1, help="batch rows for zoo models (ONNX files keep their own)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--loss", choices=LOSSES, default="mse")
    ap.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd")
    ap.add_argument("-o", "--output", help="write the trained model here (ONNX)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")

    import numpy as np
    from tqdm import tqdm

    from tvm_nimble import zoo
    from tvm_nimble.compiler.target import resolve_target
    from tvm_nimble.compiler.training import build_training

    model = zoo.get_model(args.model[4:], batch=args.batch) if args.model.startswith("zoo:") else args.model
    trainer = build_training(model, resolve_target(args.target, args.arch), loss=args.loss,
                             optimizer=args.optimizer, lr=args.lr)
    plan = trainer.module.plan
    print(f"training step: {len(plan.launches)} kernels on {plan.num_streams} stream(s)")
    x_shapes = [(plan.tensors[t].shape, plan.tensors[t].dtype) for t in plan.inputs[:trainer.num_inputs]]
    label_shape, label_dtype = trainer.label_spec
    rng = np.random.default_rng(0)
    bar = tqdm(range(args.steps), desc="training", unit="step")
    for _ in bar:
        xs = [rng.standard_normal(s).astype(d) for s, d in x_shapes]
        if label_dtype == "int64":
            y = rng.integers(0, 2, size=label_shape).astype("int64")
        else:
            y = rng.standard_normal(label_shape).astype(label_dtype)
        bar.set_postfix_str(f"loss {trainer.step(xs, y):.4g}")
    bar.close()
    if args.output:
        print(f"wrote {trainer.export_onnx(args.output)} (the model with its trained weights)")
    return 0


if __name__ == "__main__":
    main()
