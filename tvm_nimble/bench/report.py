"""Benchmark results: the CSV every run appends to, and the report regenerated from all of it.

``results.csv`` has one row per (date, device, model, batch, dtype, kernels, db_trials, system) with median
and p90 ms. ``kernels`` says which kernels the TVM/Nimble systems ran (``tvm-default``: DLight's default
schedules; ``tvm-tuned``: a MetaSchedule database; ``vendor``/``best``: cuDNN/cuBLAS, all or chosen per
operator); ``db_trials`` is the trial count of the tuning database a run was paired with (an untuned run
timed as the companion of a tuned one carries it too), empty otherwise; ``rel_err`` is the relative L2
error of the system's output against the reference, where measured; ``build_s`` the seconds from the model
to the system ready to run (a TVM or Nimble build, torch.compile's first calls, an ONNX Runtime session),
where measured (empty in rows from before the column existed).
``RESULTS.md`` holds the headline tables (one per GPU and dtype), the tuned-vs-untuned table, the serving runs of
``serving.csv`` beside the CSV, the hand-written ``findings.md`` beside it, and every run's own table; ``results.png``
the chart.
"""
from __future__ import annotations

import csv
import os
import textwrap

CSV_COLUMNS = ["date", "device", "model", "batch", "dtype", "kernels", "db_trials", "system", "median_ms", "p90_ms",
               "rel_err", "build_s"]
KERNELS = ("tvm-default", "tvm-tuned", "vendor", "best")
#: ``serving.csv`` (beside results.csv; ``scripts/experiments/serve_load.py`` writes its rows): one Poisson load of one
#: serving engine on some replicas (``capacity_per_s``: the closed loop's, the same on every load's row)
SERVING_COLUMNS = ["date", "device", "model", "precision", "kernels", "buckets", "engine", "replicas", "capacity_per_s",
                   "rate_per_s", "requests", "p50_ms", "p99_ms", "throughput_per_s", "check_rel", "build_s"]
_DEFAULTS = {"kernels": "tvm-default", "db_trials": "", "rel_err": "", "build_s": ""}
BASELINE_GPU = "tvm-vm-cudagraph"
BASELINE_CPU = "tvm-vm"
#: executor mode -> system name in results.csv
NIMBLE_SYSTEMS = {"single-stream": "nimble-single-stream-graph", "cuda-graph": "nimble-multi-stream-graph",
                  "streams": "nimble-multi-stream-nograph", "sequential": "nimble-aot-cpu"}


def append_rows(csv_path: str, rows: list[dict], columns: list[str] = CSV_COLUMNS,
                defaults: dict | None = None) -> None:
    """Append ``rows`` to ``csv_path`` (header first if new); a missing field takes its default, else ''."""
    defaults = _DEFAULTS if defaults is None else defaults
    new = not os.path.exists(csv_path)
    os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
    if not new:
        _widen(csv_path, columns, defaults)
    with open(csv_path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, defaults.get(k, "")) for k in columns})


def _widen(csv_path: str, columns: list[str], defaults: dict) -> None:
    """Rewrite a CSV whose header lacks some of ``columns`` (one written before a column was added) with the
    full header, its rows keeping their values and taking the defaults of the new columns (atomically)."""
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        if header == columns:
            return
        rows = list(reader)
    extra = [c for c in header if c not in columns]
    if extra:
        raise ValueError(f"{csv_path} has columns this version does not write ({', '.join(extra)}): "
                         "append to another file")
    tmp = f"{csv_path}.{os.getpid()}.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) if r.get(k) is not None else defaults.get(k, "") for k in columns})
    os.replace(tmp, csv_path)


def read_rows(csv_path: str) -> list[dict]:
    with open(csv_path, newline="") as f:
        return [{**_DEFAULTS, **{k: v for k, v in r.items() if v is not None}} for r in csv.DictReader(f)]


def database_trials(path: str) -> int:
    """Trials recorded in a MetaSchedule JSON database directory (one line per trial)."""
    with open(os.path.join(path, "database_tuning_record.json")) as f:
        return sum(1 for line in f if line.strip())


def tuning_pair(key: tuple):
    """(tuned?, trials) for a run that belongs to a tuned-vs-untuned pair (see :func:`_groups`), else None."""
    kernels, db_trials = key[5], key[6]
    return (kernels == "tvm-tuned", int(db_trials)) if db_trials else None


def run_label(key: tuple) -> str:
    """How a run is named in tables and charts: the model, and its kernels unless TVM's defaults."""
    model, kernels, db_trials = key[2], key[5], key[6]
    if db_trials:
        return f"{model} ({'tuned' if kernels == 'tvm-tuned' else 'untuned; vs'} {db_trials} trials)"
    return model if kernels == "tvm-default" else f"{model} ({kernels} kernels)"


HEADLINE_SYSTEMS = [("nimble-multi-stream-graph", "Nimble multi-stream graph"),
                    ("nimble-single-stream-graph", "Nimble 1-stream graph"),
                    (BASELINE_GPU, "TVM VM + CUDA graph"), ("torch-eager", "PyTorch eager"),
                    ("torch-cudagraph", "PyTorch CUDA graph"), ("torch-compile", "torch.compile")]


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows per run: (device, date, model, batch, dtype, kernels, db_trials); GPU devices first."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        r = {**_DEFAULTS, **r}
        key = (r["device"], r["date"], r["model"], r["batch"], r["dtype"], r["kernels"], r["db_trials"])
        groups.setdefault(key, []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0].startswith("CPU"), kv[0][0], kv[0][2],
                                                       int(kv[0][3]), kv[0][1])))


def _medians(rs: list[dict]) -> dict[str, float]:
    """system -> median ms of one run's rows."""
    return {r["system"]: float(r["median_ms"]) for r in rs}


def headline_table(rows: list[dict]) -> list[str]:
    """One table per GPU and dtype (float32 first), one line per model and batch (newest run): median ms of
    the key systems and Nimble's ratios (of its multi-stream CUDA graph, or of its auto-streams build where a
    run skipped the former)."""
    latest: dict[tuple, dict] = {}
    for key, rs in _groups(rows).items():
        device, _, _, batch, dtype = key[:5]
        if tuning_pair(key):
            continue  # tuned-vs-untuned runs have their own table
        by = _medians(rs)
        gpu_run = "nimble-multi-stream-graph" in by or "nimble-auto" in by  # GPU-only systems
        if gpu_run and any(peer in by for peer in (BASELINE_GPU, "torch-cudagraph", "torch-compile", "ort-cuda-graph")):
            latest.setdefault((device, dtype), {})[(run_label(key), batch)] = by
    has_ort = any(r["system"] == "ort-cuda-graph" for r in rows)
    systems = HEADLINE_SYSTEMS[:1] + ([("nimble-auto", "Nimble auto streams")] if any(
        r["system"] == "nimble-auto" for r in rows) else []) + HEADLINE_SYSTEMS[1:]
    systems += [("tensorrt", "TensorRT")] if any(r["system"] == "tensorrt" for r in rows) else []
    systems += [("ort-cuda-graph", "ONNX Runtime CUDA EP + graph")] if has_ort else []
    head = ["model", "batch"] + [label for _, label in systems] + [
        "Nimble vs PyTorch CUDA graph", "Nimble vs torch.compile"] + (["Nimble vs ONNX Runtime"] if has_ort else []) + [
        "Nimble vs TVM VM+graph (same kernels)"]
    out = []
    for device, dtype in sorted(latest, key=lambda k: (k[0], k[1] != "float32", k[1])):
        precision = {"float32": "TF32 off on every side", "tf32": "TF32 on every side",
                     "float16": "Nimble's fp16 policy (TVM's ToMixedPrecision in rows before 2026-11-25), PyTorch .half(), "
                                "ONNX Runtime on an fp16-converted model",
                     "bfloat16": "Nimble's bf16 policy, PyTorch .bfloat16()"}.get(dtype, dtype)
        out += [f"**{device}, {dtype}** ({precision}): median latency in ms; ratios > 1 mean Nimble is faster. "
                "A model's label names its kernels when they are not TVM's defaults: `(vendor kernels)` = "
                "convolutions and GEMMs on cuDNN / cuBLASLt in every TVM and Nimble column; `(best kernels)` = each of "
                "them on cuDNN / cuBLASLt or TVM, whichever measured faster on that GPU (`kernels='best'`).", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (model, batch), by in latest[(device, dtype)].items():
            nimble = by.get("nimble-multi-stream-graph", by.get("nimble-auto"))
            cells = [model, batch] + [f"{by[k]:.3f}" if k in by else "-" for k, _ in systems]
            cells += [f"**{by['torch-cudagraph'] / nimble:.2f}x**" if "torch-cudagraph" in by else "-",
                      f"**{by['torch-compile'] / nimble:.2f}x**" if "torch-compile" in by else "-"]
            if has_ort:
                cells.append(f"**{by['ort-cuda-graph'] / nimble:.2f}x**" if "ort-cuda-graph" in by else "-")
            cells.append(f"{by[BASELINE_GPU] / nimble:.2f}x" if BASELINE_GPU in by else "-")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return out[:-1]


#: the systems of the build-time table, in its column order
BUILD_SYSTEMS = [("nimble-multi-stream-graph", "Nimble"), ("nimble-auto", "Nimble, auto streams"),
                 ("tvm-vm", "TVM VM"), (BASELINE_GPU, "TVM VM + CUDA graph"), ("torch-cudagraph", "PyTorch CUDA graph"),
                 ("torch-compile", "torch.compile"), ("tensorrt", "TensorRT"), ("ort-cuda-graph", "ONNX Runtime + graph")]


def build_time_table(rows: list[dict]) -> list[str]:
    """Seconds from the model to each system ready to run (``build_s``), the newest run per device, dtype,
    model and batch that recorded them; [] when no run did."""
    latest: dict[tuple, dict[tuple, dict[str, float]]] = {}
    for key, rs in _groups(rows).items():
        device, _, _, batch, dtype = key[:5]
        built = {r["system"]: float(r["build_s"]) for r in rs if r.get("build_s")}
        if built:
            latest.setdefault((device, dtype), {})[(run_label(key), batch)] = built
    out = []
    for (device, dtype), runs in sorted(latest.items(), key=lambda kv: (kv[0][0].startswith("CPU"), kv[0])):
        systems = [(k, label) for k, label in BUILD_SYSTEMS if any(k in by for by in runs.values())]
        systems += [(k, k) for k in dict.fromkeys(k for by in runs.values() for k in by) if k not in dict(BUILD_SYSTEMS)]
        head = ["model", "batch"] + [label for _, label in systems]
        out += [f"**{device}, {dtype}**: seconds from the ONNX model to a system ready to run: a TVM or Nimble "
                "build (import, kernel choice, compile, stream choice; the CUDA kernels a build compiled are reused by "
                "the next build of the same kernels), torch.compile's compile and first calls, a CUDA graph's capture, "
                "an ONNX Runtime session's creation.", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (model, batch), by in runs.items():
            out.append("| " + " | ".join([model, batch] + [f"{by[k]:.1f}" if k in by else "-" for k, _ in systems]) + " |")
        out.append("")
    return out[:-1]


def serving_table(rows: list[dict]) -> list[str]:
    """serving.csv's runs (one per date, device, model and precision), a line per engine and replica count: the
    capacity and the p50 / p99 at each Poisson load; [] without rows."""
    runs: dict[tuple, dict[tuple, list[dict]]] = {}
    for r in rows:
        run = (r["date"], r["device"], r["model"], r["precision"], r["kernels"], r["buckets"])
        runs.setdefault(run, {}).setdefault((r["engine"], int(r["replicas"])), []).append(r)
    out = []
    for (date, device, model, precision, kernels, buckets), lines in runs.items():
        first = next(iter(lines.values()))  # the loads, as every line has them
        out += [f"**{model}, {precision}, kernels {kernels}, buckets {buckets} — {device} ({date})**: Ray Serve "
                "replicas (a GPU each), one-row requests; p50 / p99 ms at each Poisson load (requests a second).", "",
                "| engine | replicas | capacity /s | " + " | ".join(
                    f"{float(r['rate_per_s']) / max(int(r['replicas']), 1):.0f}/s a replica" for r in first) + " |",
                "|" + "---|" * (3 + len(first))]
        for (engine, replicas), loads in sorted(lines.items(), key=lambda kv: (kv[0][1], kv[0][0] != "nimble")):
            out.append(f"| {engine} | {replicas} | {float(loads[0]['capacity_per_s']):.0f} | " + " | ".join(
                f"{float(r['p50_ms']):.1f} / {float(r['p99_ms']):.1f}" for r in loads) + " |")
        out.append("")
    return out[:-1]


def tuning_table(rows: list[dict]) -> list[str]:
    """Tuned runs next to their untuned companion runs (same device and day): what tuning gives stock TVM and
    Nimble, and Nimble's ratio once both use the tuned kernels. PyTorch's CUDA graph, timed in both runs and
    independent of tuning, shows whether the two runs measured alike."""
    pairs: dict[tuple, dict[bool, dict]] = {}
    for key, rs in _groups(rows).items():
        pair = tuning_pair(key)
        if pair:
            device, date, model, batch, dtype = key[:5]
            tuned, trials = pair
            pairs.setdefault((device, date, model, batch, dtype, trials), {})[tuned] = _medians(rs)
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


def _p90(row: dict) -> str:
    """The row's p90 ms, or '-' where the run recorded medians only (the side-by-side replay scripts)."""
    return f"{float(row['p90_ms']):.4f}" if row.get("p90_ms") else "-"


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
             "their outputs were checked: against PyTorch (`rel_err` in results.csv) where the model has a PyTorch "
             "definition, else against the ONNX reference evaluator or the stock TVM VM (rows without `rel_err`, "
             "from before that check existed, compared with stock TVM only; see Findings). Speedups are ratios "
             "of medians.", ""]
    if versions:
        lines += [versions, ""]
    headline = headline_table(rows)
    if headline:
        lines += ["## Headline (GPU)", ""] + headline + [""]
    built = build_time_table(rows)
    if built:
        lines += ["## Build time", ""] + built + [""]
    tuning = tuning_table(rows)
    if tuning:
        lines += ["## Tuned kernels", ""] + tuning + [""]
    beside = os.path.dirname(os.path.abspath(csv_path))
    serving = os.path.join(beside, "serving.csv")
    if os.path.exists(serving):
        with open(serving, newline="") as f:
            served = serving_table(list(csv.DictReader(f)))
        if served:
            lines += ["## Serving (`benchmarks/serving.csv`)", ""] + served + [""]
    findings = os.path.join(beside, "findings.md")
    if os.path.exists(findings):
        lines += [open(findings).read().strip(), ""]
    if notes:
        lines += ["## Notes on the latest run", ""] + [f"- {n}" for n in notes] + [""]
    lines += ["## All runs", ""]
    for key, rs in groups.items():
        device, date, _, batch, dtype = key[:5]
        by = _medians(rs)
        # a run without stock TVM (a side-by-side of Nimble variants) is compared with its slowest system
        base = next((b for b in (BASELINE_GPU, BASELINE_CPU) if b in by), max(by, key=by.get))
        timed_build = any(r.get("build_s") for r in rs)
        lines += [f"### {run_label(key)}, batch {batch}, {dtype} — {device} ({date})", "",
                  f"| system | median ms | p90 ms | speedup vs {base} |" + (" vs torch-eager |" if "torch-eager" in by else "")
                  + (" build s |" if timed_build else ""),
                  "|---|---|---|---|" + ("---|" if "torch-eager" in by else "") + ("---|" if timed_build else "")]
        for r in rs:
            m = float(r["median_ms"])
            line = f"| {r['system']} | {m:.4f} | {_p90(r)} | {by[base] / m:.2f}x |"
            if "torch-eager" in by:
                line += f" {by['torch-eager'] / m:.2f}x |"
            if timed_build:
                line += f" {float(r['build_s']):.2f} |" if r.get("build_s") else " - |"
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
    tuned = {(k[0], k[2], k[3], k[4]) for k in groups if (tuning_pair(k) or (False,))[0]}
    for key, rs in sorted(groups.items(), key=lambda kv: kv[0][1]):
        device, _, model, batch, dtype = key[:5]
        p = tuning_pair(key)
        if p:  # one bar group per tuning state: the newest tuned run, else the untuned companion run
            if not p[0] and (device, model, batch, dtype) in tuned:
                continue
            model = f"{model} {'tuned' if p[0] else 'untuned'}"
        elif key[5] != "tvm-default":
            model = f"{model} {key[5]}"
        label = textwrap.fill(model, 11, break_long_words=False) + f"\nb{batch}" + ("" if dtype == "float32" else f" {dtype}")
        latest.setdefault(device, {})[label] = _medians(rs)  # newest wins
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
