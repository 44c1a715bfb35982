"""On the GPU machine, with the TVM runtime only: check and time what gpu_prepare.py built.

Per model: outputs of Nimble (multi-stream graph, single-stream graph, live streams) vs stock
TVM VM vs the ONNX reference; latency of every system measured interleaved in one run;
host cost of one Nimble inference; a per-launch timeline (JSON, plotted by
scripts/record_gpu_results.py); for the first model, 10,000 runs checked bit-identical with
device memory use before/after. Then the reliability checks that need a GPU: the install is
runtime-only, torch CUDA tensors as inputs (DLPack), one executor shared by threads,
``close()`` frees device memory, out-of-memory and GPU-arch mismatch fail cleanly.

Device time is scarce, so every section is isolated: a failure is logged with its traceback
and the rest still runs; the JSON log is rewritten after every section.

    . .device/setup.sh && python3 scripts/gpu_validate.py --art out/gpu --out $OUT
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import json
import os
import threading
import time
import traceback

import numpy as np


def mem_used_mib(gpu: bool) -> float | None:
    if not gpu:
        return None
    from cuda.bindings import runtime as rt

    err, free, total = rt.cudaMemGetInfo()
    return (total - free) / 2**20


class Log:
    """The JSON log, saved after every section; ``section`` isolates failures."""

    def __init__(self, path: str, data: dict):
        self.path, self.data = path, data
        self.data.setdefault("errors", {})

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.data, f, indent=1, default=str)

    @contextlib.contextmanager
    def section(self, name: str):
        t0 = time.time()
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        try:
            yield
        except Exception:
            tb = traceback.format_exc()
            self.data["errors"][name] = tb
            print(f"  FAILED {name}:\n{tb}", flush=True)
        finally:
            print(f"  {name}: {time.time() - t0:.1f}s", flush=True)
            self.save()


def as_list(out):
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def max_err(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def validate_model(log, name, meta, d, gpu, dev, args, first):
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from tvm_nimble.bench.harness import GPU_MODES, NIMBLE_SYSTEMS, System, interleaved_timing
    from tvm_nimble.runtime.loading import NimbleExecutor
    from tvm_nimble.runtime.module import load
    from tvm_nimble.bench.timing import host_cost_us

    entry = log.data["models"].setdefault(name, {})
    io = np.load(os.path.join(d, "io.npz"))
    inputs = [io[f"in_{k}"] for k in meta["inputs"]]
    ref = [io[f"ref_{i}"] for i in range(meta["num_outputs"])]
    execs, vms = {}, {}
    with log.section(f"{name}: load"):
        module = load(os.path.join(d, "nimble"))
        entry.update({"kernels": len(module.plan.launches), "streams": module.plan.num_streams,
                      "events": module.plan.num_events, "memory": module.plan.memory})
    for mode in (GPU_MODES if gpu else ("sequential",)):
        with log.section(f"{name}: prepare {mode}"):
            execs[mode] = NimbleExecutor(module, dev, mode=mode)
    for label, lib in (("tvm-vm", "vm.so"), ("tvm-vm-cudagraph", "vm_graph.so")):
        with log.section(f"{name}: load {label}"):
            vm = VirtualMachine(tvm.runtime.load_module(os.path.join(d, lib)), dev)
            vms[label] = (vm["main"], [tvm.runtime.tensor(x, dev) for x in inputs])
    with log.section(f"{name}: correctness"):
        errs = {}
        vm_out = as_list(vms["tvm-vm"][0](*vms["tvm-vm"][1]))
        errs["vm vs onnx-reference"] = max_err(vm_out, ref)
        for mode, ex in execs.items():
            errs[f"nimble-{mode} vs vm"] = max_err([o.numpy() for o in ex(*inputs)], vm_out)
        if "tvm-vm-cudagraph" in vms:
            g = vms["tvm-vm-cudagraph"]
            errs["vm-cudagraph vs vm"] = max_err(as_list(g[0](*g[1])), vm_out)
        entry["max_abs_err"] = errs
        scale = max(1.0, float(np.abs(vm_out[0]).max()))
        entry["outputs_match"] = all(v < 1e-3 * scale for v in errs.values()) and len(execs) == (len(GPU_MODES) if gpu else 1)
    with log.section(f"{name}: timing"):
        for ex in execs.values():
            for i, x in enumerate(inputs):
                ex.set_input(i, x)
        vm_call = {k: (lambda f=f: f[0](*f[1])) for k, f in vms.items()}
        systems = [System(k, fn, dev.sync, None) for k, fn in vm_call.items()]
        systems += [System(NIMBLE_SYSTEMS[m], ex.run, ex.sync, None) for m, ex in execs.items()]
        entry["timing_ms"] = interleaved_timing(systems, rounds=args.rounds, iters=args.iters, warmup=20)
    main_mode = "cuda-graph" if gpu else "sequential"
    with log.section(f"{name}: host cost"):
        ex = execs[main_mode]
        entry["host_us_nimble_graph_launch"] = host_cost_us(ex.run, sync=ex.sync)
        entry["host_us_tvm_vm_call"] = host_cost_us(vm_call["tvm-vm"], iters=500, sync=dev.sync)
    entry["timeline"], entry["timeline_live"] = [], []
    if gpu:
        with log.section(f"{name}: timeline (graph replay)"):
            entry["timeline"] = execs["cuda-graph"].profile()
        with log.section(f"{name}: timeline (live issue)"):
            entry["timeline_live"] = execs["streams"].profile()
    if first and args.long_runs:
        with log.section(f"{name}: long run"):
            ex = execs[main_mode]
            before = mem_used_mib(gpu)
            ex.run()
            base = ex.get_output(0).numpy().copy()
            mismatches = 0
            for _ in range(args.long_runs):
                ex.run()
                if not np.array_equal(ex.get_output(0).numpy(), base):
                    mismatches += 1
            entry["long_run"] = {"runs": args.long_runs, "bit_identical": mismatches == 0, "mismatches": mismatches,
                                 "mem_used_mib_before": before, "mem_used_mib_after": mem_used_mib(gpu)}
    for e in execs.values():
        e.close()
    return module, inputs


def reliability_checks(log, module, inputs, dev):
    """The #9 checks that need a GPU, on one model."""
    from tvm_nimble.errors import NimbleError
    from tvm_nimble.runtime.loading import NimbleExecutor
    from tvm_nimble.runtime.module import NimbleModule

    checks = log.data.setdefault("checks", {})
    with log.section("check: runtime-only install"):
        relax_ok = True
        try:
            from tvm import relax

            relax.transform.LegalizeOps  # noqa: B018
        except Exception:
            relax_ok = False
        maps = open("/proc/self/maps").read()
        checks["runtime_only"] = {"tvm.relax importable": relax_ok,
                                  "libtvm_compiler loaded": "libtvm_compiler" in maps,
                                  "libtvm_runtime_cuda loaded": "libtvm_runtime_cuda" in maps}
    ref = None
    with log.section("check: torch cuda tensor input (DLPack)"):
        import torch

        with NimbleExecutor(module, dev) as ex:
            ref = [o.numpy() for o in ex(*inputs, copy=True)]
            xs = [torch.from_numpy(x).cuda() for x in inputs]
            before = torch.cuda.memory_allocated()
            outs = [o.numpy() for o in ex(*xs, copy=True)]
            checks["torch_dlpack_input"] = {"equal": all(np.array_equal(a, b) for a, b in zip(outs, ref)),
                                            "torch_alloc_growth_bytes": torch.cuda.memory_allocated() - before}
            out_t = torch.from_dlpack(ex.get_output(0))
            checks["torch_dlpack_output_is_cuda"] = str(out_t.device)
    with log.section("check: threads share one executor"):
        with NimbleExecutor(module, dev) as ex:
            scaled = {k: [x * (1 + 0.25 * k) for x in inputs] for k in range(4)}
            want = {k: [o.numpy() for o in ex(*scaled[k], copy=True)] for k in scaled}
            bad = []

            def worker(k):
                for _ in range(100):
                    got = [o.numpy() for o in ex(*scaled[k], copy=True)]
                    if not all(np.array_equal(a, b) for a, b in zip(got, want[k])):
                        bad.append(k)

            ts = [threading.Thread(target=worker, args=(k,)) for k in scaled]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            checks["threads"] = {"threads": 4, "calls_each": 100, "wrong_results": len(bad)}
    with log.section("check: close frees device memory"):
        import gc

        gc.collect()
        m0 = mem_used_mib(True)
        execs = [NimbleExecutor(module, dev) for _ in range(5)]
        m1 = mem_used_mib(True)
        for e in execs:
            e.close()
        del execs
        gc.collect()
        m2 = mem_used_mib(True)
        checks["close_frees"] = {"mib_before": m0, "mib_with_5_executors": m1, "mib_after_close": m2,
                                 "plan_mib_each": sum(s.nbytes for s in module.plan.storages) / 2**20}
    with log.section("check: out of memory at prepare"):
        huge = dataclasses.replace(module.plan, storages=[dataclasses.replace(s) for s in module.plan.storages])
        huge.storages[-1].nbytes = 1 << 40  # 1 TiB
        m0 = mem_used_mib(True)
        try:
            NimbleExecutor(NimbleModule(huge, module.kernels, module.params), dev)
            checks["oom"] = {"raised": None}
        except NimbleError as err:
            checks["oom"] = {"raised": type(err).__name__, "message": str(err)}
        checks["oom"]["mib_before"], checks["oom"]["mib_after"] = m0, mem_used_mib(True)
    with log.section("check: GPU arch mismatch"):
        other = dataclasses.replace(module.plan, target={**module.plan.target, "arch": "sm_80"})
        try:
            NimbleExecutor(NimbleModule(other, module.kernels, module.params), dev)
            checks["arch_mismatch"] = {"raised": None}
        except NimbleError as err:
            checks["arch_mismatch"] = {"raised": type(err).__name__, "message": str(err)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--art", default="out/gpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "out/gpu-results"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--long-runs", type=int, default=10000)
    ap.add_argument("--models", help="comma-separated subset of the prepared models")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    with open(os.path.join(args.art, "index.json")) as f:
        index = json.load(f)
    gpu = index["arch"] != "cpu"  # "cpu": a dry run of this whole script on llvm artifacts
    if gpu:
        from tvm_nimble.runtime.device import ensure_cuda_runtime

        ensure_cuda_runtime()
    import tvm

    from tvm_nimble.bench.harness import device_name

    dev = tvm.cuda(0) if gpu else tvm.cpu(0)
    device = device_name(gpu)
    today = datetime.date.today().isoformat()
    log = Log(os.path.join(args.out, "gpu_validate.json"),
              {"device": device, "date": today, "tvm": tvm.__version__, "models": {}})
    names = args.models.split(",") if args.models else list(index["models"])
    first, kept = True, None
    for name in names:
        meta = index["models"][name]
        try:
            module, inputs = validate_model(log, name, meta, os.path.join(args.art, name), gpu, dev, args, first)
            kept = kept or (module, inputs)
        except Exception:
            log.data["errors"][name] = traceback.format_exc()
            print(log.data["errors"][name], flush=True)
        first = False
        log.save()
    if gpu and kept:
        reliability_checks(log, *kept, dev)
    rows = []
    for name, e in log.data["models"].items():
        for system, (med, p90) in e.get("timing_ms", {}).items():
            rows.append({"date": today, "device": device, "model": name, "batch": index["models"][name]["batch"],
                         "dtype": "float32", "kernels": "tvm-default", "system": system, "median_ms": f"{med:.4f}",
                         "p90_ms": f"{p90:.4f}"})
    with open(os.path.join(args.out, "results_rows.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["date"])
        writer.writeheader()
        writer.writerows(rows)
    log.save()
    print(f"\n{device}  TVM {tvm.__version__}  batch 1 fp32  (median ms / p90 ms)")
    for name, e in log.data["models"].items():
        t = e.get("timing_ms", {})
        base = t.get("tvm-vm-cudagraph", t.get("tvm-vm", [None]))[0]  # on CPU the "cudagraph" VM is the plain VM
        print(f"{name}: {e.get('kernels')} kernels, {e.get('streams')} streams, "
              f"outputs match: {e.get('outputs_match')}, host/launch {e.get('host_us_nimble_graph_launch', -1):.1f} us")
        for s, (m, p) in t.items():
            print(f"  {s:30s} {m:8.4f} {p:8.4f}  {base / m:5.2f}x vs vm+graph")
        if "long_run" in e:
            print(f"  long run: {e['long_run']}")
    for k, v in log.data.get("checks", {}).items():
        print(f"check {k}: {v}")
    if log.data["errors"]:
        print(f"ERRORS in: {', '.join(log.data['errors'])}")


if __name__ == "__main__":
    main()
