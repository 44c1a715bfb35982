"""Serving on Ray Serve (tvm_nimble.serve, issue #56), on the CPU.

Without Ray (CI): the replica's batching rule (a bucketed artifact's batch as one call, a plain one's a
call per request, a bad request spoiling no other), the HTTP body format, the layering, and the one-line
errors of ``tvm-nimble serve``. With Ray (``pip install 'tvm-nimble[serve]'``): one local cluster
(``ray.init(num_cpus=2)``) serving a bucketed inception on two replicas, checked against the ONNX
reference evaluator over HTTP and the deployment handle from many threads, a bad request, and a replica
killed mid-load.
"""
import concurrent.futures
import csv
import json
import os
import random
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import networkx as nx
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tvm_nimble
from tvm_nimble import zoo
from tvm_nimble.runtime.executor import InputError
from tvm_nimble.serve.options import NEEDS_RAY, ArtifactFacts, ServeOptions
from tvm_nimble.serve.replica import ReplicaModel, decode_json

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's own, on pydantic 2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = dict(rtol=1e-4, atol=1e-4)
BUCKETS = [1, 4]


class Models:
    """The inception zoo net built plain (batch 1) and bucketed, exported, with a pool of input rows and
    the ONNX reference evaluator's outputs for them (a few: it takes 0.4 s a row on the CPU)."""

    def __init__(self, root):
        self.model = zoo.get_model("inception")
        self.plain = str(root / "plain.nimble")
        self.bucketed = str(root / "buckets.nimble")
        tvm_nimble.build(self.model, "llvm").export(self.plain)
        tvm_nimble.build(self.model, "llvm", batch_sizes=BUCKETS).export(self.bucketed)
        self.rows = np.random.default_rng(0).standard_normal((12, 3, 16, 16)).astype("float32")
        self.ref = ReferenceEvaluator(self.model).run(None, {"input": self.rows})[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return Models(tmp_path_factory.mktemp("serve"))


# ---- the replica's batching rule, no Ray --------------------------------------------------------------
class CountingExecutor:
    """An executor that counts its calls (the real one runs them)."""

    def __init__(self, executor):
        self.executor, self.calls = executor, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.executor(*args, **kwargs)


def test_a_bucketed_batch_runs_as_one_call_each_request_gets_its_rows(models):
    replica = ReplicaModel(models.bucketed)
    replica.executor = counting = CountingExecutor(replica.executor)
    spans = [(0, 1), (2, 3), (5, 2), (11, 1)]  # 7 rows: bucket 4 twice (split by the executor)
    results = replica.run_batch([{"input": models.rows[a:a + n]} for a, n in spans])
    assert counting.calls == 1
    for (a, n), outs in zip(spans, results):
        assert len(outs) == 1 and outs[0].shape == (n, 10)
        np.testing.assert_allclose(outs[0], models.ref[a:a + n], **TOL)


def test_a_plain_batch_runs_one_call_per_request(models):
    replica = ReplicaModel(models.plain)
    replica.executor = counting = CountingExecutor(replica.executor)
    results = replica.run_batch([{"input": models.rows[i:i + 1]} for i in (3, 4, 5)])
    assert counting.calls == 3
    for i, outs in zip((3, 4, 5), results):
        np.testing.assert_allclose(outs[0], models.ref[i:i + 1], **TOL)


def test_a_bad_request_spoils_no_other_in_its_batch(models):
    replica = ReplicaModel(models.bucketed)
    good = {"input": models.rows[2:4]}
    bad = [{"input": models.rows[:1].astype("float64")},  # stacks, but the stacked call fails on the dtype
           {"input": models.rows[:1, :2]},                 # another row shape
           {"inpt": models.rows[:1]},                      # an unknown name
           {"input": models.rows[:0]},                     # no rows
           {"input": "not an array"},
           {"input": [[1.0, 2.0], [3.0]]}]                 # ragged
    results = replica.run_batch([good, *bad, good])
    for outs in (results[0], results[-1]):
        np.testing.assert_allclose(outs[0], models.ref[2:4], **TOL)
    errors = results[1:-1]
    assert all(isinstance(e, tvm_nimble.NimbleError) for e in errors), errors
    messages = [str(e) for e in errors]
    assert "dtype float64" in messages[0] and "shape [1, 2, 16, 16]" in messages[1]
    assert "unknown input 'inpt'" in messages[2] and "empty" in messages[3]
    assert "expected a numpy array" in messages[4] and "expected a numpy array" in messages[5]
    assert all("\n" not in m for m in messages)


def test_http_body_format(models):
    slots = ReplicaModel(models.plain).inputs
    x = decode_json(json.dumps({"inputs": {"input": models.rows[:1].tolist()}}).encode(), slots)
    assert x["input"].dtype == np.float32 and np.array_equal(x["input"], models.rows[:1])  # JSON floats: exact
    for body, says in ((b"{not json", "not JSON"), (b'{"input": [1]}', 'no "inputs" object'),
                       (b'{"inputs": {"input": [[1, 2], [3]]}}', "not a nested list of numbers of one shape"),
                       (b'{"inputs": {"input": [["a"]]}}', "not a nested list of numbers")):
        with pytest.raises(InputError, match=says):
            decode_json(body, slots)


def test_options_resources_and_batch_sizes(models):
    plain, bucketed = ArtifactFacts.read(models.plain), ArtifactFacts.read(models.bucketed)
    assert bucketed.batch_sizes == tuple(BUCKETS) and plain.batch_sizes is None
    options = ServeOptions(models.bucketed, replicas=2)
    assert options.batch_size(bucketed) == BUCKETS[-1] and options.gpus(bucketed) == 0
    assert options.gpus(ArtifactFacts("x", "cuda", None)) == 1  # one GPU per replica for a CUDA artifact
    with pytest.raises(tvm_nimble.NimbleError, match="replicas must be an integer >= 1, got 0"):
        ServeOptions(models.plain, replicas=0)


def test_serving_never_reaches_the_compiler():
    from test_layout import import_graph

    g = import_graph()
    serving = [m for m in g if m.startswith("tvm_nimble.serve")]
    assert len(serving) >= 4
    reached = set().union(*(nx.descendants(g, m) for m in serving))
    allowed = ("tvm_nimble.runtime", "tvm_nimble.serve", "tvm_nimble.contract", "tvm_nimble.errors", "tvm_nimble.env",
               "tvm_nimble.native_libs")
    assert all(m == "tvm_nimble" or m.startswith(allowed) for m in reached), sorted(reached)


def test_serve_command_errors_are_one_line(models, tmp_path, monkeypatch, capsys):
    """Without Ray (simulated: ``import ray`` fails) the command names the extra to install; a missing
    artifact or a bad option is named before Ray is needed."""
    from tvm_nimble.cli.main import main

    monkeypatch.setitem(sys.modules, "ray", None)
    for args, says in (((models.bucketed,), NEEDS_RAY),
                       ((str(tmp_path / "missing.nimble"),), "artifact not found"),
                       ((models.bucketed, "--replicas", "0"), "replicas must be an integer >= 1")):
        assert main(["serve", *args]) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tvm-nimble: error: ") and says in lines[0], lines


# ---- on Ray Serve -------------------------------------------------------------------------------------
class Served:
    """A Serve application of the bucketed artifact on two replicas, with HTTP and handle clients."""

    TIMEOUT_S = 30

    def __init__(self, models, ray, serve, client, url):
        self.models, self.ray, self.serve, self.client, self.url = models, ray, serve, client, url

    def post(self, body: bytes):
        """(status, JSON answer) of one HTTP request; a timeout raises (no request may hang)."""
        req = urllib.request.Request(self.url, data=body, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.TIMEOUT_S) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            text = err.read()
            try:
                return err.code, json.loads(text)
            except ValueError:
                return err.code, {"error": text.decode(errors="replace")}

    def http(self, a: int, n: int):
        return self.post(json.dumps({"inputs": {"input": self.models.rows[a:a + n].tolist()}}).encode())

    def replica_names(self) -> dict[str, str]:
        """replica id -> actor name of the running replicas."""
        names = [a["name"] for a in self.ray.util.list_named_actors(all_namespaces=True)]
        return {n.rsplit("#", 1)[1]: n for n in names if n.startswith("SERVE_REPLICA::nimble#")}


def _free_port() -> int:
    """A free port below Linux's ephemeral range (32768 on): one the kernel gave out as ephemeral could be taken by
    one of Ray's own processes, which open dozens of sockets between this call and Serve's proxy binding it (it
    failed a CI run with "Failed to bind to address")."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-31999")


@pytest.fixture(scope="module")
def served(models, tmp_path_factory):
    ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'tvm-nimble[serve]')")
    from tvm_nimble import serve

    env = {"RAY_AUTH_MODE": "disabled",  # no token written under the home folder
           "RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "1"}  # 2 shared cores answer slowly
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        # the replicas import this checkout's tvm_nimble; one TVM thread each on the two cores
        workers = {"PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
                   "TVM_NUM_THREADS": "1"}
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": workers},
                 _temp_dir=str(tmp_path_factory.mktemp("ray")))
        try:
            port = _free_port()
            client = serve.start(ServeOptions(models.bucketed, replicas=2), port=port, timeout_s=Served.TIMEOUT_S)
            yield Served(models, ray, serve, client, f"http://127.0.0.1:{port}/")
        finally:
            serve.shutdown()
            ray.shutdown()


def _request(i: int) -> tuple[int, int]:
    """Request ``i``'s rows (first row, count): 1 to 3 rows of the 12, neighbours differ."""
    return (5 * i) % 10, 1 + i % 3


def test_many_threads_over_http_and_the_handle(served):
    """500 requests from 16 threads, every other one over HTTP: each answer is the reference's for its own
    rows (so none is lost, duplicated or swapped), and both replicas answer."""
    models = served.models

    def one(i):
        a, n = _request(i)
        if i % 2:
            return i, served.client(input=models.rows[a:a + n])[0], None
        status, doc = served.http(a, n)
        assert status == 200, doc
        return i, np.asarray(doc["outputs"][0], dtype="float32"), doc["replica"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(500)))
    assert sorted(i for i, _, _ in answers) == list(range(500))
    for i, out, _ in answers:
        a, n = _request(i)
        np.testing.assert_allclose(out, models.ref[a:a + n], **TOL, err_msg=f"request {i}")
    assert len({r for _, _, r in answers if r}) == 2


def test_a_bad_request_gets_400_and_the_next_is_answered(served):
    x = served.models.rows
    for body, says in ((b"{oops", "not JSON"),
                       (json.dumps({"inputs": {"input": x[:1, :2].tolist()}}).encode(), "has shape [1, 2, 16, 16]"),
                       (json.dumps({"inputs": {"inpt": x[:1].tolist()}}).encode(), "unknown input 'inpt'")):
        status, doc = served.post(body)
        assert status == 400 and says in doc["error"] and "\n" not in doc["error"], (status, doc)
    with pytest.raises(InputError, match="has dtype float64, the model expects float32"):
        served.client(input=x[:2].astype("float64"))
    for i in range(4):  # both replicas still serve
        status, doc = served.http(i, 2)
        assert status == 200, doc
        np.testing.assert_allclose(np.asarray(doc["outputs"][0]), served.models.ref[i:i + 2], **TOL)
        np.testing.assert_allclose(served.client(input=x[i:i + 2])[0], served.models.ref[i:i + 2], **TOL)


def test_a_killed_replica_fails_no_request_and_comes_back(served):
    """One replica is killed (``ray.kill`` on its actor) while 16 threads send 240 requests: every handle
    request is answered (one retry on the live replica), every HTTP one answers or fails with a 5xx (or the
    proxy's 408 at its request timeout), none past its timeout; then Serve's new replica answers."""
    models = served.models
    before = served.replica_names()
    assert len(before) == 2
    answered = threading.Semaphore(0)

    def one(i):
        a, n = _request(i)
        if i % 2:
            out, status = served.client(input=models.rows[a:a + n])[0], 200
        else:
            status, doc = served.http(a, n)
            out = np.asarray(doc["outputs"][0], dtype="float32") if status == 200 else None
        answered.release()
        return i, status, out

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(one, i) for i in range(240)]
        for _ in range(40):
            assert answered.acquire(timeout=Served.TIMEOUT_S)
        victim = sorted(before)[0]
        served.ray.kill(served.ray.get_actor(before[victim], namespace="serve"), no_restart=True)
        results = [f.result(timeout=3 * Served.TIMEOUT_S) for f in futures]
    for i, status, out in results:
        a, n = _request(i)
        if i % 2 or status == 200:
            np.testing.assert_allclose(out, models.ref[a:a + n], **TOL, err_msg=f"request {i}")
        else:  # a 5xx, or Serve's proxy's 408 where its request timeout came first (a loaded 2-core machine)
            assert status == 408 or 500 <= status < 600, (i, status)
    failed = [i for i, status, _ in results if status != 200]
    assert len(failed) <= 8, failed  # at most those in flight on the killed replica (max_ongoing_requests)

    deadline = time.monotonic() + 60  # Serve notices the death and starts a replica
    while True:
        status, doc = served.http(1, 2)
        if status == 200 and doc["replica"] not in before:
            np.testing.assert_allclose(np.asarray(doc["outputs"][0]), models.ref[1:3], **TOL)
            break
        assert time.monotonic() < deadline, "no new replica answered within 60 s of the kill"
        time.sleep(0.5)
    assert victim not in served.replica_names() and len(served.replica_names()) == 2


def test_the_serve_load_experiment_dry_runs_on_the_cpu(tmp_path):
    """scripts/experiments/serve_load.py (#56's GPU measurement) on Ray's local cluster with CPU replicas: both
    engines answer as the artifact does row by row (the script checks), and each has a capacity and a p99."""
    pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'tvm-nimble[serve]')")
    import subprocess

    env = dict(os.environ, PYTHONPATH=ROOT, RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "experiments", "serve_load.py"), "--models",
                        "zoo:inception", "--target", "llvm", "--replicas", "1", "--buckets", "1,2", "--clients", "1",
                        "--loads", "0.5", "--seconds", "0.3", "--capacity-requests", "16", "--port", str(_free_port()),
                        "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (record,) = json.load(open(tmp_path / "serve_load.json"))
    engines = {e["engine"]: e for e in record["engines"]}
    assert set(engines) == {"nimble", "torch-cudagraph"}
    for e in engines.values():
        assert e["capacity"] > 0 and e["check_rel"] < 1e-3 and e["loads"][0]["p99_ms"] > 0
    with open(tmp_path / "serving.csv", newline="") as f:  # the rows for benchmarks/serving.csv: the json's numbers
        rows = list(csv.DictReader(f))
    assert [(r["engine"], float(r["p99_ms"])) for r in rows] == [
        (name, pytest.approx(e["loads"][0]["p99_ms"], abs=1e-3)) for name, e in engines.items()]
