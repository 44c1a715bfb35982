"""Stock TVM (Relax VM) built from the same kernels as Nimble: the reference and the baseline."""
from __future__ import annotations

import contextlib

import numpy as np
import tvm
from tvm import relax

from tvm_nimble.relay_passes.pipeline import finalize_passes, kernel_passes, run_passes


def stock_pipeline(target: tvm.target.Target, tuning_database=None) -> tvm.transform.Pass:
    """TVM's default pipeline for ``target`` (with the same tuning database Nimble applies): the kernel
    passes Nimble's build runs, concatenations as kernels, then TVM's finalization."""
    passes = kernel_passes(target, tuning_database) + finalize_passes(target)

    @tvm.transform.module_pass(opt_level=0, name="nimble.StockPipeline")
    def _pass(mod, _ctx):
        return run_passes(passes, mod, target, tuning_database)

    return _pass


def build_stock_vm(mod: tvm.IRModule, target: tvm.target.Target, cuda_graph: bool = False, tuning_database=None):
    """Compile ``mod`` for the Relax VM (optionally with TVM's own CUDA graph rewriting)."""
    config = {"relax.backend.use_cuda_graph": True} if cuda_graph else {}
    ctx = contextlib.nullcontext()
    if target.kind.name == "cuda":
        from tvm_nimble.codegen.cuda_compile import fatbin_compilation

        ctx = fatbin_compilation(target)
    with ctx, tvm.transform.PassContext(opt_level=3, config=config):
        return tvm.compile(mod, target, relax_pipeline=stock_pipeline(target, tuning_database))


class StockVM:
    """A Relax VM with its inputs kept on the device, so timing covers execution only."""

    def __init__(self, executable, device, inputs: list[np.ndarray]):
        self.vm = relax.VirtualMachine(executable, device)
        self.device = device
        self.args = [tvm.runtime.tensor(x, device) for x in inputs]
        self.main = self.vm["main"]

    def __call__(self):
        return self.main(*self.args)

    def outputs(self) -> list[np.ndarray]:
        out = self()
        if isinstance(out, (list, tuple)) or type(out).__name__ in ("Array", "List"):
            return [o.numpy() for o in out]
        return [out.numpy()]

    def sync(self):
        self.device.sync()
