"""On the GPU machine, with the TVM runtime only: check and time what gpu_prepare.py built.

Per model: outputs of Nimble (multi-stream graph, single-stream graph, live streams) vs stock
TVM VM vs the ONNX reference; latency of every system measured interleaved in one run;
host cost of one Nimble inference; a per-launch timeline (JSON, plotted by
scripts/record_gpu_results.py); for the first model, 10,000 runs checked bit-identical with
device memory use before/after. Writes results.csv rows and a JSON log under --out.

    . .device/setup.sh && python3 scripts/gpu_validate.py --art out/gpu --out $OUT
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gpu_name(gpu: bool) -> str:
    if not gpu:
        from tvm_nimble.bench import device_name

        return device_name(False)
    from cuda.bindings import runtime as rt

    err, prop = rt.cudaGetDeviceProperties(0)
    name = prop.name
    return (name.decode() if isinstance(name, bytes) else str(name)).split("\x00")[0].strip()


def mem_used_mib(gpu: bool) -> float | None:
    if not gpu:
        return None
    from cuda.bindings import runtime as rt

    err, free, total = rt.cudaMemGetInfo()
    return (total - free) / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--art", default="out/gpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "out/gpu-results"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--long-runs", type=int, default=10000)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    with open(os.path.join(args.art, "index.json")) as f:
        index = json.load(f)
    gpu = index["arch"] != "cpu"  # "cpu": a dry run of this whole script on llvm artifacts
    if gpu:
        from tvm_nimble.runtime import ensure_cuda_runtime

        ensure_cuda_runtime()
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from tvm_nimble.bench import GPU_MODES, NIMBLE_SYSTEMS, System, interleaved_timing
    from tvm_nimble.executor import NimbleExecutor
    from tvm_nimble.module import load
    from tvm_nimble.timing import host_cost_us

    dev = tvm.cuda(0) if gpu else tvm.cpu(0)
    device = gpu_name(gpu)
    today = datetime.date.today().isoformat()
    log = {"device": device, "date": today, "tvm": tvm.__version__, "models": {}}
    rows = []
    first = True
    for name, meta in index["models"].items():
        d = os.path.join(args.art, name)
        io = np.load(os.path.join(d, "io.npz"))
        inputs = [io[f"in_{k}"] for k in meta["inputs"]]
        ref = [io[f"ref_{i}"] for i in range(meta["num_outputs"])]
        module = load(os.path.join(d, "nimble"))
        entry = {"kernels": len(module.plan.launches), "streams": module.plan.num_streams,
                 "events": module.plan.num_events, "memory": module.plan.memory}
        modes = GPU_MODES if gpu else ("sequential",)
        execs = {m: NimbleExecutor(module, dev, mode=m) for m in modes}
        vms = {}
        for label, lib in (("tvm-vm", "vm.so"), ("tvm-vm-cudagraph", "vm_graph.so")):
            vm = VirtualMachine(tvm.runtime.load_module(os.path.join(d, lib)), dev)
            targs = [tvm.runtime.tensor(x, dev) for x in inputs]
            vms[label] = (vm["main"], targs)
        # correctness
        errs = {}
        vm_out = vms["tvm-vm"][0](*vms["tvm-vm"][1])
        vm_out = [vm_out.numpy()] if hasattr(vm_out, "numpy") else [o.numpy() for o in vm_out]
        for mode, ex in execs.items():
            outs = [o.numpy() for o in ex(*inputs)]
            errs[f"nimble-{mode} vs vm"] = max(float(np.abs(o - r).max()) for o, r in zip(outs, vm_out))
        errs["vm vs onnx-reference"] = max(float(np.abs(o - r).max()) for o, r in zip(vm_out, ref))
        g = vms["tvm-vm-cudagraph"]
        gout = g[0](*g[1])
        gout = [gout.numpy()] if hasattr(gout, "numpy") else [o.numpy() for o in gout]
        errs["vm-cudagraph vs vm"] = max(float(np.abs(o - r).max()) for o, r in zip(gout, vm_out))
        entry["max_abs_err"] = errs
        ok = all(v < 1e-3 * max(1.0, float(np.abs(vm_out[0]).max())) for v in errs.values())
        entry["outputs_match"] = ok
        for ex in execs.values():
            for i, x in enumerate(inputs):
                ex.set_input(i, x)
        vm_call = {k: (lambda f=f: f[0](*f[1])) for k, f in vms.items()}
        systems = [System(k, fn, dev.sync, None) for k, fn in vm_call.items()]
        systems += [System(NIMBLE_SYSTEMS[m], ex.run, ex.sync, None) for m, ex in execs.items()]
        timing = interleaved_timing(systems, rounds=args.rounds, iters=args.iters, warmup=20)
        entry["timing_ms"] = timing
        ex = execs["cuda-graph" if gpu else "sequential"]
        entry["host_us_nimble_graph_launch"] = host_cost_us(ex.run, sync=ex.sync)
        entry["host_us_tvm_vm_call"] = host_cost_us(vm_call["tvm-vm"], iters=500, sync=dev.sync)
        entry["timeline"] = execs["streams"].profile() if gpu else []
        if first and args.long_runs:
            first = False
            before = mem_used_mib(gpu)
            ex.run()
            base = ex.get_output(0).numpy().copy()
            identical = True
            for _ in range(args.long_runs):
                ex.run()
                if not np.array_equal(ex.get_output(0).numpy(), base):
                    identical = False
            entry["long_run"] = {"runs": args.long_runs, "bit_identical": identical,
                                 "mem_used_mib_before": before, "mem_used_mib_after": mem_used_mib(gpu)}
        for e in execs.values():
            e.close()
        log["models"][name] = entry
        for system, (med, p90) in timing.items():
            rows.append([today, device, name, meta["batch"], "float32", system, f"{med:.4f}", f"{p90:.4f}"])
    with open(os.path.join(args.out, "gpu_validate.json"), "w") as f:
        json.dump(log, f, indent=1)
    with open(os.path.join(args.out, "results_rows.csv"), "w") as f:
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")
    print(f"\n{device}  TVM {tvm.__version__}  batch 1 fp32  (median ms / p90 ms)")
    for name, e in log["models"].items():
        t = e["timing_ms"]
        base = t["tvm-vm-cudagraph"][0]  # on CPU the "cudagraph" VM is the plain VM
        print(f"{name}: {e['kernels']} kernels, {e['streams']} streams, outputs match: {e['outputs_match']}, "
              f"host/launch {e['host_us_nimble_graph_launch']:.1f} us")
        for s, (m, p) in t.items():
            print(f"  {s:30s} {m:8.4f} {p:8.4f}  {base / m:5.2f}x vs vm+graph")
        if "long_run" in e:
            print(f"  long run: {e['long_run']}")


if __name__ == "__main__":
    main()
