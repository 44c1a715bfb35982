"""Experiment: where TVM's FuseTIR fails on nasnetalarge in half precision (#31).

Eighteenth session, H100: nasnetalarge in fp16 does not build; the kernel choice's model check fails in FuseTIR
("Inconsistent buffers compute and A mapped to the same relax var: lv83"), in NCHW and in NHWC. The zoo's NASNet
cells build, so this needs the real model (timm, on the GPU machine). For each variant (all convolutions on TVM's
kernels, all on the vendor calls; NCHW and NHWC) it lowers the module and, where FuseTIR fails, writes the fused
Relax functions that read or write the var the error names, as TVMScript, before FuseTIR ran.

    bash scripts/gpu_session.sh "experiment fusetir_debug 300 --precision fp16"

Writes DIR/fusetir_debug.json (each variant: ok or the error) and DIR/fused-VARIANT.py (the functions).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import warnings


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tv:nasnetalarge")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    warnings.filterwarnings("ignore")

    import tvm
    from tvm import relax

    from tvm_nimble.cli.bench import model_builders
    from tvm_nimble.compiler import stages
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.relay_passes.pipeline import kernel_passes, run_passes

    _, onnx_builder, _ = model_builders(args.model)
    fp32 = stages.import_model(onnx_builder(1))
    record = {}
    for kernels in ("tvm", "vendor"):
        for layout in ("nchw", "nhwc"):
            name = f"{kernels}-{layout}"
            opts = BuildOptions.create({"kind": "cuda", "arch": "sm_90"}, kernels=kernels, precision=args.precision,
                                       layout=layout, timing_cache="off", compile_kernels=False, max_streams=1)
            mod = stages.apply_layout(stages.apply_precision(fp32, opts), opts)
            if kernels == "vendor":
                mod = stages.offload(mod, opts)
            passes = kernel_passes(opts.target, None, True, False)
            try:
                run_passes(passes, mod, opts.target)
                record[name] = "ok"
            except Exception as err:  # noqa: BLE001
                text = str(err).splitlines()[-1]
                record[name] = text
                m = re.search(r"relax var: (\S+)", text)
                at = [i for i, p in enumerate(passes) if p.info.name == "FuseTIR"]
                if m and at:
                    before = run_passes(passes[:at[0]], mod, opts.target)
                    var = m.group(1)
                    found = [f"# {gv.name_hint}\n{func.script()}" for gv, func in before.functions.items()
                             if isinstance(func, relax.Function) and re.search(rf"\b{re.escape(var)}\b", func.script())
                             and gv.name_hint != "main"]
                    with open(os.path.join(args.out, f"fused-{name}.py"), "w") as f:
                        f.write("\n\n".join(found[:6]))
            print(f"{name}: {record[name]}", flush=True)
    with open(os.path.join(args.out, "fusetir_debug.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(tvm.__version__)


if __name__ == "__main__":
    main()
