"""``tvm-nimble generate``: token ids (or text) out of a decoder exported with past key/values.

  tvm-nimble generate decoder.onnx --prompt-ids 1,2,3 --max-new-tokens 16 --target llvm
  tvm-nimble generate decoder.onnx --prompt "Hello" --tokenizer tokenizer.json -o decoder.gen
  tvm-nimble generate decoder.gen --prompt-ids 1,2,3 --temperature 0.8 --top-p 0.9 --seed 1

MODEL is a with-past ONNX export (built here, see ``tvm_nimble.compiler.generate``; ``-o`` keeps the generator
artifact) or a generator artifact written before. The new ids are printed, space-separated, as they come; with
``--tokenizer`` (a Hugging Face ``tokenizer.json``, read by the ``tokenizers`` library) the prompt may be text and the
new text is printed after the ids.
"""
from __future__ import annotations

import argparse
import os
import sys

from tvm_nimble.errors import NimbleError

from .options import build_option_args, build_options, target_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="with-past ONNX file, or a generator artifact directory")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", help="the prompt's token ids, comma-separated (e.g. 1,2,3)")
    prompt.add_argument("--prompt", help="the prompt as text (needs --tokenizer)")
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer.json: text in and out")
    p.add_argument("--max-new-tokens", type=int, default=16, help="new tokens at most (default %(default)s)")
    p.add_argument("--max-length", type=int, default=256, help="KV cache slots: prompt plus new tokens at most "
                   "(building only; default %(default)s)")
    p.add_argument("--prefill-lengths", default="16,32,64,128", help="prompt buckets (building only; default "
                   "%(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; else sample")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample among the tokens of this much probability")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default %(default)s)")
    p.add_argument("--stop-token", action="append", type=int, default=[], help="stop after this id (repeatable)")
    p.add_argument("-o", "--output", help="keep the built generator as an artifact directory here")
    p.add_argument("--force", action="store_true", help="replace the artifact already at -o")
    target_args(p, "llvm")
    build_option_args(p)


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise NimbleError(f"--prompt-ids must be comma-separated integers such as 1,2,3, got {text!r}") from None


def _tokenizer(path: str | None):
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise NimbleError("--tokenizer needs the tokenizers library: pip install tokenizers") from None
    if not os.path.isfile(path):
        raise NimbleError(f"tokenizer file not found: {path} (give a Hugging Face tokenizer.json)")
    try:
        return Tokenizer.from_file(path)
    except Exception as err:  # noqa: BLE001 -- the library raises its own exception type
        raise NimbleError(f"{path} is not a tokenizer.json the tokenizers library reads ({err})") from None


def run(args: argparse.Namespace) -> None:
    from tvm_nimble.compiler.generate import build_generator
    from tvm_nimble.compiler.target import resolve_target
    from tvm_nimble.runtime.artifact import check_output_path
    from tvm_nimble.runtime.generator import Generator, Sampling, is_generator_artifact

    tok = _tokenizer(args.tokenizer)
    if args.prompt is not None and tok is None:
        raise NimbleError("--prompt is text: give --tokenizer tokenizer.json, or the ids with --prompt-ids")
    prompt = tok.encode(args.prompt).ids if args.prompt is not None else _ids(args.prompt_ids)
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    if is_generator_artifact(args.model):
        module = args.model
    else:
        if args.output:
            check_output_path(args.output, args.force, replace_hint="pass --force")
        lengths = _ids(args.prefill_lengths)
        print(f"building {os.path.basename(args.model)} for {args.target} ...", file=sys.stderr)
        module = build_generator(args.model, resolve_target(args.target, args.arch), max_length=args.max_length,
                                 prefill_lengths=lengths, **build_options(args))
        if args.output:
            module.export(args.output, overwrite=args.force)
            print(f"wrote {args.output}", file=sys.stderr)
    new: list[int] = []

    def show(token: int) -> None:
        new.append(token)
        print(token, end=" ", flush=True)

    with Generator(module) as gen:
        gen.generate(prompt, args.max_new_tokens, sampling, args.stop_token, show)
    print()
    if tok is not None:
        print(tok.decode(new))
