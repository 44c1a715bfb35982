"""``tvm-nimble zoo``: write one of the built-in zoo models (``tvm_nimble.zoo``) as an ONNX file.

  tvm-nimble zoo --list
  tvm-nimble zoo inception -o model.onnx
  tvm-nimble zoo resnet -o resnet.onnx --batch 8 --hw 32

The models are small and built in code with seeded weights: one float32 input named ``input`` of
shape (batch, 3, hw, hw) and one output ``output`` of shape (batch, 10). The defaults (batch 1, hw 16;
random_dag 8) compile on a CPU in seconds. ``zoo:NAME`` in ``tvm-nimble tune`` / ``bench`` means the
larger benchmark size instead.
"""
from __future__ import annotations

import argparse
import os

#: One line per zoo model for ``--list`` (a zoo model missing here shows its docstring's first line).
SUMMARY = {
    "inception": "Inception-style blocks: four parallel conv branches joined by a concat (multi-branch)",
    "nasnet": "NASNet-A-style cells: separable convs, pools and skip inputs summed pairwise (multi-branch)",
    "resnet": "ResNet basic blocks in a chain (conv-relu-conv, residual add)",
    "mobilenet": "MobileNetV2 inverted-residual blocks in a chain (expand, depthwise, project)",
    "densenet": "DenseNet blocks: each layer's output concatenated onto all earlier features (nested concats)",
    "random_dag": "a seeded random DAG of convs, adds, relus and concats",
    "vit": "a small ViT: patch conv, pre-norm attention blocks, GELU MLP (hw a multiple of 4)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="zoo model (tvm-nimble zoo --list names them)")
    p.add_argument("-o", "--output", help="ONNX file to write (default: NAME.onnx here)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the input (default 1)")
    p.add_argument("--hw", type=int, help="input height and width (default: the model's, 16; random_dag 8)")
    p.add_argument("--list", action="store_true", help="list the zoo models, one line each")


def _summary(name: str, fn) -> str:
    if name in SUMMARY:
        return SUMMARY[name]
    return ((fn.__doc__ or "").strip().splitlines() or [""])[0].rstrip(".")


def run(args: argparse.Namespace) -> None:
    import inspect

    from tvm_nimble import zoo

    names = sorted(zoo.ZOO)
    if args.list:
        width = max(map(len, names))
        for name in names:
            fn = zoo.ZOO[name]
            hw = inspect.signature(fn).parameters["hw"].default
            print(f"{name:<{width}}  {_summary(name, fn)}; input 1x3x{hw}x{hw}")
        return
    if not args.name:
        raise _usage(f"give a zoo model name ({', '.join(names)}) or --list")
    if args.name not in zoo.ZOO:
        raise _usage(f"unknown zoo model {args.name!r}: valid names are {', '.join(names)}")
    kw = {"batch": args.batch}
    if args.hw is not None:
        kw["hw"] = args.hw
    model = zoo.get_model(args.name, **kw)  # a bad --batch/--hw is a ValueError: one line, exit 1
    path = args.output or f"{args.name}.onnx"
    if os.path.isdir(path):
        raise ValueError(f"-o {path} is a directory; give an ONNX file name, e.g. {os.path.join(path, args.name + '.onnx')}")
    try:
        zoo.save(model, path)
    except OSError as err:
        raise ValueError(f"cannot write {path}: {err.strerror or err}") from None
    (iname, ishape), = zoo.input_shape(model).items()
    oshape = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    print(f"wrote {path}: zoo {args.name}, input {iname!r} float32{list(ishape)}, "
          f"output {model.graph.output[0].name!r} float32{oshape}, {len(model.graph.node)} operators")


def _usage(msg: str) -> SystemExit:
    import sys

    print(f"tvm-nimble: usage error: {msg}", file=sys.stderr)
    return SystemExit(2)
