"""Record what scripts/gpu_validate.py brought back from the GPU machine.

Appends its rows to benchmarks/results.csv, regenerates benchmarks/RESULTS.md and the bar
chart, and draws each model's per-kernel timeline (one lane per stream) as a PNG.

    python scripts/record_gpu_results.py --from <files_at of the device run>
"""
from __future__ import annotations

import argparse
import csv
import json
import os


def plot_timeline(events, title, path):
    """events: [(launch idx, stream, kernel, start_ms, end_ms)] -> PNG, one lane per stream."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = sorted({e[1] for e in events})
    fig, ax = plt.subplots(figsize=(10, 1 + 0.5 * len(streams)))
    colors = plt.get_cmap("tab10")
    for idx, stream, kernel, start, end in events:
        ax.barh(stream, (end - start) * 1e3, left=start * 1e3, height=0.6, color=colors(stream % 10),
                edgecolor="black", linewidth=0.3)
    ax.set_yticks(streams, [f"stream {s}" for s in streams])
    ax.invert_yaxis()
    ax.set_xlabel("time since launch of the first kernel (us)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", required=True, help="folder with gpu_validate.json and results_rows.csv")
    ap.add_argument("--out", default="benchmarks")
    ap.add_argument("--timelines-only", action="store_true",
                    help="only draw the timelines (the run repeats timings already recorded)")
    args = ap.parse_args()
    from tvm_nimble.bench.report import append_rows, write_report

    with open(os.path.join(args.src, "results_rows.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    log = json.load(open(os.path.join(args.src, "gpu_validate.json")))
    notes = [f"GPU run {log['date']} on {log['device']}, TVM {log['tvm']}: Nimble systems replay the same kernels "
             "as the stock VM rows (untuned DLight schedules unless a tuning database is named)."]
    for name, e in log["models"].items():
        note = (f"{name}: {e['kernels']} kernels on {e['streams']} streams; outputs match stock VM: "
                f"{e['outputs_match']}; host cost per Nimble inference {e['host_us_nimble_graph_launch']:.1f} us "
                f"(stock VM call {e['host_us_tvm_vm_call']:.1f} us)")
        run = e.get("long_run")
        if run:
            note += f"; {run['runs']} runs bit-identical: {run['bit_identical']}"
            if run["mem_used_mib_before"] is not None:
                note += f", GPU memory {run['mem_used_mib_before']:.0f} -> {run['mem_used_mib_after']:.0f} MiB"
        notes.append(note)
        if e.get("timeline"):
            plot_timeline(e["timeline"], f"{name}: Nimble multi-stream CUDA graph, one replay, {log['device']}",
                          os.path.join(args.out, f"timeline_{name}.png"))
        if e.get("timeline_live"):
            plot_timeline(e["timeline_live"], f"{name}: Nimble multi-stream issued live from Python (host-paced), "
                          f"{log['device']}", os.path.join(args.out, f"timeline_{name}_live.png"))
    if args.timelines_only:
        return
    append_rows(os.path.join(args.out, "results.csv"), rows)
    write_report(os.path.join(args.out, "results.csv"), os.path.join(args.out, "RESULTS.md"),
                 os.path.join(args.out, "results.png"), notes)
    print("\n".join(notes))


if __name__ == "__main__":
    main()
