"""The GPU validation path (prepare -> validate -> record), dry-run end to end on llvm artifacts, and
the experiments under scripts/experiments/ (one through the session runner's ``experiment`` step).

The GPU machine is expensive to reach; this keeps its scripts from rotting between GPU runs.
"""
import csv
import json
import os
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script(name, *args, cwd, **environ):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args], capture_output=True,
                       text=True, cwd=cwd, env=dict(os.environ, PYTHONPATH=ROOT, **environ), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def session(*steps, tmp_path):
    """scripts/gpu_session.sh STEPS... on llvm, its state in tmp_path/work: (the session log, the work dir)."""
    work, out = tmp_path / "work", tmp_path / "out"
    # this interpreter's folder first on PATH: the runner's `python3 -m pip install` (of .device-extra's wheels, where
    # the checkout has them) is then this environment's, not pyenv's shim, whose pip hook rehashes ~/.pyenv/shims
    # (a write under $HOME, which fails the run)
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHON=sys.executable, TARGET="llvm", WORK=str(work), OUT=str(out),
               DEADLINE="900", PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_session.sh"), *steps], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=960)
    log = (out / "session.log").read_text()
    assert r.returncode == 0 and (out / "session.tgz").is_file(), r.stderr[-3000:] + log[-3000:]
    return log, work


def test_session_runner_lists_its_steps(tmp_path):
    """No steps: the step list, nothing run; an unknown experiment is named in the log, the call goes on."""
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_session.sh")], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "experiment NAME SECONDS ARGS..." in r.stdout and "tune MODEL SECONDS" in r.stdout
    log, _ = session("experiment no_such_experiment 30", "concat 30", tmp_path=tmp_path)
    assert "unknown experiment: 'no_such_experiment'" in log and "unknown step: concat 30" in log


def test_prepare_validate_record_on_cpu(tmp_path):
    art, res, bench = tmp_path / "art", tmp_path / "res", tmp_path / "bench"
    # LLVM's optimizations on (the suite builds at level 0): validation runs each model thousands of times.
    # Two models: a multi-stream one (incept6, the first: its long run) and a one-stream chain. mobilenet is that
    # chain, as resnet was (same code paths through prepare, validate and record), at a seventh of resnet's time a
    # run on the CPU (about 1 ms, resnet's small size 7 ms): validation's 2,500 host-cost runs took 16 s of resnet.
    script("gpu_prepare.py", "--out", str(art), "--arch", "cpu", "--small", "--models", "incept6,mobilenet",
           cwd=tmp_path, TVM_NIMBLE_LLVM_OPT_LEVEL="3")
    out = script("gpu_validate.py", "--art", str(art), "--out", str(res), "--rounds", "1", "--iters", "5",
                 "--long-runs", "50", cwd=tmp_path)
    log = json.load(open(res / "gpu_validate.json"))
    assert set(log["models"]) == {"incept6", "mobilenet"}
    assert log["models"]["incept6"]["streams"] > 1 and log["models"]["mobilenet"]["streams"] == 1
    assert all(m["outputs_match"] for m in log["models"].values())
    assert log["models"]["incept6"]["long_run"]["bit_identical"] is True
    assert "outputs match: True" in out
    bench.mkdir()
    script("record_gpu_results.py", "--from", str(res), "--out", str(bench), cwd=tmp_path)
    rows = list(csv.DictReader(open(bench / "results.csv")))
    assert {r["model"] for r in rows} == {"incept6", "mobilenet"}
    assert {"tvm-vm", "nimble-aot-cpu"} <= {r["system"] for r in rows}
    md = open(bench / "RESULTS.md").read()
    assert "incept6" in md and "kernels on" in md  # the notes name kernels and streams per model


def test_pool_bench_on_cpu(tmp_path):
    out = script("experiments/pool_bench.py", "--models", "zoo:inception", "--target", "llvm", "--seconds", "0.2",
                 "--runs", "80", "--out", str(tmp_path / "pool"), cwd=tmp_path)
    res = json.load(open(tmp_path / "pool" / "pool_inception.json"))
    assert [r["replicas"] for r in res["rows"]] == ["executor", 1, 2, 4]
    assert all(r["calls_per_s"] > 0 for r in res["rows"])
    assert res["bit_identical_runs"] == 80 and res["mismatches"] == 0
    assert "80 pooled runs, 0 not bit-identical" in out


def test_rpc_tune_script_on_cpu(tmp_path):
    """The rpc_tune experiment, dry-run on llvm: local and one loopback server, trials counted (two servers measuring
    side by side: test_rpc_tuning)."""
    import pytest

    pytest.importorskip("tornado")
    out = script("experiments/rpc_tune.py", "--model", "zoo:incept6", "--small", "--cheap-search", "--servers", "0,1",
                 "--target", "llvm", "--trials", "4",
                 "--out", str(tmp_path / "rpc"), cwd=tmp_path)
    rows = json.load(open(tmp_path / "rpc" / "rpc_tune.json"))["rows"]
    assert [r["servers"] for r in rows] == [0, 1]
    assert all(r["trials"] == 4 and r["failed"] == 0 and r["trials_per_min"] > 0 for r in rows)
    assert "1 RPC server(s)" in out


def test_stream_choice_script_on_cpu(tmp_path):
    """The stream_choice experiment through the session runner's experiment step, dry-run on llvm: builds,
    chooses (nothing measured without a GPU: the widest schedule, said so), writes its JSON."""
    out, work = session("experiment stream_choice 600 --models zoo:inception --small --target llvm --kernels tvm",
                        tmp_path=tmp_path)
    assert "scripts/experiments/stream_choice.py" in out and "== rc=0 " in out, out[-3000:]
    row, = json.load(open(work / "stream_choice" / "stream_choice.json"))
    assert row["model"] == "incept6" and row["batch"] == 1 and row["auto_ms"] is None
    assert row["record"]["how"].startswith("widest") and row["auto_streams"] > 1
    assert "nothing measured" in out


def test_max_connections_script_on_cpu(tmp_path):
    """The max_connections experiment, dry-run on llvm: one build, both artifacts exported and timed in a
    fresh process per setting (the setting means nothing on a CPU; the plumbing is what is checked)."""
    out = script("experiments/max_connections.py", "--models", "zoo:inception", "--small", "--target", "llvm", "--kernels", "tvm",
                 "--connections", "8,32", "--out", str(tmp_path / "maxconn"), cwd=tmp_path)
    row, = json.load(open(tmp_path / "maxconn" / "max_connections.json"))
    assert row["model"] == "incept6" and row["streams"] > 1 and set(row["by_connections"]) == {"8", "32"}
    for v in row["by_connections"].values():
        assert len(v["rounds"]) == 3 and v["multi_ms"] > 0 and v["single_ms"] > 0
    assert "multi@32" in out


def test_concat_in_place_script_on_cpu(tmp_path):
    """The concat_in_place experiment, dry-run on llvm: both builds, outputs checked against each other."""
    out = script("experiments/concat_in_place.py", "--models", "zoo:inception", "--small", "--target", "llvm",
                 "--out", str(tmp_path / "concat"), cwd=tmp_path)
    from tvm_nimble import zoo

    row, = json.load(open(tmp_path / "concat" / "concat_in_place.json"))
    concats = sum(n.op_type == "Concat" for n in zoo.get_bench_model("inception", small=True)[1].graph.node)
    assert row["model"] == "incept6" and row["concats_in_place"] == concats > 1  # every Concat of the blocks
    assert row["launches"]["in-place"] == row["launches"]["concat-kernels"] - concats
    assert max(row["rel_err"].values()) < 1e-5 and row["ms"] == {}
    assert "no GPU to time on" in out


def test_remote_best_script_on_cpu(tmp_path):
    """The remote_best experiment, dry-run on llvm: a loopback tracker, the model built here and
    through it, the two outputs compared, both replayed (no kernel choice without a GPU)."""
    pytest.importorskip("tornado")
    out = script("experiments/remote_best.py", "--models", "zoo:inception", "--small", "--target", "llvm",
                 "--out", str(tmp_path / "rb"), cwd=tmp_path)
    row, = json.load(open(tmp_path / "rb" / "remote_best.json"))
    assert row["model"] == "incept6" and row["chains"] == 0 and row["rel_err"] < 1e-6
    assert all(v > 0 for v in row["ms"].values()) and "remote-best incept6" in out


def test_merge_choice_script_on_cpu(tmp_path):
    """The merge_choice experiment (#32), dry-run on llvm: auto (nothing to measure on: kept separate),
    then merge off and on built to the end; the merged build has fewer launches."""
    out = script("experiments/merge_choice.py", "--models", "zoo:inception", "--small", "--target", "llvm", "--kernels", "tvm",
                 "--out", str(tmp_path / "merge"), cwd=tmp_path)
    row, = json.load(open(tmp_path / "merge" / "merge_choice.json"))
    assert row["model"] == "incept6" and row["on_launches"] < row["off_launches"]
    assert "nothing measured" in out


def test_build_times_script_on_cpu(tmp_path):
    """The build_times experiment (#36), dry-run on llvm: a cold and a warm build, each in a fresh process with
    its own cache directory, in the precision asked for, the same plan both times, the phases recorded; nothing
    left behind. With --gpus 2 the two models build at once, each in a lane of its own (a GPU, half the cores),
    the rows in the order asked."""
    script("experiments/build_times.py", "--models", "zoo:inception", "--small", "--target", "llvm", "--kernels", "tvm",
           "--precision", "fp16", "--batch", "1,2", "--gpus", "2", "--out", str(tmp_path / "bt"), cwd=tmp_path)
    rows = json.load(open(tmp_path / "bt" / "build_times.json"))
    assert [(r["model"], r["batch"]) for r in rows] == [("incept6", 1), ("incept6@2", 2)]  # every --batch
    share = str(max(1, (os.cpu_count() or 1) // 2))
    assert sorted(r["lane"]["CUDA_VISIBLE_DEVICES"] for r in rows) == ["0", "1"]  # one lane each, at once
    assert all(r["lane"]["TVM_NIMBLE_JOBS"] == share for r in rows)
    for row in rows:
        assert row["precision"] == "fp16" and row["same_plan"] is True
        assert all(row[run]["seconds"] > 0 and "lower" in row[run]["phases"] for run in ("cold", "warm"))
        # the builds were fp16 ones: each measured its error against the fp32 build
        assert all(0 < row[run]["accuracy"]["rel_l2"] < 5e-2 for run in ("cold", "warm"))
    assert rows[0]["cold"]["plan"] != rows[1]["cold"]["plan"]  # the batch-2 model was built, not batch 1's again
    assert sorted(os.listdir(tmp_path / "bt")) == ["build_times.json"]


def test_schedule_pool_script_on_cpu(tmp_path):
    """The schedule_pool experiment (#55) on the CPU (its kernels are lowered for sm_90 without a GPU): a model's
    kernels scheduled here and by two workers, cold and warm, every schedule the same."""
    out = script("experiments/schedule_pool.py", "--models", "zoo:inception", "--small", "--workers", "2",
                 "--out", str(tmp_path / "sp"), cwd=tmp_path)
    (row,) = json.load(open(tmp_path / "sp" / "schedule_pool.json"))
    assert row["identical"] is True and row["pool_failed"] is False and row["workers"] == 2
    assert row["kernels"] >= 8 and row["serial_s"] > 0 and row["pool_warm_s"] > 0
    assert "identical" in out.splitlines()[0]


def test_row_norm_schedules_script_on_cpu(tmp_path):
    """The row_norm_schedules experiment (#52) on the CPU: each schedule of a 0.5B decoder's RMSNorm (the build's,
    a block of threads a row, a warp a row) built and compiled for sm_90 with nvcc; nothing run."""
    out = script("experiments/row_norm_schedules.py", "--target", "llvm", "--cases", "llama_rms_512", "--threads",
                 "256", "--rows-per-block", "2", "--out", str(tmp_path / "rn"), cwd=tmp_path)
    rows = json.load(open(tmp_path / "rn" / "row_norm_schedules.json"))
    assert [r["schedule"] for r in rows] == ["build (DLight)", "block of 256 a row", "warp a row, 2 a block"]
    assert not any("error" in r for r in rows) and out.count("compiled for sm_90") == 3


def test_cublaslt_search_program_compiles(tmp_path):
    """The cublaslt_search experiment's program (#52) compiles against the cuBLAS wheel for sm_90; nothing run."""
    out = script("experiments/cublaslt_search.py", "--compile-only", "--out", str(tmp_path / "cs"), cwd=tmp_path)
    assert "compiled" in out and os.access(tmp_path / "cs" / "cublaslt_search", os.X_OK)


def test_training_profile_script_on_cpu(tmp_path):
    """The training_profile experiment (#34), dry-run on llvm: the bench's step built one-stream and widest,
    one step each, the same first loss from both schedules."""
    out = script("experiments/training_profile.py", "--models", "cifar_inception", "--batch", "2", "--target", "llvm",
                 "--kernels", "tvm", "--out", str(tmp_path / "tp"), cwd=tmp_path)
    r = json.load(open(tmp_path / "tp" / "training_profile_cifar_inception_b2.json"))
    assert r["single"]["streams"] == 1 < r["multi"]["streams"]
    assert abs(r["single"]["first_loss"] - r["multi"]["first_loss"]) <= 1e-5 * abs(r["multi"]["first_loss"])
    assert "built and ran one step" in out


def test_artifact_reload_script_on_cpu(tmp_path):
    """The artifact_reload experiment (#54), dry-run on llvm: bf16 and fp16 artifacts exported, loaded in a fresh
    process and run give exactly the building process's output."""
    script("experiments/artifact_reload.py", "--models", "zoo:inception", "--small", "--target", "llvm", "--precisions",
           "bf16,fp16", "--out", str(tmp_path / "ar"), cwd=tmp_path)
    rows = json.load(open(tmp_path / "ar" / "artifact_reload.json"))
    assert [r["precision"] for r in rows] == ["bf16", "fp16"]
    assert all(r["reloaded"] and r["finite"] and r["vs_build"] == 0.0 for r in rows), rows


def test_length_distribution_script_on_cpu(tmp_path):
    """The length_distribution experiment (#52), dry-run on llvm with the tiny GPT-2: the bucketed artifact's logits
    checked against PyTorch's at three lengths, every request timed, each bucket's share and percentiles recorded."""
    out = script("experiments/length_distribution.py", "--models", "hf:gpt2-tiny", "--target", "llvm", "--requests",
                 "30", "--buckets", "8,16", "--max-length", "16", "--out", str(tmp_path / "ld"), cwd=tmp_path)
    report = json.load(open(tmp_path / "ld" / "length_distribution.json"))
    (row,) = report["models"]["hf:gpt2-tiny"]["systems"].values()
    assert row["max_rel_err"] <= 1e-3 and row["p50_ms"] <= row["p99_ms"]
    assert sum(b["requests"] for b in row["by_bucket"].values()) == 30 and set(row["by_bucket"]) <= {"8", "16"}
    model = report["models"]["hf:gpt2-tiny"]
    assert len(model["lengths"]) == 30 and all(8 <= n <= 16 for n in model["lengths"])
    (times,) = model["times_ms"].values()
    assert len(times) == 30 and abs(statistics.median(times) - row["p50_ms"]) < 1e-3
    assert "prompts of bucket 16: nimble-buckets p50" in out
    assert 0 <= row["gc"]["requests"] <= 30 and row["gc"]["ms"] >= 0 and "garbage collections within requests" in out
    assert set(row["replay_p50_ms"]) == {"8", "16"} and all(ms > 0 for ms in row["replay_p50_ms"].values())
    assert "nimble-buckets replay alone p50 per bucket: 8 " in out and "a request's p50 over it: " in out
    over = row["request_over_replay_ms"]  # a request's p50 in its bucket less the bucket's replay alone
    assert over.keys() <= row["replay_p50_ms"].keys() and over
    assert all(abs(over[b] - (row["by_bucket"][b]["p50_ms"] - row["replay_p50_ms"][b])) < 1e-12 for b in over)
    assert set(row["build_phases_s"]) == {"1x8", "1x16"} and "nimble-buckets build of bucket 1x16: import" in out
