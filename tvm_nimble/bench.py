"""Benchmark harness: Nimble vs stock TVM (and PyTorch / TensorRT where present), side by side.

Every system is built from the same model, outputs are checked against stock TVM first,
then all systems are timed in one process, interleaved round by round, after warm-up.
Results are appended to ``results.csv`` (date, device, model, batch, dtype, system,
median_ms, p90_ms); ``RESULTS.md`` and a bar chart are regenerated from the whole CSV.
A system that cannot run here (no GPU, no torch, no TensorRT) is reported as such, never
with a made-up number.
"""
from __future__ import annotations

import csv
import datetime
import os
import platform
import re
import textwrap
from dataclasses import dataclass

import numpy as np

CSV_COLUMNS = ["date", "device", "model", "batch", "dtype", "system", "median_ms", "p90_ms"]
BASELINE_GPU = "tvm-vm-cudagraph"
BASELINE_CPU = "tvm-vm"
#: executor mode -> system name in results.csv
NIMBLE_SYSTEMS = {"single-stream": "nimble-single-stream-graph", "cuda-graph": "nimble-multi-stream-graph",
                  "streams": "nimble-multi-stream-nograph", "sequential": "nimble-aot-cpu"}
GPU_MODES = ("single-stream", "cuda-graph", "streams")


@dataclass
class System:
    name: str
    run: object  # callable: one inference
    sync: object  # callable: wait for completion
    outputs: object  # callable -> list[np.ndarray]


def device_name(use_gpu: bool) -> str:
    if use_gpu:
        try:
            from cuda.bindings import runtime as rt

            _, prop = rt.cudaGetDeviceProperties(0)
            name = prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name)
            return name.split("\x00")[0].strip()
        except Exception:
            return "cuda GPU"
    return f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()}"


DTYPES = ("float32", "float16")


def with_precision(model, dtype: str):
    """The Relax module of ``model`` computing in ``dtype``; inputs and outputs stay float32.

    float16 uses TVM's own ``ToMixedPrecision`` (every TVM and Nimble row then shares the same
    fp16 kernels); PyTorch rows run the model in ``.half()`` for parity. ``ToMixedPrecision``
    leaves a cast of every fp32 weight in the graph; they are folded into fp16 constants here,
    once, instead of by the ``FoldConstant`` of each of the three builds (seconds each).
    """
    import tvm
    from tvm import relax

    from .frontend import from_onnx

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    mod = model if isinstance(model, tvm.IRModule) else from_onnx(model)
    if dtype == "float32":
        return mod
    return relax.transform.FoldConstant()(relax.transform.ToMixedPrecision(out_dtype=dtype)(mod))


def tvm_systems(model, target, device, inputs: list[np.ndarray], use_gpu: bool, tuning_db=None,
                nimble=None) -> list[System]:
    """Stock TVM and Nimble systems, all from the same kernels (and tuning database).

    ``model`` is an ONNX model or a Relax IRModule; ``nimble`` is a NimbleModule already built from ``model`` for ``target`` (built here if None).
    """
    from .builder import open_tuning_database, build
    from .executor import NimbleExecutor
    from .frontend import from_onnx
    from .stock import StockVM, build_stock_vm

    import tvm

    mod = model if isinstance(model, tvm.IRModule) else from_onnx(model)
    db = open_tuning_database(tuning_db) if tuning_db else None
    systems = []
    vm = StockVM(build_stock_vm(mod, target, tuning_database=db), device, inputs)
    systems.append(System("tvm-vm", vm, vm.sync, vm.outputs))
    if use_gpu:
        g = StockVM(build_stock_vm(mod, target, cuda_graph=True, tuning_database=db), device, inputs)
        systems.append(System("tvm-vm-cudagraph", g, g.sync, g.outputs))
    nimble = nimble or build(mod, target, tuning_db=tuning_db)
    for mode in GPU_MODES if use_gpu else ("sequential",):
        ex = NimbleExecutor(nimble, device, mode=mode)
        for i, x in enumerate(inputs):
            ex.set_input(i, x)

        def outs(ex=ex):
            ex.run()
            return [ex.get_output(i).numpy() for i in range(ex.get_num_outputs())]

        systems.append(System(NIMBLE_SYSTEMS[mode], ex.run, ex.sync, outs))
    return systems


def torch_systems(torch_model, inputs: list[np.ndarray], dtype: str = "float32") -> tuple[list[System], list[str]]:
    """PyTorch eager, CUDA graph and torch.compile(reduce-overhead), when torch and a GPU exist."""
    try:
        import torch
    except ImportError:
        return [], ["PyTorch not installed: torch rows skipped"]
    if torch_model is None:
        return [], ["no PyTorch definition of this model (zoo models are ONNX): torch rows skipped"]
    if not torch.cuda.is_available():
        return [], ["PyTorch has no CUDA device here: torch rows skipped"]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = torch_model.eval().cuda()
    xs = [torch.from_numpy(x).cuda() for x in inputs]
    if dtype == "float16":
        model, xs = model.half(), [x.half() for x in xs]
    sync = torch.cuda.synchronize
    systems = []

    def eager():
        with torch.no_grad():
            return model(*xs)

    systems.append(System("torch-eager", eager, sync, lambda: [eager().float().cpu().numpy()]))
    static_out = [None]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(*xs)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_out[0] = model(*xs)
    def replayed():  # capture does not execute: replay before reading the static output
        graph.replay()
        sync()
        return [static_out[0].float().cpu().numpy()]

    systems.append(System("torch-cudagraph", graph.replay, sync, replayed))
    compiled = torch.compile(model, mode="reduce-overhead")

    def comp():
        with torch.no_grad():
            return compiled(*xs)

    systems.append(System("torch-compile", comp, sync, lambda: [comp().clone().float().cpu().numpy()]))
    return systems, []


def tensorrt_systems(onnx_model, inputs) -> tuple[list[System], list[str]]:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return [], ["TensorRT not installed: no TensorRT row (it cannot be installed on our machines)"]
    return [], ["TensorRT is importable but its ONNX-parser baseline is not implemented yet: no row"]


def interleaved_timing(systems: list[System], rounds: int = 5, iters: int = 50, warmup: int = 10) -> dict:
    """Time each system ``iters`` times per round, rounds interleaved: name -> (median ms, p90 ms)."""
    import time

    samples = {s.name: [] for s in systems}
    for s in systems:
        for _ in range(warmup):
            s.run()
        s.sync()
    for _ in range(rounds):
        for s in systems:
            for _ in range(iters):
                t0 = time.perf_counter()
                s.run()
                s.sync()
                samples[s.name].append((time.perf_counter() - t0) * 1e3)
    return {k: (float(np.median(v)), float(np.percentile(v, 90))) for k, v in samples.items()}


def check_agreement(systems: list[System], reference_name: str, rtol=1e-3, atol=1e-3) -> dict:
    ref = next(s for s in systems if s.name == reference_name).outputs()
    errors = {}
    for s in systems:
        out = s.outputs()
        err = max(float(np.abs(np.asarray(o) - r).max()) for o, r in zip(out, ref))
        errors[s.name] = err
        scale = max(1.0, max(float(np.abs(r).max()) for r in ref))
        if err > atol * scale + rtol * scale:
            raise AssertionError(f"{s.name} disagrees with {reference_name}: max abs error {err:.3g}")
    return errors


def append_rows(csv_path: str, rows: list[dict]) -> None:
    new = not os.path.exists(csv_path)
    os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
    with open(csv_path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k in CSV_COLUMNS})


def read_rows(csv_path: str) -> list[dict]:
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


_TUNING_LABEL = re.compile(r"^(?P<model>.+) \((?:(?P<untuned>untuned; vs)|tuned) (?P<trials>\d+) trials\)$")


def database_trials(path: str) -> int:
    """Trials recorded in a MetaSchedule JSON database directory (one line per trial)."""
    with open(os.path.join(path, "database_tuning_record.json")) as f:
        return sum(1 for line in f if line.strip())


def tuning_label(model: str, trials: int, tuned: bool) -> str:
    """Model label of a tuned run, or of its untuned companion run: unique per database state, so runs of
    one day at different tuning stages never share a table."""
    return f"{model} (tuned {trials} trials)" if tuned else f"{model} (untuned; vs {trials} trials)"


def parse_tuning_label(label: str):
    """(model, tuned?, trials) of a label made by :func:`tuning_label`, else None."""
    m = _TUNING_LABEL.match(label)
    return (m["model"], m["untuned"] is None, int(m["trials"])) if m else None


HEADLINE_SYSTEMS = [("nimble-multi-stream-graph", "Nimble multi-stream graph"),
                    ("nimble-single-stream-graph", "Nimble 1-stream graph"),
                    (BASELINE_GPU, "TVM VM + CUDA graph"), ("torch-eager", "PyTorch eager"),
                    ("torch-cudagraph", "PyTorch CUDA graph"), ("torch-compile", "torch.compile")]


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows per table: (device, date, model, batch, dtype); GPU devices first."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["device"], r["date"], r["model"], r["batch"], r["dtype"]), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0].startswith("CPU"), kv[0][0], kv[0][2],
                                                       int(kv[0][3]), kv[0][1])))


def headline_table(rows: list[dict]) -> list[str]:
    """One table per GPU and dtype (float32 first), one line per model and batch (newest run): median ms of
    the key systems and Nimble's ratios."""
    latest: dict[tuple, dict] = {}
    for (device, date, model, batch, dtype), rs in _groups(rows).items():
        if parse_tuning_label(model):
            continue  # tuned-vs-untuned runs have their own table
        by = {r["system"]: float(r["median_ms"]) for r in rs}
        if BASELINE_GPU in by and "nimble-multi-stream-graph" in by:
            latest.setdefault((device, dtype), {})[(model, batch)] = by
    head = ["model", "batch"] + [label for _, label in HEADLINE_SYSTEMS] + ["Nimble vs TVM VM+graph",
                                                                           "Nimble vs PyTorch CUDA graph"]
    out = []
    for device, dtype in sorted(latest, key=lambda k: (k[0], k[1] != "float32", k[1])):
        precision = "TF32 off on both sides" if dtype == "float32" else "TVM ToMixedPrecision, PyTorch .half()"
        out += [f"**{device}, {dtype}** ({precision}): median latency in ms; ratios > 1 mean Nimble is faster.", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (model, batch), by in latest[(device, dtype)].items():
            nimble = by["nimble-multi-stream-graph"]
            cells = [model, batch] + [f"{by[k]:.3f}" if k in by else "-" for k, _ in HEADLINE_SYSTEMS]
            cells += [f"**{by[BASELINE_GPU] / nimble:.2f}x**",
                      f"{by['torch-cudagraph'] / nimble:.2f}x" if "torch-cudagraph" in by else "-"]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return out[:-1]


def tuning_table(rows: list[dict]) -> list[str]:
    """Tuned runs next to their untuned companion runs (same device and day): what tuning gives stock TVM and
    Nimble, and Nimble's ratio once both use the tuned kernels. PyTorch's CUDA graph, timed in both runs and
    independent of tuning, shows whether the two runs measured alike."""
    pairs: dict[tuple, dict[bool, dict]] = {}
    for (device, date, label, batch, dtype), rs in _groups(rows).items():
        parsed = parse_tuning_label(label)
        if parsed:
            model, tuned, trials = parsed
            pairs.setdefault((device, date, model, batch, dtype, trials), {})[tuned] = \
                {r["system"]: float(r["median_ms"]) for r in rs}
    head = ["device", "model", "batch", "dtype", "trials", "TVM untuned", "TVM tuned", "Nimble untuned",
            "Nimble tuned", "tuning gain (TVM)", "Nimble vs TVM, both tuned", "Nimble tuned vs TVM untuned",
            "PyTorch CUDA graph, untuned run / tuned run"]
    lines = []
    for (device, date, model, batch, dtype, trials), p in sorted(pairs.items(), key=lambda kv: kv[0]):
        if len(p) < 2:
            continue
        u, t = p[False], p[True]
        gpu = BASELINE_GPU in u
        base, nimble = (BASELINE_GPU, NIMBLE_SYSTEMS["cuda-graph"]) if gpu else (BASELINE_CPU, NIMBLE_SYSTEMS["sequential"])
        if not all(s in d for d in (u, t) for s in (base, nimble)):
            continue
        lines.append(f"| {device} ({date}) | {model} | {batch} | {dtype} | {trials} | {u[base]:.3f} | {t[base]:.3f} | "
                     f"{u[nimble]:.3f} | {t[nimble]:.3f} | {u[base] / t[base]:.2f}x | "
                     f"**{t[base] / t[nimble]:.2f}x** | {u[base] / t[nimble]:.2f}x | {_both(u, t, 'torch-cudagraph')} |")
    if not lines:
        return []
    return ["Median ms. Each line pairs a tuned run with its untuned companion on the same device and day, normally "
            "one process (`bench --with-untuned`: the untuned kernels, then the tuned ones); Findings names any "
            "pair timed in two processes. "
            "TVM: the VM with its CUDA graph on a GPU (the VM on CPU); Nimble: the multi-stream CUDA graph (the "
            "ahead-of-time replay on CPU). trials: MetaSchedule trials in the database.", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + lines


def _both(u: dict, t: dict, system: str) -> str:
    return f"{u[system]:.3f} / {t[system]:.3f}" if system in u and system in t else "-"


def write_report(csv_path: str, md_path: str, png_path: str | None, notes: list[str] | None = None,
                 versions: str = "") -> None:
    """Regenerate RESULTS.md (and a bar chart) from every row of the CSV.

    ``findings.md`` beside the CSV, when present, is the hand-written analysis and is included
    as is; ``notes`` are this run's remarks (what could not run and why).
    """
    rows = read_rows(csv_path)
    groups = _groups(rows)
    lines = ["# Benchmark results", "",
             "Generated from `benchmarks/results.csv` (by `tvm-nimble bench` / `scripts/record_gpu_results.py`); "
             "every table is one run on one device, all its systems timed interleaved in the same process after "
             "their outputs were checked against the stock TVM VM. Speedups are ratios of medians.", ""]
    if versions:
        lines += [versions, ""]
    headline = headline_table(rows)
    if headline:
        lines += ["## Headline (GPU)", ""] + headline + [""]
    tuning = tuning_table(rows)
    if tuning:
        lines += ["## Tuned kernels", ""] + tuning + [""]
    findings = os.path.join(os.path.dirname(os.path.abspath(csv_path)), "findings.md")
    if os.path.exists(findings):
        lines += [open(findings).read().strip(), ""]
    if notes:
        lines += ["## Notes on the latest run", ""] + [f"- {n}" for n in notes] + [""]
    lines += ["## All runs", ""]
    for (device, date, model, batch, dtype), rs in groups.items():
        by = {r["system"]: float(r["median_ms"]) for r in rs}
        base = BASELINE_GPU if BASELINE_GPU in by else BASELINE_CPU
        lines += [f"### {model}, batch {batch}, {dtype} — {device} ({date})", "",
                  f"| system | median ms | p90 ms | speedup vs {base} |" + (" vs torch-eager |" if "torch-eager" in by else ""),
                  "|---|---|---|---|" + ("---|" if "torch-eager" in by else "")]
        for r in rs:
            m = float(r["median_ms"])
            line = f"| {r['system']} | {m:.4f} | {float(r['p90_ms']):.4f} | {by[base] / m:.2f}x |"
            if "torch-eager" in by:
                line += f" {by['torch-eager'] / m:.2f}x |"
            lines.append(line)
        lines.append("")
    with open(md_path, "w") as f:
        f.write("\n".join(lines))
    if png_path:
        _bar_chart(groups, png_path)


def _bar_chart(groups, png_path):
    """Grouped bars per device: each model/batch's systems as speedup over the device's baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latest: dict[str, dict[str, dict[str, float]]] = {}
    parsed = {k: parse_tuning_label(k[2]) for k in groups}
    tuned = {(k[0], p[0], k[3], k[4]) for k, p in parsed.items() if p and p[1]}
    for (device, date, model, batch, dtype), rs in sorted(groups.items(), key=lambda kv: kv[0][1]):
        p = parsed[(device, date, model, batch, dtype)]
        if p:  # one bar group per tuning state: the newest tuned run, else the untuned companion run
            if not p[1] and (device, p[0], batch, dtype) in tuned:
                continue
            model = f"{p[0]} {'tuned' if p[1] else 'untuned'}"
        label = textwrap.fill(model, 11, break_long_words=False) + f"\nb{batch}" + ("" if dtype == "float32" else f" {dtype}")
        latest.setdefault(device, {})[label] = {r["system"]: float(r["median_ms"]) for r in rs}  # newest wins
    most = max(len(models) for models in latest.values())  # about 0.8 in per bar group keeps labels apart
    fig, axes = plt.subplots(len(latest), 1, figsize=(max(11, 0.8 * most + 2), 3.8 * len(latest)), squeeze=False)
    for ax, (device, models) in zip(axes[:, 0], latest.items()):
        base = BASELINE_GPU if any(BASELINE_GPU in by for by in models.values()) else BASELINE_CPU
        systems = list(dict.fromkeys(k for by in models.values() for k in by))
        width = 0.8 / max(len(systems), 1)
        cmap = plt.get_cmap("tab10")
        for j, system in enumerate(systems):
            xs = [i + (j - (len(systems) - 1) / 2) * width for i, by in enumerate(models.values())]
            ys = [by[base] / by[system] if system in by and base in by else 0 for by in models.values()]
            ax.bar(xs, ys, width, label=system, color=cmap(j % 10),
                   edgecolor="black" if system.startswith("nimble-multi") else None)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xticks(range(len(models)), list(models), fontsize=8)
        ax.set_ylabel(f"speedup vs {base}\n(higher is better)", fontsize=8)
        ax.set_title(device, fontsize=9)
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def run_benchmark(models: dict, target=None, batches=(1,), rounds: int = 5, iters: int = 50,
                  out_dir: str = "benchmarks", tuning_db: str | None = None, torch_models: dict | None = None,
                  dtype: str = "float32", torch_cache: dict | None = None) -> tuple[list[dict], list[str]]:
    """Benchmark ``models`` ({name: builder(batch=) -> onnx model}); returns (rows, notes).

    ``torch_cache`` (a dict the caller keeps) lets a second run reuse the PyTorch systems built by the first:
    they do not depend on the tuning database, and torch.compile costs up to a minute per model. They are
    timed again, interleaved with the new run's systems."""
    import tvm

    from . import zoo
    from .builder import normalize_target
    from .demo import gpu_available

    if target is None:
        use_gpu = gpu_available()
    else:
        use_gpu = (target if isinstance(target, dict) else {"kind": target}).get("kind") == "cuda"
    if use_gpu:
        dev = tvm.cuda(0)
        t = normalize_target(target if isinstance(target, dict) else
                             {"kind": "cuda", "arch": f"sm_{dev.compute_version.replace('.', '')}"})
    else:
        dev, t = tvm.cpu(0), normalize_target({"kind": "llvm"})
    device = device_name(use_gpu)
    today = datetime.date.today().isoformat()
    rows, notes = [], []
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "results.csv")
    for name, builder in models.items():
        for batch in batches:
            print(f"[bench] {name} batch {batch} {dtype}: building", flush=True)
            model = builder(batch=batch)
            inputs = list(zoo.random_inputs(model, seed=0).values())
            systems = tvm_systems(with_precision(model, dtype), t, dev, inputs, use_gpu, tuning_db)
            tm = (torch_models or {}).get(name)
            key = (tm, batch, dtype)
            if torch_cache is not None and key in torch_cache:
                extra, why = torch_cache[key]
            else:
                extra, why = torch_systems(tm(batch) if callable(tm) else tm, inputs, dtype)
                if torch_cache is not None and tm is not None:
                    torch_cache[key] = extra, why
            systems += extra
            trt, why_trt = tensorrt_systems(model, inputs)
            systems += trt
            for w in why + why_trt:
                if w not in notes:
                    notes.append(w)
            # fp16 rows agree to fp16 precision (different kernels round differently)
            tol = 1e-3 if dtype == "float32" else 2e-2
            check_agreement(systems, "tvm-vm", rtol=tol, atol=tol)
            timing = interleaved_timing(systems, rounds=rounds, iters=iters)
            new = [{"date": today, "device": device, "model": name, "batch": batch, "dtype": dtype,
                    "system": system, "median_ms": f"{med:.4f}", "p90_ms": f"{p90:.4f}"}
                   for system, (med, p90) in timing.items()]
            print(f"[bench] {name} batch {batch}: " + ", ".join(f"{r['system']} {r['median_ms']}" for r in new), flush=True)
            append_rows(csv_path, new)  # model by model: a run cut short keeps what it measured
            rows += new
    if not use_gpu:
        notes.append("CPU run: CUDA-graph and multi-stream systems need a GPU; on CPU Nimble replays the plan "
                     "sequentially (ahead-of-time, no VM interpretation).")
    versions = f"TVM {tvm.__version__}, tvm-nimble, numpy {np.__version__}, Python {platform.python_version()}"
    write_report(csv_path, os.path.join(out_dir, "RESULTS.md"), os.path.join(out_dir, "results.png"), notes, versions)
    return rows, notes
