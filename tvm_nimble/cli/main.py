"""The ``tvm-nimble`` command line. Exit codes: 0 ok, 1 failure (one-line reason), 2 usage."""
from __future__ import annotations

import argparse
import os
import sys

from tvm_nimble.cli.options import build_option_args, build_options, target_args

EPILOG = """examples:
  tvm-nimble demo
  tvm-nimble zoo inception -o model.onnx
  tvm-nimble compile model.onnx -o model.nimble --target cuda --arch sm_90
  tvm-nimble compile model.onnx -o model.nimble --target llvm --shape input=1,3,224,224
  tvm-nimble run model.nimble --input input=x.npy --output-dir out/
  tvm-nimble explain model.onnx --dot model.dot
  tvm-nimble bench --onnx model.onnx --target cuda
  tvm-nimble tune model.onnx --target cuda --arch sm_90 --trials 300 --time-budget 480 -o model.nimble
  tvm-nimble --version
  tvm-nimble compile model.onnx -o model.nimble --target cuda --arch sm_90 --kernels best \
      --rpc-tracker 10.0.0.5:9190 --rpc-key h100     # timed on a remote H100, built here
"""


def _shape_dict(items):
    if not items:
        return None
    shapes = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep:
                raise ValueError
            dims = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise SystemExit(_usage(f"--shape expects NAME=D1,D2,..., got {item!r}"))
        if name in shapes:
            raise SystemExit(_usage(f"--shape {name}=... is given twice; give each input's shape once"))
        bad = [(i, d) for i, d in enumerate(dims) if d <= 0]
        if bad:
            raise SystemExit(_usage(f"--shape {item}: dimension {bad[0][0]} is {bad[0][1]}, not a valid size "
                                    f"(dimensions must be positive): give the input's real shape, "
                                    f"--shape {name}=D1,D2,..."))
        shapes[name] = dims
    return shapes


def _usage(msg):
    print(f"tvm-nimble: usage error: {msg}", file=sys.stderr)
    return 2


def _target(args):
    from tvm_nimble.compiler.target import resolve_target

    return resolve_target(args.target, args.arch)


def cmd_demo(args):
    from tvm_nimble.cli.demo import run_demo

    run_demo(args.model, target=args.target, arch=args.arch, iters=args.iters)


def cmd_compile(args):
    from tvm_nimble.cli.progress import phase_listener, spinner
    from tvm_nimble.compiler.build import build_with
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.runtime.artifact import check_output_path

    if os.path.isfile(args.model):  # (a missing model is named by the build)
        check_output_path(args.output, args.force, replace_hint="pass --force")  # before the build, not after it
    message = f"compiling {os.path.basename(args.model)} for {args.target}"
    with spinner(message) as bar:
        module = build_with(args.model, BuildOptions.create(_target(args), **build_options(args)),
                            shape_dict=_shape_dict(args.shape), on_phase=phase_listener(bar, message))
        module.export(args.output, overwrite=args.force)
    p = module.plan
    print(f"wrote {args.output}: {len(p.launches)} kernels, {p.num_streams} stream(s), {p.num_events} event(s), "
          f"pool {p.memory['pool_bytes'] / 1024:.1f} KiB" + (f" (the largest of the {_buckets(module)})"
                                                            if getattr(module, "buckets", None) else ""))
    report = getattr(module, "report", None)  # the build report (a bucketed build's buckets each have theirs)
    if report is not None and report.format():
        print(report.format())


def _buckets(module) -> str:
    """``batch buckets 1, 2, 4`` or ``buckets sequence_length 8, 16`` of a bucketed module."""
    if module.space.rows:
        return "batch buckets " + ", ".join(map(str, module.batch_sizes))
    return "buckets " + module.space.describe()


def cmd_run(args):
    import numpy as np

    from tvm_nimble.runtime.loading import NimbleExecutor

    if args.output_dir:
        _check_output_dir(args.output_dir)  # before the run: a bad --output-dir fails at once
    with NimbleExecutor(args.artifact, mode=args.mode) as ex:
        feeds = {}
        for item in args.input or []:
            name, sep, path = item.partition("=")
            if not sep:
                raise SystemExit(_usage(f"--input expects NAME=FILE.npy, got {item!r}"))
            if name in feeds:
                raise SystemExit(_usage(f"--input {name}=... is given twice; give each input once"))
            if not os.path.isfile(path):
                raise FileNotFoundError(f"input file not found: {path}")
            try:
                feeds[name] = np.load(path, allow_pickle=False)
            except (ValueError, OSError, EOFError):
                raise ValueError(f"--input {name}={path} is not a valid .npy array (empty, truncated or another "
                                 "format); save the input with numpy.save(path, array)") from None
        inputs = ", ".join(map(repr, ex.plan.input_names))
        unknown = [n for n in feeds if n not in ex.plan.input_names]
        if unknown:
            raise SystemExit(_usage(f"--input {unknown[0]}=...: {unknown[0]!r} is not an input of the model; its "
                                    f"inputs are {inputs}"))
        missing = [n for n in ex.plan.input_names if n not in feeds]
        if missing:
            raise SystemExit(_usage(f"missing --input for {', '.join(map(repr, missing))} (the model's inputs are "
                                    f"{inputs}): give each as --input NAME=FILE.npy"))
        for k, v in feeds.items():
            ex.set_input(k, v)
        ex.run()
        for i in range(ex.get_num_outputs()):
            out = ex.get_output(i).numpy()
            line = f"output {i}: {out.dtype}{list(out.shape)} min {out.min():.6g} max {out.max():.6g} mean {out.mean():.6g}"
            if args.output_dir:
                path = os.path.join(args.output_dir, f"output{i}.npy")
                try:
                    os.makedirs(args.output_dir, exist_ok=True)
                    np.save(path, out)
                except OSError as err:
                    raise _cannot_write("--output-dir", args.output_dir, err.strerror or type(err).__name__) from None
                line += f" -> {path}"
            print(line)


def _cannot_write(flag, path, why):
    from tvm_nimble.errors import NimbleError

    return NimbleError(f"cannot write to {flag} {path}: {why}; give {flag} a folder you can write to")


def _check_output_dir(path):
    """An output folder that exists or can be created here (without creating it yet)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise _cannot_write("--output-dir", path, "it is a file, not a folder")
    where = os.path.abspath(path)
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    if not os.path.isdir(where):
        raise _cannot_write("--output-dir", path, f"{where} is a file, not a folder")
    if not os.access(where, os.W_OK | os.X_OK):
        raise _cannot_write("--output-dir", path, f"no write permission in {where}")


def cmd_explain(args):
    from tvm_nimble.compiler.explain import explain_model

    text = explain_model(args.model, _target(args), shape_dict=_shape_dict(args.shape), dot_path=args.dot,
                         show_plan=args.plan, show_ir=args.ir, profile_png=args.profile, **build_options(args))
    print(text)


def cmd_bench(args):
    from tvm_nimble.cli.bench import main as bench_main

    bench_main(args.rest)


def cmd_tune(args):
    from tvm_nimble.cli.tune import main as tune_main

    tune_main(args.rest)


def cmd_rpc_server(args):
    from tvm_nimble.cli.rpc_server import main as server_main

    server_main(args.rest)


def cmd_zoo(args):
    from tvm_nimble.cli.zoo_cmd import run as zoo_run

    zoo_run(args)


def cmd_prepare(args):
    from tvm_nimble.cli.prepare import run as prepare_run

    prepare_run(args)


def cmd_generate(args):
    from tvm_nimble.cli.generate import run as generate_run

    generate_run(args)


def cmd_train(args):
    from tvm_nimble.cli.train import main as train_main

    train_main(args.rest)


def _version() -> str:
    """tvm-nimble's version and the TVM it runs on (a version mismatch is the first thing to rule out)."""
    from importlib.metadata import PackageNotFoundError, version

    from tvm_nimble import __version__

    try:
        tvm = version("apache-tvm")
    except PackageNotFoundError:  # a TVM built from source
        tvm = "from source"
    return f"tvm-nimble {__version__} (TVM {tvm})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-nimble", description="Nimble-style AoT multi-stream scheduling for TVM",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, fn, help_text, example, passthrough=False):
        # bench/tune forward their arguments (and --help) to their own parsers
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=f"example:\n  {example}",
                           formatter_class=argparse.RawDescriptionHelpFormatter, add_help=not passthrough)
        p.set_defaults(fn=fn)
        return p

    def target_opts(p, default="llvm"):
        target_args(p, default)
        p.add_argument("--shape", action="append", metavar="NAME=D1,D2", help="fix an input's shape (repeatable)")
        build_option_args(p)

    p = add("demo", cmd_demo, "build the built-in Inception-style model, check it, time it vs stock TVM",
            "tvm-nimble demo --target llvm")
    p.add_argument("--model", help="use this ONNX file instead of the built-in model")
    p.add_argument("--target", choices=["cuda", "llvm"], help="default: cuda when a GPU is present, else llvm")
    p.add_argument("--arch", help="GPU arch (default: the GPU's)")
    p.add_argument("--iters", type=int, default=50, help="timed iterations per system")

    p = add("zoo", cmd_zoo, "write a built-in zoo model as an ONNX file (--list names them)",
            "tvm-nimble zoo inception -o model.onnx")
    from tvm_nimble.cli.zoo_cmd import add_arguments as zoo_arguments
    zoo_arguments(p)

    p = add("compile", cmd_compile, "compile an ONNX model into a deployable Nimble artifact",
            "tvm-nimble compile model.onnx -o model.nimble --target cuda --arch sm_90")
    p.add_argument("model", help="ONNX file")
    p.add_argument("-o", "--output", required=True, help="artifact directory to write")
    p.add_argument("--force", action="store_true", help="replace the artifact already at -o (refused without it)")
    target_opts(p)

    p = add("prepare", cmd_prepare, "compile once, ahead of the first CUDA build, what every later build on this "
            "machine reuses: the vendor extension (cuDNN, cuBLASLt, our kernels) and TVM's tensor intrinsics",
            "tvm-nimble prepare --arch sm_90")
    from tvm_nimble.cli.prepare import add_arguments as prepare_arguments
    prepare_arguments(p)

    p = add("run", cmd_run, "run an artifact on .npy inputs and print (or save) its outputs",
            "tvm-nimble run model.nimble --input input=x.npy --output-dir out/")
    p.add_argument("artifact", help="artifact directory written by `tvm-nimble compile`")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input (repeatable)")
    p.add_argument("--output-dir", help="save outputs as output<i>.npy here")
    p.add_argument("--mode", choices=["cuda-graph", "single-stream", "streams", "sequential"],
                   help="executor mode (default: cuda-graph for a CUDA artifact, sequential for an llvm one)")
    from tvm_nimble.cli.serve import register as register_serve
    register_serve(add)

    p = add("generate", cmd_generate, "generate tokens with a decoder exported with past key/values "
            "(tvm_nimble.cli.generate)", "tvm-nimble generate decoder.onnx --prompt-ids 1,2,3 --max-new-tokens 16")
    from tvm_nimble.cli.generate import add_arguments as generate_arguments
    generate_arguments(p)

    p = add("explain", cmd_explain, "show the stream assignment: streams, syncs, DAG width, plan table, DOT graph",
            "tvm-nimble explain model.onnx --dot model.dot --plan")
    p.add_argument("model", help="ONNX file")
    target_opts(p)
    p.add_argument("--dot", help="write the stream-colored DAG as Graphviz DOT here")
    p.add_argument("--plan", action="store_true", help="print the launch plan table")
    p.add_argument("--ir", action="store_true", help="print the annotated Relax IR")
    p.add_argument("--profile", metavar="PNG", help="on this machine's GPU: run the model, draw its measured and "
                   "planned timelines per stream here, and report the critical-path bound")

    p = add("bench", cmd_bench, "benchmark Nimble against stock TVM, PyTorch and ONNX Runtime (tvm_nimble.cli.bench)",
            "tvm-nimble bench --models inception,nasnet --batch 1", passthrough=True)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for tvm_nimble.cli.bench")

    p = add("tune", cmd_tune, "tune kernels with MetaSchedule + XGBoost (tvm_nimble.cli.tune)",
            "tvm-nimble tune model.onnx --target cuda --trials 300 --time-budget 480", passthrough=True)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for tvm_nimble.cli.tune")

    p = add("train", cmd_train, "a quick training run with Nimble, loss shown as it goes (tvm_nimble.cli.train)",
            "tvm-nimble train zoo:inception --steps 20 --lr 0.01 -o trained.onnx", passthrough=True)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for tvm_nimble.cli.train")

    p = add("rpc-server", cmd_rpc_server, "serve this machine's GPU to an RPC tracker for tuning "
            "(tvm_nimble.cli.rpc_server)", "tvm-nimble rpc-server --tracker 10.0.0.5:9190 --key h100", passthrough=True)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for tvm_nimble.cli.rpc_server")
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    forwarded = {"bench": cmd_bench, "tune": cmd_tune, "train": cmd_train, "rpc-server": cmd_rpc_server}
    if argv and argv[0] in forwarded:  # forwarded whole, --help included
        args = argparse.Namespace(fn=forwarded[argv[0]], rest=argv[1:])
    else:
        args = parser.parse_args(argv)
    from tvm_nimble.cli.console import command_output
    from tvm_nimble.errors import NimbleError

    try:
        with command_output():
            args.fn(args)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except (NimbleError, FileNotFoundError, ValueError) as err:
        print(f"tvm-nimble: error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 1
    except (PermissionError, NotADirectoryError, IsADirectoryError, FileExistsError) as err:
        # a path a command could not read or write, not caught where it was used: still one line with the path
        path = f" {err.filename}" if err.filename else ""
        print(f"tvm-nimble: error: cannot use{path}: {err.strerror or type(err).__name__}; check the path "
              "(a folder where a file is expected, or the reverse) and its permissions", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tvm-nimble: interrupted", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
