"""Experiment: schedules of a row normalization's TVM kernel, each timed alone on the GPU (#52: the 0.5B decoder's 49
RMSNorms over 896 columns at 512 tokens, and a warp-per-row schedule that went into the build untimed alone and ran
slower: benchmarks/findings.md, 'a warp-per-row RMSNorm measured slower and reverted').

For each case (RMSNorm or LayerNorm over the last axis of ``[1, rows, width]`` float32, rounded to float16, as a 16-bit
decoder's residual stream feeds its projections), the fused kernel is scheduled
- as the build does (``stages.lower``: DLight's rules as the pipeline guards them),
- with a block of T threads a row (T in ``--threads``: each thread sums every T-th element, the block's threads
  combine their sums, every thread keeps the row's value, the same threads write the row),
- with a warp a row, R rows a block (R in ``--rows-per-block``),
(both ``relay_passes.schedules.threads_per_row``, the build's with ``NIMBLE_ROW_THREADS=T``)
and each schedule's output is checked against numpy in float64, then its kernel time measured by CUPTI
(``gpu_args.kernel_us``: the kernel alone, no launch cost).

    bash scripts/gpu_session.sh "experiment row_norm_schedules 120"
    python3 scripts/experiments/row_norm_schedules.py --target llvm --out DIR   # the schedules compiled for sm_90

With ``--target llvm`` (no GPU) every schedule is built and compiled for sm_90 with nvcc, nothing run. Writes
DIR/row_norm_schedules.json and prints a table: per case, each schedule's error and microseconds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

# the modules and their numpy reference are the schedule tests' (tests/elementwise_modules.py)
TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

CASES = {  # name: (kind, rows, width)
    "llama_rms_512": ("rms_norm", 512, 896),
    "llama_rms_128": ("rms_norm", 128, 896),
    "gpt2_ln_512": ("layer_norm", 512, 768),
    "bert_ln_b32": ("layer_norm", 4096, 768),
}


def _fused(mod):
    """The fused kernel's PrimFunc of ``mod``: legalized, fused, the one kernel."""
    import tvm
    from tvm import relax

    seq = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])
    fused = seq(mod)
    (func,) = [f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def schedules(kind: str, rows: int, width: int, threads: list[int], rows_per_block: list[int], target):
    """[(label, scheduled PrimFunc)] of one case: the build's, then each variant that divides the shape."""
    import tvm

    from elementwise_modules import row_norm
    from tvm_nimble.compiler import stages
    from tvm_nimble.relay_passes.schedules import threads_per_row

    mod = row_norm(kind, rows, width)
    lowered = stages.lower(mod, target)
    (built,) = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    out = [("build (DLight)", built)]
    func = _fused(mod)
    variants = [(f"block of {t} a row", t, 1) for t in threads] + [(f"warp a row, {r} a block", 32, r)
                                                                   for r in rows_per_block]
    for label, t, r in variants:
        sch = threads_per_row(func, target, t, r, min_rows=1)
        if sch is not None:
            out.append((label, sch.mod["main"]))
    return out


def compiled(func, target):
    """The runtime function of one scheduled kernel, compiled for ``target`` with nvcc."""
    import tvm

    from tvm_nimble.codegen import cuda_compile

    mod = tvm.IRModule({"main": func.with_attr("tirx.is_scheduled", True).with_attr("global_symbol", "main")})
    with cuda_compile.fatbin_compilation(tvm.target.Target(target)):
        return tvm.compile(mod, target=target)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--threads", default="128,256,512,1024")
    ap.add_argument("--rows-per-block", default="1,2,4,8")
    ap.add_argument("--target", default="cuda", choices=["cuda", "llvm"])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import tvm

    from elementwise_modules import row_norm_reference
    from tvm_nimble.compiler.target import resolve_target

    run = args.target == "cuda"
    if run:
        import torch

        from gpu_args import kernel_us  # beside this script in scripts/experiments/

        major, minor = torch.cuda.get_device_capability(0)
        arch = f"sm_{major}{minor}"
    else:
        arch = "sm_90"
    target = resolve_target("cuda", arch)
    rng = np.random.default_rng(0)
    records = []
    for case in args.cases.split(","):
        kind, rows, width = CASES[case]
        x = (rng.standard_normal((1, rows, width)) * 3 + 1).astype(np.float32)
        weight, bias = rng.standard_normal((2, width)).astype(np.float32)
        want = row_norm_reference(kind, x, weight, bias)
        for label, func in schedules(kind, rows, width, [int(t) for t in args.threads.split(",")],
                                     [int(r) for r in args.rows_per_block.split(",")], target):
            row = {"case": case, "kind": kind, "rows": rows, "width": width, "schedule": label}
            try:
                fn = compiled(func, target)["main"]
            except Exception as err:  # noqa: BLE001  (one line per schedule, then the next)
                row["error"] = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
                records.append(row)
                print(f"{case:16s} {label:24s} failed: {row['error']}", flush=True)
                continue
            if run:
                dev = tvm.cuda(0)
                # the kernel's inputs: x and the weight (and LayerNorm's bias; an RMSNorm's module has none)
                xs = [tvm.runtime.tensor(a, dev) for a in (x, weight, bias)][:len(func.params) - 1]
                y = tvm.runtime.tensor(np.zeros((1, rows, width), "float16"), dev)
                fn(*xs, y)
                got = y.numpy().astype(np.float64)
                row["rel_l2"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                row["finite"] = bool(np.isfinite(got).all())
                row["us"], _ = kernel_us(lambda: fn(*xs, y), args.reps)
                print(f"{case:16s} {label:24s} rel L2 {row['rel_l2']:.2e}  {row['us']:7.2f} us", flush=True)
            else:
                print(f"{case:16s} {label:24s} compiled for {arch}", flush=True)
            records.append(row)
    with open(os.path.join(args.out, "row_norm_schedules.json"), "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
