"""`tvm-nimble bench` / scripts/benchmark.py: benchmark Nimble against stock TVM, PyTorch, torch.compile
and ONNX Runtime (TensorRT is not available: it is timed only where it is installed, which it cannot be on
our machines); append to results.csv in --out (default ./bench-results) and regenerate RESULTS.md and
results.png there. The repository's own tables are benchmarks/: maintainers merge rows into
benchmarks/results.csv and regenerate with `--report-only --out benchmarks`.

examples:
  tvm-nimble bench --models incept6,nasnet --batch 1              # zoo nets at benchmark size
  tvm-nimble bench --models incept6 --tuning-db tuning/sm_90/incept6 --with-untuned   # tuned vs untuned
  tvm-nimble bench --models tv:resnet50,tv:inception_v3 --target cuda   # torchvision (GPU machine)
  tvm-nimble bench --models tv:googlenet --precision fp32,fp16,bf16 --batch 1,8   # a table per precision
  tvm-nimble bench --models hf:bert-base,timm:vit_small_patch16_224 --kernels best   # transformers
  tvm-nimble bench --models timm:inception_v4,timm:nasnetalarge --kernels vendor   # any timm model
  tvm-nimble bench --onnx my.onnx                                  # any static ONNX model
  tvm-nimble bench --training --batch 32,1     # training steps (cifar_inception, resnet18_chain) -> training.csv
"""
from __future__ import annotations

import argparse
import os

from tvm_nimble.bench.harness import SYSTEM_NAMES, check_skip
from tvm_nimble.cli.options import layout_arg, merge_arg, providers_arg, timing_cache_arg, timing_cache_option


def calibrate_batchnorm(model, size: int, batches: int = 4, batch: int = 8, seed: int = 1):
    """Give a randomly initialised model real BatchNorm statistics: train-mode forwards on seeded random
    batches with cumulative averaging (momentum None), then eval. Without it, random-init nets collapse
    to input-independent or vanishing outputs and an output check against them proves nothing."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return model.eval()
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(seed)
    model.to(dev).train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, 3, size, size, generator=gen).to(dev))
    return model.cpu().eval()


def _timm():
    try:
        import timm
    except ImportError:
        from tvm_nimble.errors import NimbleError

        raise NimbleError("timm:NAME models need timm: pip install timm") from None
    return timm


def _randomize_zero_heads(model, seed: int = 0):
    """Some timm models zero-initialise their classifier: an all-zero head makes every output the bias,
    whatever the input. Give such heads seeded random weights."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if linears and not linears[-1].weight.detach().any():
        with torch.no_grad():
            w = linears[-1].weight
            w.copy_(torch.randn(w.shape, generator=gen) * (1.0 / w.shape[1] ** 0.5))
    return model


def _require_model_packages(spec: str, packages: list[str]) -> None:
    """tv:/timm: models are built from code with PyTorch: one line naming what to install, now, rather than
    a traceback once the benchmark reaches the model."""
    from tvm_nimble.extras import missing_modules

    missing = missing_modules(packages)
    if missing:
        from tvm_nimble.errors import NimbleError

        raise NimbleError(f"{spec} is built from code with {' and '.join(packages)}, and {' and '.join(missing)} "
                          f"{'is' if len(missing) == 1 else 'are'} not installed here: pip install {' '.join(missing)} "
                          "(zoo models and --onnx files need neither)")


def model_builders(spec: str):
    """(label, onnx builder, torch builder) for ``tv:NAME`` (torchvision; nasnetalarge comes from timm) or
    ``timm:NAME`` (any timm model, input size from its own config), built from code with a fixed seed and
    calibrated BatchNorm statistics (see :func:`calibrate_batchnorm`)."""
    import copy
    import io

    import onnx

    source, _, name = spec.partition(":")
    if source not in ("tv", "timm") or not name:
        raise ValueError(f"model {spec!r}: expected tv:NAME (torchvision) or timm:NAME")
    use_timm = source == "timm" or name == "nasnetalarge"
    _require_model_packages(spec, ["torch", "timm" if use_timm else "torchvision"])
    import torch
    built = []  # one calibrated model; every caller gets its own copy (callers move it, cast it to fp16)

    def make():
        torch.manual_seed(0)
        if use_timm:
            model = _randomize_zero_heads(_timm().create_model(name, pretrained=False))
            size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))[-1]
        else:
            import torchvision

            kw = {"aux_logits": False, "init_weights": True} if name in ("inception_v3", "googlenet") else {}
            model = getattr(torchvision.models, name)(weights=None, **kw)
            size = 299 if name == "inception_v3" else 224
        return calibrate_batchnorm(model, size), size

    def torch_model(batch=1):
        if not built:
            built.append(make())
        return copy.deepcopy(built[0][0])

    def onnx_model(batch=1, dynamic_batch=False):
        """The ONNX export at ``batch``; ``dynamic_batch``: the batch a symbol (its Reshapes follow it), for a
        bucketed build."""
        model = torch_model(batch)
        size = built[0][1]
        buf = io.BytesIO()
        axes = {"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None
        torch.onnx.export(model, (torch.randn(batch, 3, size, size),), buf, input_names=["input"],
                          output_names=["output"], opset_version=17, dynamo=False, dynamic_axes=axes)
        return onnx.load_from_string(buf.getvalue())

    return name, onnx_model, torch_model


def main(argv=None):
    if argv is not None and "--generate" in argv:  # generation: its own options (tvm_nimble.bench.generation)
        from tvm_nimble.bench.generation import main as generation_main

        return generation_main(argv)
    ap = argparse.ArgumentParser(prog="tvm-nimble bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models",
                    help="zoo nets at benchmark size (incept6, nasnet, resnet, mobilenet), tv:<torchvision name> or "
                         "timm:<timm name>, hf:bert-base / hf:bert-large / hf:gpt2 / hf:llama-0.5b (random weights, sequence 128; hf:NAME@512 for another length); default incept6,nasnet,resnet (with --training: cifar_inception,"
                         "resnet18_chain)")
    ap.add_argument("--onnx", action="append", help="benchmark this ONNX file too (repeatable)")
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes (zoo and torchvision models)")
    ap.add_argument("--target", choices=["cuda", "llvm"], help="default: cuda when a GPU is present")
    ap.add_argument("--arch", help="GPU arch, default: the GPU's")
    ap.add_argument("--precision", "--dtype", dest="precision", default="fp32",
                    help="comma-separated precisions, each a table with the peers in the same precision: fp32 (TF32 "
                         "off everywhere), tf32, fp16 (PyTorch .half(), ONNX Runtime on an fp16-converted model), "
                         "bf16 (PyTorch .bfloat16()); --dtype float32,float16 still works")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default="bench-results",
                    help="where results.csv / RESULTS.md / results.png / machines.json go (default ./bench-results; "
                         "the repository's committed tables are in benchmarks/)")
    ap.add_argument("--tuning-db", help="MetaSchedule database applied to every TVM/Nimble system; "
                    "its rows are labelled '<model> (tuned N trials)'")
    ap.add_argument("--with-untuned", action="store_true",
                    help="with --tuning-db: also run the untuned kernels first, in the same process, for a same-run "
                         "tuned-vs-untuned ratio")
    ap.add_argument("--kernels", choices=["tvm", "vendor", "best"], default="tvm",
                    help="kernels of every TVM/Nimble system: TVM's own (default), convolutions and GEMMs on "
                         "cuDNN / cuBLASLt (vendor; CUDA, needs the nvidia-cudnn-cu13 and nvidia-cublas wheels), "
                         "or each of them on whichever of the two measured faster on this GPU (best)")
    ap.add_argument("--small", action="store_true", help="use the zoo's small default sizes (fast, for CI)")
    merge_arg(ap)
    providers_arg(ap)
    layout_arg(ap)
    timing_cache_arg(ap)
    ap.add_argument("--training", action="store_true",
                    help="time training steps (forward, cross-entropy, backward, optimizer update) instead of "
                         "inference, after checking 20 losses against PyTorch: appends to training.csv in --out")
    ap.add_argument("--optimizer", default="momentum", metavar="NAME,...",
                    help="with --training: the optimizers, a comma list of sgd, momentum, adam, adamw "
                         "(PyTorch's, default weight decays; default momentum)")
    ap.add_argument("--skip", default="", metavar="SYSTEM,...",
                    help="systems neither built nor timed, a comma list of: " + ", ".join(SYSTEM_NAMES) +
                         " (e.g. tvm-vm,tvm-vm-cudagraph,nimble-multi-stream-nograph,torch-eager,ort-cuda: the "
                         "slow ones a comparison with the peers' best does not need)")
    ap.add_argument("--report-only", action="store_true",
                    help="only regenerate RESULTS.md and results.png from --out's results.csv")
    args = ap.parse_args(argv)
    if args.report_only:
        from tvm_nimble.bench.report import write_report

        if not os.path.isfile(os.path.join(args.out, "results.csv")):
            raise FileNotFoundError(f"no results.csv in {args.out}: run `tvm-nimble bench` first, or give --out the "
                                    "folder that holds it (the repository's tables: --out benchmarks)")
        write_report(os.path.join(args.out, "results.csv"), os.path.join(args.out, "RESULTS.md"),
                     os.path.join(args.out, "results.png"))
        print(f"wrote {os.path.join(args.out, 'RESULTS.md')}, results.png")
        return

    if args.training:
        return _training(args)
    if args.models is None:
        args.models = "incept6,nasnet,resnet"

    from tvm_nimble import zoo
    from tvm_nimble.bench.harness import run_benchmark
    from tvm_nimble.bench.hf_models import hf_builders
    from tvm_nimble.bench.report import database_trials
    from tvm_nimble.compiler.frontend import load_onnx_model

    models, torch_models = {}, {}
    for name in [m for m in args.models.split(",") if m]:
        if name.startswith(("tv:", "timm:", "hf:")):
            label, onnx_b, torch_b = model_builders(name) if not name.startswith("hf:") else hf_builders(name)
            models[label] = onnx_b
            torch_models[label] = torch_b
        else:
            label, _, _ = zoo.bench_model_spec(name)  # checks the name; labels inception as incept6
            models[label] = lambda batch, name=name: zoo.get_bench_model(name, batch=batch, small=args.small)[1]
    for path in args.onnx or []:
        model = load_onnx_model(path)
        models[os.path.basename(path)] = lambda batch, model=model: model
    target = None
    if args.target:
        from tvm_nimble.compiler.target import resolve_target, target_dict

        target = target_dict(resolve_target(args.target, args.arch))
    batches = [int(b) for b in args.batch.split(",")]
    if args.with_untuned and not args.tuning_db:
        ap.error("--with-untuned compares against --tuning-db: give the database too")
    trials = 0
    if args.tuning_db:
        from tvm_nimble.compiler.tuning.database import open_tuning_database

        open_tuning_database(args.tuning_db)  # a clear error now rather than after the first builds
        trials = database_trials(args.tuning_db)

    from tvm_nimble.relay_passes.precision import precision_name

    for precision in args.precision.split(","):
        precision_name(precision)  # a bad name fails now, in one line, not after the first model's timing
    skip = check_skip(args.skip.split(","))  # likewise
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.compiler.target import default_kind

    BuildOptions.create(target or default_kind(), kernels=args.kernels)  # likewise (e.g. vendor kernels on the CPU)
    _make_out_dir(args.out)  # before any build: a bad --out fails at once, in one line
    rows, notes, baseline_cache = [], [], {}  # PyTorch/TensorRT systems are built once, timed in every run
    for db in ([None] if args.with_untuned else []) + [args.tuning_db]:
        for precision in args.precision.split(","):
            r, n = run_benchmark(models, target, batches, rounds=args.rounds, iters=args.iters, out_dir=args.out,
                                 tuning_db=db, precision=precision, torch_models=torch_models, baseline_cache=baseline_cache,
                                 kernels=args.kernels if args.kernels != "tvm" else "tvm-tuned" if db else "tvm-default",
                                 db_trials=str(trials) if args.tuning_db else "",
                                 build_extra={**timing_cache_option(args), "merge": args.merge, "layout": args.layout,
                                              **({"providers": args.providers} if args.providers else {})},
                                 skip=skip)
            rows += r
            notes += [x for x in n if x not in notes]
    print(f"{'model':14s} {'batch':>5s} {'dtype':8s} {'system':30s} {'median ms':>10s} {'p90 ms':>8s}")
    for r in rows:
        print(f"{r['model']:14s} {r['batch']:>5} {r['dtype']:8s} {r['system']:30s} {r['median_ms']:>10s} {r['p90_ms']:>8s}")
    for n in notes:
        print(f"note: {n}")
    print(f"wrote {os.path.join(args.out, 'results.csv')}, RESULTS.md, results.png")


def _make_out_dir(path: str) -> None:
    """Create --out (and its parents); a file in the way or a read-only folder is one clear line."""
    why = "it is a file, not a folder" if os.path.isfile(path) else None
    if why is None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as err:
            why = err.strerror or type(err).__name__
        else:
            if not os.access(path, os.W_OK | os.X_OK):
                why = "no write permission"
    if why:
        from tvm_nimble.errors import NimbleError

        raise NimbleError(f"cannot write benchmark results to --out {path} ({why}); give --out a folder you can "
                          "write to")


def _training(args):
    from tvm_nimble.bench.training import TRAINING_MODELS, run_training_benchmark

    _make_out_dir(args.out)
    target = None
    if args.target:
        from tvm_nimble.compiler.target import resolve_target, target_dict

        target = target_dict(resolve_target(args.target, args.arch))
    models = [m for m in (",".join(TRAINING_MODELS) if args.models is None else args.models).split(",") if m]
    from tvm_nimble.compiler.optimizers import OPTIMIZERS

    optimizers = tuple(o for o in args.optimizer.split(",") if o)
    unknown = [o for o in optimizers if o not in OPTIMIZERS]
    if unknown or not optimizers:
        from tvm_nimble.errors import NimbleError

        raise NimbleError(f"--optimizer {args.optimizer!r}: each must be one of {', '.join(OPTIMIZERS)}")
    rows = run_training_benchmark(models, [int(b) for b in args.batch.split(",")], target, rounds=args.rounds,
                                  iters=min(args.iters, 20), out_dir=args.out, small=args.small,
                                  optimizers=optimizers, kernels=args.kernels,
                                  precisions=tuple(args.precision.split(",")))
    print(f"{'model':16s} {'batch':>5s} {'optimizer':16s} {'system':30s} {'median ms':>10s} {'p90 ms':>8s}")
    for r in rows:
        print(f"{r['model']:16s} {r['batch']:>5} {r['optimizer'].split()[0]:16s} {r['system']:30s} "
              f"{r['median_ms']:>10s} {r['p90_ms']:>8s}")
    print(f"wrote {os.path.join(args.out, 'training.csv')}, training_losses.json")


if __name__ == "__main__":
    main()
