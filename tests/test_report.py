"""The GPU report's tables, from synthetic rows: one headline table per dtype, ratios from the medians."""
import random

from tvm_nimble.bench.report import (BASELINE_GPU, CSV_COLUMNS, SERVING_COLUMNS, append_rows, build_time_table,
                                     headline_table, read_rows, tuning_table, write_report)

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


def test_rows_from_before_build_s_stay_readable_when_new_rows_are_appended(tmp_path):
    """results.csv written before the build_s column: appending rewrites its header, old rows keep their values
    with an empty build_s, and only the new rows are in the build-time table."""
    rng = random.Random(4)
    old, new = rows_for("old", "float32", rng, date="2026-11-20"), rows_for("new", "float32", rng)
    for i, r in enumerate(new):
        r["build_s"] = f"{10 + i}.000"
    path = str(tmp_path / "results.csv")
    append_rows(path, old, columns=[c for c in CSV_COLUMNS if c != "build_s"])
    append_rows(path, new)
    assert open(path).readline().strip() == ",".join(CSV_COLUMNS)
    back = read_rows(path)
    assert [(r["model"], r["system"], r["median_ms"], r["build_s"]) for r in back] == \
        [(r["model"], r["system"], r["median_ms"], r.get("build_s", "")) for r in old + new]
    table = build_time_table(back)
    assert not any(l.startswith("| old") for l in table)
    head, line = (cells_of(next(l for l in table if l.startswith(p))) for p in ("| model", "| new"))
    assert line[head.index("Nimble")] == f"{float(new[SYSTEMS.index('nimble-multi-stream-graph')]['build_s']):.1f}"


def test_headline_shows_tensorrt_only_when_a_run_has_it():
    rng = random.Random(3)
    rows = rows_for("net", "float32", rng)
    assert not any("TensorRT" in l for l in headline_table(rows))
    rows.append(dict(rows[0], system="tensorrt", median_ms="0.4321"))
    lines = headline_table(rows)
    head = next(l for l in lines if l.startswith("| model"))
    line = next(l for l in lines if l.startswith("| net"))
    assert cells_of(line)[cells_of(head).index("TensorRT")] == "0.432"


def test_a_run_that_skipped_stock_tvm_and_the_multi_stream_graph_keeps_its_headline_line():
    rng = random.Random(5)
    kept = {"nimble-auto", "torch-cudagraph"}  # bench --skip tvm-vm,tvm-vm-cudagraph,nimble-multi-stream-graph,...
    rows = [dict(r, system="nimble-auto") if r["system"] == "nimble-multi-stream-graph" else r
            for r in rows_for("net", "float16", rng)]
    rows = [r for r in rows if r["system"] in kept]
    runtime_only = [r for r in rows_for("other", "float16", rng)
                    if r["system"].startswith("nimble")]  # no peer beside it: not a headline line
    lines = headline_table(rows + runtime_only)
    head = cells_of(next(l for l in lines if l.startswith("| model")))
    table = [cells_of(l) for l in lines if l.startswith("| net") or l.startswith("| other")]
    assert [c[0] for c in table] == ["net"]
    by = {r["system"]: float(r["median_ms"]) for r in rows}
    c = table[0]
    assert c[head.index("Nimble vs PyTorch CUDA graph")] == f"{by['torch-cudagraph'] / by['nimble-auto']:.2f}x"
    assert c[head.index("Nimble vs TVM VM+graph (same kernels)")] == "-"


def test_serving_csv_beside_the_results_is_a_table_in_the_report(tmp_path):
    """write_report puts serving.csv's runs (serve_load's rows) in RESULTS.md: a line per engine and replica count,
    its capacity and the p50 / p99 of each load as the rows hold them."""
    rng = random.Random(7)
    results = str(tmp_path / "results.csv")
    append_rows(results, rows_for("m", "float16", rng))
    run = {"date": "2026-11-30", "device": "GPU X", "model": "net", "precision": "fp16", "kernels": "best",
           "buckets": "1 8 32", "check_rel": "0.00e+00", "build_s": ""}
    rows = []
    for engine, replicas, capacity in [("torch-cudagraph", 1, 300.0), ("nimble", 1, 400.0), ("nimble", 2, 700.0)]:
        for load in (0.25, 0.5):
            rows.append({**run, "engine": engine, "replicas": replicas, "capacity_per_s": f"{capacity:.1f}",
                         "rate_per_s": f"{400 * load * replicas:.1f}", "requests": 10,
                         "p50_ms": f"{rng.uniform(5, 10):.3f}", "p99_ms": f"{rng.uniform(10, 60):.3f}",
                         "throughput_per_s": "1.0"})
    append_rows(str(tmp_path / "serving.csv"), rows, SERVING_COLUMNS, {})
    write_report(results, str(tmp_path / "RESULTS.md"), None)
    text = open(tmp_path / "RESULTS.md").read()
    section = text[text.index("## Serving"):text.index("## All runs")]
    head = cells_of(next(l for l in section.splitlines() if l.startswith("| engine")))
    assert head[3:] == ["100/s a replica", "200/s a replica"]
    got = [cells_of(l) for l in section.splitlines() if l.startswith(("| nimble", "| torch"))]
    want = [(e, r, c, [f"{float(x['p50_ms']):.1f} / {float(x['p99_ms']):.1f}" for x in rows
                       if (x["engine"], x["replicas"]) == (e, r)]) for e, r, c in
            [("nimble", 1, "400"), ("torch-cudagraph", 1, "300"), ("nimble", 2, "700")]]
    assert [(g[0], int(g[1]), g[2], g[3:]) for g in got] == want
