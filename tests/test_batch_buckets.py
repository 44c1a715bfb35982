"""Batch buckets (issue #35, CPU part): one artifact built for batch sizes 1, 2, 4, 8 serves any batch.

Every batch size 1..33 gives the rows the ONNX reference gives each row alone (padded to the next
bucket, or split over runs of the largest one), padded rows never reach the caller, the weights are
stored (and loaded) once, and a model whose batch is baked in is refused in one line.
"""
import json
import os
import threading

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_nimble
from tvm_nimble import zoo
from tvm_nimble.errors import ModelError, NimbleError
from tvm_nimble.runtime.artifact import ArtifactError
from tvm_nimble.runtime.buckets import arena_layout
from tvm_nimble import NimbleExecutor
from tvm_nimble.runtime.bucketed import BucketedExecutor
from tvm_nimble.runtime.executor import Executor, InputError

SIZES = [1, 2, 4, 8]
ROWS = 33  # every batch size 1..33: inside buckets, at their edges, one past them, and split over several runs
MODELS = {
    "resnet": lambda: zoo.resnet_chain(blocks=1),  # a chain
    "inception": lambda: zoo.inception(blocks=1, hw=8),  # parallel branches joined by a concat
}


class Case:
    """A zoo net built with buckets (exported, loaded back) and at its own batch 1, plus a table of rows
    with the ONNX reference's output for each row run alone."""

    def __init__(self, name, tmp):
        self.name = name
        self.model = MODELS[name]()
        self.path = os.path.join(tmp, f"{name}.nimble")
        self.bucketed = tvm_nimble.build(self.model, "llvm", batch_sizes=SIZES)
        self.bucketed.export(self.path)
        self.single_path = os.path.join(tmp, f"{name}-b1.nimble")
        tvm_nimble.build(self.model, "llvm").export(self.single_path)
        rng = np.random.default_rng(7)
        dims = [d.dim_value for d in self.model.graph.input[0].type.tensor_type.shape.dim]
        self.x = rng.standard_normal((ROWS, *dims[1:])).astype("float32")
        ref = ReferenceEvaluator(self.model)
        self.ref = np.concatenate([ref.run(None, {"input": self.x[i:i + 1]})[0] for i in range(ROWS)])


_cases = {}


def _case(name, tmp_path_factory):
    if name not in _cases:
        _cases[name] = Case(name, str(tmp_path_factory.mktemp(name)))
    return _cases[name]


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request, tmp_path_factory):
    return _case(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    return _case("resnet", tmp_path_factory)


def test_every_batch_size_gives_each_rows_own_result(case):
    ex = NimbleExecutor(case.path)
    assert isinstance(ex, BucketedExecutor) and ex.batch_sizes == SIZES
    alone = np.concatenate([ex(case.x[i:i + 1])[0].numpy() for i in range(ROWS)])  # each request alone
    np.testing.assert_allclose(alone, case.ref, rtol=1e-4, atol=1e-4)
    rng = np.random.default_rng(0)
    runs = ex.stats["runs"]
    for n in range(1, ROWS + 1):
        idx = rng.permutation(ROWS)[:n]  # other rows at other positions for each size
        y = ex(case.x[idx])[0].numpy()
        assert y.shape == (n, 10), n
        np.testing.assert_allclose(y, case.ref[idx], rtol=1e-4, atol=1e-4, err_msg=f"batch {n}")
        np.testing.assert_allclose(y, alone[idx], rtol=1e-5, atol=1e-5, err_msg=f"batch {n}")
    # a batch over the largest bucket is split: 33 rows are four runs of 8 and one of 1
    assert ex.stats["runs"] - runs == sum(len(ex.chunks(n)) for n in range(1, ROWS + 1))
    ex.close()


def test_smallest_bucket_that_fits_then_split(resnet):
    ex = NimbleExecutor(resnet.path)
    assert ex.chunks(1) == [(0, 1, 1)]
    assert ex.chunks(3) == [(0, 3, 4)]
    assert ex.chunks(4) == [(0, 4, 4)]
    assert ex.chunks(5) == [(0, 5, 8)]
    assert ex.chunks(8) == [(0, 8, 8)]
    assert ex.chunks(9) == [(0, 8, 8), (8, 1, 1)]
    assert ex.chunks(19) == [(0, 8, 8), (8, 8, 8), (16, 3, 4)]


def test_padded_rows_are_zeros_and_never_reach_the_caller(resnet):
    ex = NimbleExecutor(resnet.path)
    ex(resnet.x[:8])  # bucket 8's input buffer now holds 8 real rows
    runner = ex.bucket(8)
    plan = runner.plan
    inp = runner._views[0][plan.inputs[0]]
    out = runner._views[0][plan.outputs[0]]
    y = ex(resnet.x[10:15])[0].numpy()  # 5 rows: bucket 8, 3 padded rows
    assert y.shape == (5, 10)
    np.testing.assert_allclose(y, resnet.ref[10:15], rtol=1e-4, atol=1e-4)
    buf = inp.numpy()
    np.testing.assert_array_equal(buf[5:], 0)  # padding is zeros, not the previous call's rows
    np.testing.assert_array_equal(buf[:5], resnet.x[10:15])
    zero_out = ReferenceEvaluator(resnet.model).run(None, {"input": np.zeros_like(resnet.x[:1])})[0]
    np.testing.assert_allclose(out.numpy()[5:], np.repeat(zero_out, 3, axis=0), rtol=1e-4, atol=1e-4)
    assert not any(np.allclose(row, zero_out[0], atol=1e-3) for row in y)  # the padded rows' outputs stayed behind
    views = ex(resnet.x[:3], copy=False)  # zero-copy: still only the caller's rows
    assert tuple(views[0].shape) == (3, 10)
    np.testing.assert_allclose(views[0].numpy(), resnet.ref[:3], rtol=1e-4, atol=1e-4)
    assert ex.stats["padded_rows"] == 0 + 3 + 1  # 5 rows on bucket 8, 3 rows on bucket 4


def test_warm_runs_every_bucket_once_and_serves_no_request(resnet):
    ex = NimbleExecutor(resnet.path)
    ex.warm()
    assert ex.stats == {"calls": 0, "runs": 0, "rows": 0, "padded_rows": 0, "warm_runs": len(ex.batch_sizes)}
    np.testing.assert_allclose(ex(resnet.x[:3])[0].numpy(), resnet.ref[:3], rtol=1e-4, atol=1e-4)
    assert ex.stats["runs"] == 1 and ex.stats["padded_rows"] == 1


def test_a_batch_over_the_limit_with_split_false_is_one_line(resnet):
    ex = NimbleExecutor(resnet.path)
    with pytest.raises(InputError) as err:
        ex(resnet.x[:9], split=False)
    assert "\n" not in str(err.value) and "9 rows" in str(err.value) and "largest bucket (8" in str(err.value)
    assert ex(resnet.x[:8], split=False)[0].shape[0] == 8
    with tvm_nimble.NimblePool(resnet.path, replicas=1) as pool:
        with pytest.raises(InputError):
            pool(resnet.x[:12], split=False)
        assert pool(resnet.x[:12])[0].shape[0] == 12


def test_weights_are_stored_and_loaded_once(resnet, tmp_path):
    def params_of(path):
        with np.load(os.path.join(path, "params.npz")) as data:
            return {k: data[k] for k in data.files}

    single, bucketed = params_of(resnet.single_path), params_of(resnet.path)
    per_bucket = sum(len(m.plan.constants) for m in resnet.bucketed.buckets.values())
    assert per_bucket == 4 * len(single)  # each bucket's plan has every weight ...
    assert len(bucketed) == len(single)  # ... the artifact stores each once
    assert sum(a.nbytes for a in bucketed.values()) == sum(a.nbytes for a in single.values())
    size = os.path.getsize
    assert size(os.path.join(resnet.path, "params.npz")) <= size(os.path.join(resnet.single_path, "params.npz")) * 1.02
    assert sorted(a.tobytes() for a in bucketed.values()) == sorted(a.tobytes() for a in single.values())
    ex = NimbleExecutor(resnet.path)
    assert ex.weight_buffers == len(single)  # on the device too
    arenas = [arena_layout(m.plan)[1] for m in resnet.bucketed.buckets.values()]
    assert ex.pool_bytes == max(arenas) < sum(arenas)  # one buffer for the buckets, the largest bucket's size
    with open(os.path.join(resnet.path, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["version"] == 2 and [b["batch"] for b in manifest["buckets"]] == SIZES


def test_version_1_artifacts_still_load_and_a_corrupted_bucket_is_refused(resnet, tmp_path):
    with open(os.path.join(resnet.single_path, "manifest.json")) as f:
        assert json.load(f)["version"] == 1
    ex = NimbleExecutor(resnet.single_path)
    assert type(ex) is Executor
    np.testing.assert_allclose(ex(resnet.x[:1])[0].numpy(), resnet.ref[:1], rtol=1e-4, atol=1e-4)
    module = tvm_nimble.load(resnet.path)
    assert module.batch_sizes == SIZES and module.plan is module.bucket(8).plan
    import shutil

    bad = str(tmp_path / "bad.nimble")
    shutil.copytree(resnet.path, bad)
    with open(os.path.join(bad, "plan.b2.json"), "a") as f:
        f.write(" ")
    with pytest.raises(ArtifactError, match="plan.b2.json does not match its checksum"):
        NimbleExecutor(bad)


def test_graph_executor_calls_take_any_batch(resnet):
    ex = NimbleExecutor(resnet.path)
    ex.set_input("input", resnet.x[:11])
    ex.run()
    np.testing.assert_allclose(ex.get_output(0).numpy(), resnet.ref[:11], rtol=1e-4, atol=1e-4)
    ex.set_input(0, resnet.x[3:6])
    ex.run()
    np.testing.assert_allclose(ex.get_output(0).numpy(), resnet.ref[3:6], rtol=1e-4, atol=1e-4)


def test_pool_over_a_bucketed_artifact(resnet):
    errors = []
    with tvm_nimble.NimblePool(resnet.path, replicas=2) as pool:
        assert pool.batch_sizes == SIZES

        def client(seed):
            rng = np.random.default_rng(seed)
            for _ in range(10):
                n = int(rng.integers(1, 18))
                idx = rng.permutation(ROWS)[:n]
                y = pool(resnet.x[idx])[0].numpy()
                if y.shape != (n, 10) or not np.allclose(y, resnet.ref[idx], rtol=1e-4, atol=1e-4):
                    errors.append((seed, n))

        threads = [threading.Thread(target=client, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors


def test_a_fixed_batch_model_serves_any_batch_as_one_bucket():
    model = zoo.resnet_chain(blocks=1, batch=4, hw=8)
    ex = BucketedExecutor(tvm_nimble.build(model, "llvm"))
    assert ex.batch_sizes == [4]
    x = np.random.default_rng(1).standard_normal((9, 3, 8, 8)).astype("float32")
    ref = ReferenceEvaluator(zoo.resnet_chain(blocks=1, hw=8))
    want = np.concatenate([ref.run(None, {"input": x[i:i + 1]})[0] for i in range(9)])
    for n in (1, 3, 4, 9):
        np.testing.assert_allclose(ex(x[:n])[0].numpy(), want[:n], rtol=1e-4, atol=1e-4)
    assert ex.chunks(9) == [(0, 4, 4), (4, 4, 4), (8, 1, 4)]


# ---- models whose batch cannot be changed: one line ------------------------------------------------
def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


def test_a_reshape_that_bakes_the_batch_in_is_named():
    with pytest.raises(ModelError) as err:
        tvm_nimble.build(zoo.vit(), "llvm", batch_sizes=[1, 2])
    text = _one_line(err)
    assert "batch dimension cannot be changed" in text and "Reshape node 'reshape_0_node'" in text, text


def test_an_output_without_the_batch_rows_is_named():
    model = zoo.resnet_chain(blocks=1, hw=8)
    g = model.graph
    g.node[-1].output[0] = "logits"
    g.initializer.append(numpy_helper.from_array(np.array([1, -1], "int64"), "flat"))
    g.node.append(helper.make_node("Reshape", ["logits", "flat"], ["output"], name="to_one_row"))
    with pytest.raises(ModelError) as err:
        tvm_nimble.build(model, "llvm", batch_sizes=[1, 2])
    text = _one_line(err)
    assert "cannot be changed" in text and "'to_one_row'" in text, text


def test_an_input_without_the_batch_in_front_is_named():
    model = zoo.resnet_chain(blocks=1, hw=8)
    g = model.graph
    g.input.append(helper.make_tensor_value_info("bias", 1, [5, 10]))
    g.node[-1].output[0] = "logits"
    g.node.append(helper.make_node("Add", ["logits", "bias"], ["output"]))
    with pytest.raises(ModelError) as err:
        tvm_nimble.build(model, "llvm", batch_sizes=[1, 2])
    assert "'input' starts with 1 and 'bias' with 5" in _one_line(err)


@pytest.mark.parametrize("bad", [[0, 2], ["x"], [1.5]])
def test_bad_batch_sizes_are_one_line(bad):
    with pytest.raises(NimbleError, match="batch_sizes must be"):
        tvm_nimble.build(zoo.resnet_chain(blocks=1), "llvm", batch_sizes=bad)


def test_an_ir_module_cannot_change_its_batch():
    mod = tvm_nimble.from_onnx(zoo.resnet_chain(blocks=1, hw=8))
    with pytest.raises(NimbleError, match="batch_sizes needs an ONNX model"):
        tvm_nimble.build(mod, "llvm", batch_sizes=[1, 2])


# ---- explain and the command line ------------------------------------------------------------------
def test_explain_shows_each_bucket():
    text = tvm_nimble.explain_model(zoo.inception(blocks=1, hw=8), "llvm", batch_sizes=[1, 4])
    lines = text.splitlines()
    assert lines[0].startswith("batch buckets: 1, 4")
    assert any(l.startswith("weights: ") and "stored once" in l for l in lines)
    rows = [l.split() for l in lines if l.strip().split(" ")[0] in ("1", "4") and "not measured" in l]
    assert [r[0] for r in rows] == ["1", "4"]  # batch, launches, streams, syncs, pool, latency
    assert all(int(r[2]) >= 1 for r in rows)
    assert "the largest bucket (batch 4):" in text and "streams:" in text


def test_cli_compile_and_run_with_batch_sizes(tmp_path, capsys):
    from tvm_nimble.cli.main import main

    model = zoo.resnet_chain(blocks=1, hw=8)
    src = zoo.save(model, str(tmp_path / "m.onnx"))
    out = str(tmp_path / "m.nimble")
    assert main(["compile", src, "-o", out, "--target", "llvm", "--batch-sizes", "1,2,4"]) == 0
    assert "batch buckets 1, 2, 4" in capsys.readouterr().out
    x = np.random.default_rng(3).standard_normal((6, 3, 8, 8)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    assert main(["run", out, "--input", f"input={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "o")]) == 0
    y = np.load(tmp_path / "o" / "output0.npy")
    ref = ReferenceEvaluator(model)
    want = np.concatenate([ref.run(None, {"input": x[i:i + 1]})[0] for i in range(6)])
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(SystemExit) as err:  # a usage error: exit code 2
        main(["compile", src, "-o", str(tmp_path / "bad"), "--batch-sizes", "0,2"])
    assert err.value.code == 2


def test_a_bucketed_artifact_runs_with_runtime_only_tvm(resnet, tmp_path):
    from test_runtime_only import run_runtime_only

    y = run_runtime_only(tmp_path, resnet.path, resnet.x[:13])  # 13 rows: 8 + 5 padded to 8
    np.testing.assert_allclose(y, resnet.ref[:13], rtol=1e-4, atol=1e-4)


# ---- the bucketed executor checks and profiles as the plain one does ---------------------------------------
def test_a_tampered_weight_is_refused_by_checksum(resnet, tmp_path):
    import shutil

    bad = str(tmp_path / "tampered.nimble")
    shutil.copytree(resnet.path, bad)
    with np.load(os.path.join(bad, "params.npz")) as data:
        weights = {k: data[k] for k in data.files}
    name = max(weights, key=lambda k: weights[k].size)
    weights[name] = weights[name] * 2  # same shape and dtype: only the checksum can tell
    np.savez(os.path.join(bad, "params.npz"), **weights)
    for call in (tvm_nimble.load, NimbleExecutor):
        with pytest.raises(ArtifactError, match="params.npz does not match its checksum") as err:
            call(bad)
        _one_line(err)


def test_bad_inputs_give_the_plain_executors_one_line_errors(resnet):
    import tvm

    plain, bucketed = NimbleExecutor(resnet.single_path), NimbleExecutor(resnet.path)
    x = resnet.x[:1]
    bad = [("set_input", ("nope", x)), ("set_input", (3, x)), ("set_input", (0, x.astype("float64"))),
           ("set_input", (0, tvm.runtime.tensor(x.astype("float64")))), ("set_input", (0, object())),
           ("__call__", (x, x)), ("__call__", (tvm.runtime.tensor(x.astype("float64")),))]
    for method, args in bad:
        errors = []
        for ex in (plain, bucketed):
            with pytest.raises(NimbleError) as err:
                getattr(ex, method)(*args)
            errors.append((type(err.value), _one_line(err)))
        assert errors[0] == errors[1], (method, errors)
        assert errors[1][0] is InputError
    with pytest.raises(InputError, match="dtype float64, the model expects float32; cast it first"):
        bucketed(tvm.runtime.tensor(resnet.x[:5].astype("float64")))


def test_profile_is_the_buckets_profile(resnet):
    """On the CPU profile() is refused as the plain executor refuses it (it needs GPU streams); the bucketed
    executor hands it to the bucket that serves the batch, or to every bucket."""
    plain, bucketed = NimbleExecutor(resnet.single_path), NimbleExecutor(resnet.path)
    with pytest.raises(ValueError) as want:
        plain.profile()
    for call in (bucketed.profile, lambda: bucketed.profile(batch=3), bucketed.bucket(4).profile):
        with pytest.raises(ValueError) as got:
            call()
        assert str(got.value) == str(want.value)
    assert bucketed.bucket_for(3) == 4 and bucketed.bucket_for(8) == 8 and bucketed.bucket_for(30) == 8


def test_each_bucket_is_a_plain_executor_on_the_shared_weights(resnet):
    ex = NimbleExecutor(resnet.path)
    assert all(type(ex.bucket(b)) is Executor for b in SIZES)
    # a bucket run on its own gives the reference too (it runs on the weights loaded once)
    np.testing.assert_allclose(ex.bucket(2)(resnet.x[:2])[0].numpy(), resnet.ref[:2], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ex(resnet.x[:2])[0].numpy(), resnet.ref[:2], rtol=1e-4, atol=1e-4)
