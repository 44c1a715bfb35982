"""The dynamic batcher (issue #35, CPU part): requests from many threads gathered into bucketed runs.

Under 8 threads x 200 requests of random sizes nothing is lost or duplicated and every request gets
exactly its own rows, in order: each row of the table below has its own output (checked distinct),
each request draws distinct rows, and its result must be those rows' outputs in its order.
"""
import os
import threading
import time

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tvm_nimble
from tvm_nimble import zoo
from tvm_nimble.errors import NimbleError, ShapeError
from tvm_nimble.runtime.batcher import Batcher

SIZES = [1, 2, 4, 8]
TABLE = 64


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A small zoo net built with buckets, a table of rows and each row's output by the ONNX reference."""
    model = zoo.resnet_chain(blocks=1, hw=8)
    path = str(tmp_path_factory.mktemp("batcher") / "m.nimble")
    # LLVM's optimizations on (the suite builds at level 0): the tests run it thousands of times
    tvm_nimble.build(model, "llvm -opt-level=3", batch_sizes=SIZES).export(path)
    x = np.random.default_rng(11).standard_normal((TABLE, 3, 8, 8)).astype("float32")
    ref = ReferenceEvaluator(model)
    y = np.concatenate([ref.run(None, {"input": x[i:i + 1]})[0] for i in range(TABLE)])
    gaps = np.linalg.norm(y[:, None, :] - y[None, :, :], axis=-1) + np.eye(TABLE) * 1e9
    assert gaps.min() > 1e-2  # every row's output is its own: a swapped or repeated row cannot pass
    return model, path, x, y


#: how long one request may take before it counts as lost, and all of a test's requests together: a batcher that
#: drops a request fails the test in seconds (every thread stops at the first failure), not a minute per request
REQUEST_TIMEOUT_S, REQUESTS_DEADLINE_S = 10.0, 180.0


def _run_clients(request, threads: int, per_thread: int) -> list:
    """``request(t, r, timeout)`` for each request r of each thread t, the threads at once; the failures as
    (thread, request, error). Each request gets :data:`REQUEST_TIMEOUT_S` (less where the deadline of all of
    them is nearer), and the first failure stops every thread."""
    deadline = time.monotonic() + REQUESTS_DEADLINE_S
    stop = threading.Event()
    failures = []

    def client(t):
        for r in range(per_thread):
            if stop.is_set():
                return
            try:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the requests' {REQUESTS_DEADLINE_S:.0f} s are over")
                request(t, r, min(REQUEST_TIMEOUT_S, left))
            except Exception as err:  # noqa: BLE001
                failures.append((t, r, repr(err)))
                stop.set()
                return

    workers = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return failures


def test_eight_threads_lose_duplicate_and_reorder_nothing(served):
    _, path, x, y = served
    threads, per_thread = 8, 200
    with tvm_nimble.NimblePool(path, replicas=2) as pool, Batcher(pool, max_delay_ms=2) as batcher:
        got: dict = {}
        rngs = [np.random.default_rng(100 + t) for t in range(threads)]

        def request(t, r, timeout):
            n = int(rngs[t].choice([1, 1, 2, 3, 5, 7, 8, 9, 12]))  # over 8: that request alone, split
            ids = rngs[t].permutation(TABLE)[:n]
            got[(t, r)] = (ids, batcher(x[ids], timeout=timeout)[0].numpy())

        failures = _run_clients(request, threads, per_thread)
        assert not failures, failures[:3]
        assert len(got) == threads * per_thread  # every request answered once
        for (t, r), (ids, out) in got.items():
            assert out.shape == (len(ids), 10), (t, r)
            np.testing.assert_allclose(out, y[ids], rtol=1e-4, atol=1e-4, err_msg=f"thread {t} request {r}")
        stats = batcher.stats
        rows = sum(len(ids) for ids, _ in got.values())
        assert stats["requests"] == threads * per_thread and stats["rows"] == rows
        assert sum(stats["batches"]) == rows  # each request's rows ran in exactly one batch
        assert stats["runs"] < stats["requests"]  # requests were gathered
        assert max(stats["batches"]) <= 12 and max(stats["batches"]) >= 8


def test_a_full_batch_does_not_wait_for_the_delay(served):
    _, path, x, y = served
    with Batcher(path, max_delay_ms=20_000) as batcher:  # 20 s: only a full batch runs before that
        start = time.perf_counter()
        out = batcher(x[:8], timeout=10)[0].numpy()
        assert time.perf_counter() - start < 10
        np.testing.assert_allclose(out, y[:8], rtol=1e-4, atol=1e-4)


def test_every_bucket_of_every_replica_runs_before_the_first_request(served):
    _, path, x, y = served
    with tvm_nimble.NimblePool(path, replicas=2) as pool, Batcher(pool, max_delay_ms=1) as batcher:
        with pool.executor() as a, pool.executor() as b:
            for ex in (a, b):
                assert ex.stats["warm_runs"] == len(SIZES)  # one run per bucket, at the batcher's start
                assert ex.stats["runs"] == ex.stats["calls"] == ex.stats["padded_rows"] == 0  # (not a request's)
        assert batcher.stats["runs"] == 0
        np.testing.assert_allclose(batcher(x[:3])[0].numpy(), y[:3], rtol=1e-4, atol=1e-4)
    with tvm_nimble.NimblePool(path, replicas=1) as pool, Batcher(pool, warm=False):
        with pool.executor() as ex:
            assert ex.stats["warm_runs"] == 0


def test_a_backlog_leaves_in_runs_of_the_largest_bucket(served):
    """Requests queued while the only replica is busy leave as soon as it is free, each run as full as the
    largest bucket allows (none waits for the delay again), in arrival order."""
    _, path, x, y = served
    with tvm_nimble.NimblePool(path, replicas=1) as pool, Batcher(pool, max_delay_ms=300) as batcher:
        with pool.executor():  # the replica busy: the first full batch waits for it, the rest queue
            futures = [batcher.submit(x[i:i + 1]) for i in range(20)]
            time.sleep(0.4)  # (every queued request's delay is over before the replica is free)
        outs = [f.result(10)[0].numpy() for f in futures]
        assert batcher.stats["batches"] == [8, 8, 4]
    np.testing.assert_allclose(np.concatenate(outs), y[:20], rtol=1e-4, atol=1e-4)


def test_a_lone_request_runs_once_its_delay_is_over(served):
    _, path, x, y = served
    with Batcher(path, max_delay_ms=150) as batcher:
        batcher(x[:1])  # warm
        start = time.perf_counter()
        out = batcher(x[3:5], timeout=10)[0].numpy()
        waited = time.perf_counter() - start
        assert 0.14 <= waited < 5, waited
        np.testing.assert_allclose(out, y[3:5], rtol=1e-4, atol=1e-4)


def test_requests_gathered_within_the_delay_share_a_run(served):
    _, path, x, y = served
    with Batcher(path, max_delay_ms=300) as batcher:
        futures = [batcher.submit(x[i:i + 1]) for i in range(5)]  # 5 rows: one run of bucket 8
        outs = [f.result(10)[0].numpy() for f in futures]
        assert batcher.stats["batches"] == [5]
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out, y[i:i + 1], rtol=1e-4, atol=1e-4)


def test_a_fixed_batch_artifact_serves_through_the_batcher(served, tmp_path):
    model, _, x, y = served
    path = str(tmp_path / "fixed.nimble")
    tvm_nimble.build(zoo.resnet_chain(blocks=1, hw=8, batch=8), "llvm").export(path)
    with Batcher(path, max_delay_ms=1) as batcher:  # the fixed-batch baseline: every run padded to 8
        assert batcher.batch_sizes == [8]
        for n in (1, 5, 8, 11):
            np.testing.assert_allclose(batcher(x[:n])[0].numpy(), y[:n], rtol=1e-4, atol=1e-4)


def test_bad_requests_fail_in_the_callers_thread(served):
    _, path, x, _ = served
    batcher = Batcher(path, max_delay_ms=1)
    with pytest.raises(ShapeError, match="rows shaped"):
        batcher.submit(x[:2, :2])
    with pytest.raises(NimbleError, match="same number of rows"):
        batcher.submit(x[:0])
    batcher.close()
    with pytest.raises(NimbleError, match="closed"):
        batcher.submit(x[:1])


def test_a_function_behind_the_same_batcher_gets_whole_requests_in_order():
    """Any engine can sit behind the batcher (the GPU comparison puts PyTorch's CUDA graphs there): each row
    carries (thread, request, position), so a lost, repeated or reordered row is seen."""
    seen = []

    def double(x):
        seen.append(len(x))
        return [x * 2.0, x[:, :1] + 0.5]

    threads, per_thread = 8, 200
    with Batcher(double, max_delay_ms=1, max_batch=16) as batcher:
        rngs = [np.random.default_rng(t) for t in range(threads)]

        def request(t, r, timeout):
            x = np.array([[t, r, k] for k in range(int(rngs[t].integers(1, 7)))], dtype="float64")
            a, b = batcher(x, timeout=timeout)
            assert np.array_equal(a, x * 2.0) and np.array_equal(b, x[:, :1] + 0.5), "another request's rows"

        failures = _run_clients(request, threads, per_thread)
        assert not failures, failures[:3]
        assert batcher.stats["requests"] == threads * per_thread
        assert sum(seen) == batcher.stats["rows"] and max(seen) <= 16 and len(seen) < threads * per_thread
    with pytest.raises(ValueError, match="needs max_batch"):
        Batcher(double)


def test_outputs_as_numpy(served):
    _, path, x, y = served
    with Batcher(path, max_delay_ms=50, to_numpy=True) as batcher:
        futures = [batcher.submit(x[i:i + 3]) for i in (0, 10, 20)]  # runs of 6 rows (bucket 8) and 3 (bucket 4)
        outs = [f.result(10)[0] for f in futures]
    for i, out in zip((0, 10, 20), outs):
        assert isinstance(out, np.ndarray)
        np.testing.assert_allclose(out, y[i:i + 3], rtol=1e-4, atol=1e-4)


def test_the_gpu_load_experiment_dry_runs_on_cpu(tmp_path):
    """scripts/experiments/batcher_load.py (the GPU table of #35: Poisson loads, bucketed vs fixed-batch vs
    PyTorch behind the same batcher) runs end to end on llvm, its rows checked before anything is timed."""
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "experiments", "batcher_load.py"),
                        "--models", "zoo:inception", "--target", "llvm", "--buckets", "1,2", "--rates", "40",
                        "--seconds", "0.25", "--capacity-requests", "20", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=root), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "batcher_load_inception.json").read_text())
    assert [row["engine"] for row in res["rows"]] == ["nimble-buckets", "nimble-fixed", "torch-cudagraph"]
    assert all(v < 1e-3 for v in res["max_rel_error_vs_alone"].values())
    assert all(row["requests"] == 10 and row["p99_ms"] >= row["p50_ms"] > 0 for row in res["rows"])
    for row in res["rows"]:  # what shows a stall: the tail, requests over 50 ms, the longest wait with none done
        assert row["max_ms"] >= row["p999_ms"] >= row["p99_ms"]
        assert row["max_stall_ms"] > 0 and row["over_50ms"] >= 0 and row["max_submit_lag_ms"] >= 0
        assert row["gc_collections"] == 0  # --gc off (default): none during a measured window
    assert res["gc"] == "off"
