"""The models the command-line tools name: ``zoo:NAME``, ``tv:NAME``, ``timm:NAME``, ``hf:NAME`` or an ONNX file.

``tvm-nimble tune`` and the scripts under scripts/ load them through :func:`load_model`, so that a name
means the same model (same size, same seeded weights) wherever it is given.
"""
from __future__ import annotations

import os


def load_model(model_arg: str, batch: int = 1, small: bool = False):
    """(name, ONNX model) of ``zoo:NAME`` / ``tv:NAME`` / ``timm:NAME`` / ``hf:NAME`` at ``batch`` (a file keeps
    its own); ``small``: a zoo net at the zoo's own size instead of the benchmark size (a CPU dry run)."""
    if model_arg.startswith("zoo:"):
        from tvm_nimble import zoo

        # benchmark size, as `tvm-nimble bench` builds it, unless small
        return zoo.get_bench_model(model_arg[4:], batch=batch, small=small)
    if model_arg.startswith(("tv:", "timm:")):  # built from code with a fixed seed, exactly as `bench` builds it
        from tvm_nimble.cli.bench import model_builders

        label, onnx_builder, _ = model_builders(model_arg)
        return label, onnx_builder(batch=batch)
    if model_arg.startswith("hf:"):  # Hugging Face configurations with random weights, as `bench` builds them
        from tvm_nimble.bench.hf_models import hf_builders

        label, onnx_builder, _ = hf_builders(model_arg)
        return label, onnx_builder(batch=batch)
    from tvm_nimble.compiler.frontend import load_onnx_model
    from tvm_nimble.compiler.frontend.onnx_import import OnnxFileNotFoundError

    if not os.path.exists(model_arg) and ":" not in model_arg and not model_arg.endswith(".onnx"):
        raise OnnxFileNotFoundError(f"model {model_arg!r}: no such ONNX file; name a built-in model as zoo:NAME, "
                                    f"tv:NAME, timm:NAME or hf:NAME (e.g. zoo:{model_arg})")
    return os.path.splitext(os.path.basename(model_arg))[0], load_onnx_model(model_arg)
