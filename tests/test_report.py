"""The GPU report's tables, from synthetic rows: one headline table per dtype, ratios from the medians."""
import random

from tvm_nimble.bench.report import BASELINE_GPU, headline_table, tuning_table

SYSTEMS = ["tvm-vm", BASELINE_GPU, "nimble-single-stream-graph", "nimble-multi-stream-graph", "torch-cudagraph"]


def rows_for(model, dtype, rng, batch=1, date="2026-11-23", kernels="tvm-default", db_trials=""):
    return [{"date": date, "device": "GPU X", "model": model, "batch": str(batch), "dtype": dtype, "system": s,
             "kernels": kernels, "db_trials": db_trials, "median_ms": f"{rng.uniform(0.5, 5):.4f}", "p90_ms": "9.0"}
            for s in SYSTEMS]


def cells_of(line):
    return [c.strip().strip("*") for c in line.strip().strip("|").split("|")]


def test_headline_has_one_table_per_dtype_with_ratios_from_the_medians():
    rng = random.Random(1)
    rows = rows_for("net", "float16", rng) + rows_for("net", "float32", rng) + rows_for("other", "float32", rng)
    lines = headline_table(rows)
    captions = [i for i, l in enumerate(lines) if l.startswith("**GPU X, ")]
    assert [lines[i].split(",")[1].split("*")[0].strip() for i in captions] == ["float32", "float16"]
    tables = [lines[i + 4:j - 1 if j else None] for i, j in zip(captions, captions[1:] + [None])]
    for dtype, table in zip(["float32", "float16"], tables):
        by = {(r["model"], r["system"]): float(r["median_ms"]) for r in rows if r["dtype"] == dtype}
        assert sorted(cells_of(l)[0] for l in table) == sorted({m for m, _ in by})
        head = cells_of(next(l for l in lines if l.startswith("| model")))
        for line in table:
            c = cells_of(line)
            nimble = by[(c[0], "nimble-multi-stream-graph")]
            assert c[head.index("Nimble vs TVM VM+graph (same kernels)")] == f"{by[(c[0], BASELINE_GPU)] / nimble:.2f}x"
            assert c[head.index("Nimble vs PyTorch CUDA graph")] == f"{by[(c[0], 'torch-cudagraph')] / nimble:.2f}x"


def test_tuning_table_pairs_runs_and_shows_the_torch_drift_check():
    rng = random.Random(2)
    u = rows_for("net", "float32", rng, kernels="tvm-default", db_trials="100")
    t = rows_for("net", "float32", rng, kernels="tvm-tuned", db_trials="100")
    line = next(l for l in tuning_table(u + t) if l.startswith("| GPU X"))
    med = lambda rs, s: next(float(r["median_ms"]) for r in rs if r["system"] == s)  # noqa: E731
    c = cells_of(line)
    assert c[10] == f"{med(t, BASELINE_GPU) / med(t, 'nimble-multi-stream-graph'):.2f}x"
    assert c[12] == f"{med(u, 'torch-cudagraph'):.3f} / {med(t, 'torch-cudagraph'):.3f}"


def test_headline_shows_tensorrt_only_when_a_run_has_it():
    rng = random.Random(3)
    rows = rows_for("net", "float32", rng)
    assert not any("TensorRT" in l for l in headline_table(rows))
    rows.append(dict(rows[0], system="tensorrt", median_ms="0.4321"))
    lines = headline_table(rows)
    head = next(l for l in lines if l.startswith("| model"))
    line = next(l for l in lines if l.startswith("| net"))
    assert cells_of(line)[cells_of(head).index("TensorRT")] == "0.432"
