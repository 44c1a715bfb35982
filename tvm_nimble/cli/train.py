"""tvm-nimble train: a quick training run of a model with Nimble on random data, loss shown as it goes.

  tvm-nimble train zoo:inception --steps 20 --lr 0.01 --target llvm
  tvm-nimble train model.onnx --steps 100 --optimizer momentum --target cuda -o trained.onnx

Inputs and labels are seeded random batches (standard-normal floats, integers 0 or 1: a smoke run of
the training step, not a data pipeline); ``-o`` writes the model with the trained weights as ONNX.
The mse loss is the mean over the output's elements (as PyTorch's MSELoss); cross_entropy is the sum
over the batch. A loss that becomes inf or nan stops the run (exit 1).
"""
from __future__ import annotations

import argparse
import math
import sys


def _usage(msg: str) -> SystemExit:
    """A usage error in one line (argparse's own adds the whole usage text), exit 2."""
    print(f"tvm-nimble: usage error: {msg}", file=sys.stderr)
    return SystemExit(2)


def main(argv=None):
    from tvm_nimble.cli.options import target_args
    from tvm_nimble.compiler.optimizers import OPTIMIZERS
    from tvm_nimble.compiler.training import LOSSES

    ap = argparse.ArgumentParser(prog="tvm-nimble train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="ONNX file or zoo:<name> (the zoo's small size, --batch rows)")
    target_args(ap, default="llvm")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1, help="batch rows for zoo models (ONNX files keep their own)")
    ap.add_argument("--lr", type=float, default=0.01, help="learning rate, positive (default 0.01)")
    ap.add_argument("--loss", choices=LOSSES, default="mse")
    ap.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                    help="as PyTorch's: sgd, momentum (SGD with 0.9), adam, adamw (default sgd)")
    ap.add_argument("--weight-decay", type=float, metavar="W",
                    help="weight decay, >= 0 (default: PyTorch's for the optimizer: 0.01 for adamw, else 0); "
                         "adamw decouples it from the gradient, the others add W * weight to it")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32",
                    help="fp32 (default), tf32 (TF32 tensor cores in the vendor kernels) or bf16 (forward and "
                         "backward in bfloat16, float32 master weights and optimizer)")
    ap.add_argument("--kernels", choices=["auto", "tvm", "vendor", "best"], default="auto",
                    help="auto (default): best on a CUDA machine with the vendor wheels, TVM's kernels on a CPU; "
                         "tvm: TVM's kernels; vendor: convolutions and their gradients on cuDNN (CUDA); best: "
                         "each operator on whichever measured faster on this GPU")
    ap.add_argument("-o", "--output", help="write the trained model here (ONNX)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        raise _usage(f"--steps must be at least 1, got {args.steps}")
    if not (math.isfinite(args.lr) and args.lr > 0):  # a negative rate climbs the loss to inf, zero never moves
        raise _usage(f"--lr must be a positive number, got {args.lr:g}: e.g. --lr 0.01")
    if args.weight_decay is not None and not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        raise _usage(f"--weight-decay must be a number >= 0, got {args.weight_decay:g}: e.g. --weight-decay 0.01")

    import numpy as np

    from tvm_nimble import zoo
    from tvm_nimble.cli.progress import step_bar
    from tvm_nimble.compiler.target import resolve_target
    from tvm_nimble.compiler.training import build_training

    model = zoo.get_model(args.model[4:], batch=args.batch) if args.model.startswith("zoo:") else args.model
    trainer = build_training(model, resolve_target(args.target, args.arch), loss=args.loss,
                             optimizer=args.optimizer, lr=args.lr, weight_decay=args.weight_decay,
                             kernels=args.kernels, precision=args.precision)
    plan = trainer.module.plan
    print(f"training step: {len(plan.launches)} kernels on {plan.num_streams} stream(s)", flush=True)
    x_shapes = [(plan.tensors[t].shape, plan.tensors[t].dtype) for t in plan.inputs[:trainer.num_inputs]]
    label_shape, label_dtype = trainer.label_spec
    rng = np.random.default_rng(0)
    with step_bar(args.steps, "training") as bar:  # closed (its line ended) before a diverged loss's error
        for _ in range(args.steps):
            # integer inputs (token ids) are 0 or 1: valid rows of any embedding table, never negative
            xs = [rng.integers(0, 2, size=s).astype(d) if np.issubdtype(np.dtype(d), np.integer)
                  else rng.standard_normal(s).astype(d) for s, d in x_shapes]
            if label_dtype == "int64":
                y = rng.integers(0, 2, size=label_shape).astype("int64")
            else:
                y = rng.standard_normal(label_shape).astype(label_dtype)
            bar.set_postfix_str(f"loss {trainer.step(xs, y):.4g}", refresh=False)
            bar.update(1)
    if args.output:
        print(f"wrote {trainer.export_onnx(args.output)} (the model with its trained weights)")
    return 0


if __name__ == "__main__":
    main()
