"""Experiment (plot, no GPU): the README's tuning-throughput figure from an `rpc_tune.py` record: trials
per minute measured on the machine itself and through 1 and 2 RPC servers.

Findings: benchmarks/findings.md, 'Tuning throughput through the tracker'. Raw input:
benchmarks/raw/2026-11-24-h100-s8/rpc_tune.json; output: benchmarks/rpc_tune_h100.png.

    python3 scripts/experiments/plot_rpc_tune.py benchmarks/raw/2026-11-24-h100-s8/rpc_tune.json benchmarks/rpc_tune_h100.png
"""
from __future__ import annotations

import json
import sys


def main(argv=None):
    src, png = (argv or sys.argv[1:])[:2]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = json.load(open(src))
    rows = record["rows"]
    labels = ["this process" if r["servers"] == 0 else f"{r['servers']} RPC server{'s' if r['servers'] > 1 else ''}"
              for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3))
    bars = ax.bar(labels, [r["trials_per_min"] for r in rows], color=["#888888", "#1f77b4", "#1f77b4"][:len(rows)])
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['trials_per_min']:.1f}\n({r['trials']} trials, {r['seconds']:.0f} s)",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("trials per minute")
    ax.set_ylim(0, max(r["trials_per_min"] for r in rows) * 1.35)
    ax.set_title(f"tuning {record['model']} ({record['target']}): measured where", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
