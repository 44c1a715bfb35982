"""Buckets over the ONNX model's named dimensions (issue #52): ``build(..., buckets={"sequence_length": [...]})``.

One artifact of a tiny GPT-2 and of a tiny Qwen2/Llama-style decoder, bucketed over the sequence, gives
at every length 1..64 what the ONNX reference evaluator gives on the unpadded inputs, and the same once
exported and loaded back; two dimensions at once (batch and sequence) too. A length over the largest
bucket, an unknown dimension name and a model whose padding is not masked (a bidirectional encoder with
no attention mask) are each one line; the same encoder with its mask is served right at every length.
"""
import json
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_nimble
from tvm_nimble import NimbleExecutor
from tvm_nimble.errors import ModelError, NimbleError, ShapeError
from tvm_nimble.runtime.bucketed import BucketedExecutor
from tvm_nimble.runtime.inputs import InputError

SEQ = [8, 16, 32, 64]


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


def _feeds(ids: np.ndarray) -> dict:
    return {"input_ids": ids, "attention_mask": np.ones(ids.shape, np.int64)}


class Decoder:
    """A tiny decoder built with sequence buckets (the batch fixed at 1, by shape_dict for GPT-2 and by a
    one-size bucket for the Llama-style one), exported and loaded back."""

    def __init__(self, name, tmp):
        import decoder_models

        self.model = getattr(decoder_models, f"tiny_{name}_onnx")()
        if name == "gpt2":
            options = {"buckets": {"sequence_length": SEQ}, "shape_dict": {"input_ids": [1, 1], "attention_mask": [1, 1]}}
        else:
            options = {"buckets": {"batch": [1], "sequence_length": SEQ}}
        self.module = tvm_nimble.build(self.model, "llvm", **options)
        self.path = os.path.join(tmp, f"{name}.nimble")
        self.module.export(self.path)
        self.ids = np.random.default_rng(0).integers(0, 256, (1, SEQ[-1])).astype(np.int64)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def decoder(request, tmp_path_factory):
    pytest.importorskip("transformers")
    return Decoder(request.param, str(tmp_path_factory.mktemp(request.param)))


def test_every_length_matches_the_reference_and_the_artifact(decoder):
    built, loaded = NimbleExecutor(decoder.module), NimbleExecutor(decoder.path)
    assert isinstance(loaded, BucketedExecutor)
    ref = ReferenceEvaluator(decoder.model)
    for n in range(1, SEQ[-1] + 1):
        feeds = _feeds(decoder.ids[:, :n])
        want = ref.run(None, feeds)[0]
        got = built(**feeds)[0].numpy()
        assert got.shape == want.shape == (1, n, 256)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"length {n}")
        np.testing.assert_array_equal(loaded(**feeds)[0].numpy(), got)
    assert decoder.module.info["padding_check"].startswith("passed")


def test_one_artifact_stores_the_weights_once(decoder):
    with open(os.path.join(decoder.path, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["version"] == 3 and [b["sizes"][-1] for b in manifest["buckets"]] == SEQ
    with np.load(os.path.join(decoder.path, "params.npz")) as stored:
        names = set(stored.files)
    per_bucket = sum(len(m.plan.constants) for m in decoder.module.buckets.values())
    assert names == set(decoder.module.shared_weights()[1]) and len(names) < per_bucket


def test_a_length_over_the_largest_bucket_is_one_line(decoder):
    ex = NimbleExecutor(decoder.path)
    ids = np.zeros((1, SEQ[-1] + 1), np.int64)
    with pytest.raises(InputError) as err:
        ex(**_feeds(ids))
    text = _one_line(err)
    assert "sequence_length is 65, over the largest bucket" in text and "give at most 64" in text, text



def test_a_batcher_over_named_buckets_is_one_line(decoder):
    """A Batcher stacks requests as rows of one batch: over buckets of another dimension it has nothing to stack
    (it failed with a TypeError on the missing batch sizes)."""
    from tvm_nimble.errors import NimbleError
    from tvm_nimble.runtime.batcher import Batcher

    with pytest.raises(NimbleError) as err:
        Batcher(decoder.path, max_delay_ms=1)
    text = _one_line(err)
    assert "sequence_length" in text and "batch_sizes=[...]" in text, text

def test_two_dimensions_at_once(tmp_path):
    pytest.importorskip("transformers")
    from decoder_models import tiny_gpt2_onnx

    model = tiny_gpt2_onnx()
    module = tvm_nimble.build(model, "llvm", buckets={"batch": [1, 2], "sequence_length": [4, 8]})
    assert list(module.buckets) == [(1, 4), (1, 8), (2, 4), (2, 8)]
    module.export(str(tmp_path / "m.nimble"))
    built, loaded = NimbleExecutor(module), NimbleExecutor(str(tmp_path / "m.nimble"))
    ref = ReferenceEvaluator(model)
    ids = np.random.default_rng(1).integers(0, 256, (2, 8)).astype(np.int64)
    for b in (1, 2):
        for n in range(1, 9):
            feeds = _feeds(ids[:b, :n])
            got = built(**feeds)[0].numpy()
            np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4, err_msg=f"{b}x{n}")
            np.testing.assert_array_equal(loaded(**feeds)[0].numpy(), got)
    with pytest.raises(InputError, match="batch is 3, over the largest bucket"):  # named dims are never split
        built(**_feeds(np.zeros((3, 4), np.int64)))
    with pytest.raises(InputError, match="disagree on the sequence_length"):
        built(input_ids=ids[:1, :3], attention_mask=np.ones((1, 4), np.int64))


# ---- an encoder: padding masked or not -----------------------------------------------------------
def encoder(masked: bool):
    """A one-layer bidirectional self-attention over embedded ids ([1, sequence_length] -> [1,
    sequence_length, 8]); ``masked``: an ``attention_mask`` input adds -1e4 to the scores of positions
    where it is 0."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("emb", (16, 8)), ("wq", (8, 8)), ("wk", (8, 8)))]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["x"]),
             helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"])]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "sequence_length"])]
    if masked:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "sequence_length"]))
        inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("one", 1.0), ("big", -1e4))]
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
        nodes += [helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["one", "m"], ["off"]), helper.make_node("Mul", ["off", "big"], ["bias2"]),
                  helper.make_node("Unsqueeze", ["bias2", "axis1"], ["bias"]),
                  helper.make_node("Add", ["scores", "bias"], ["masked"])]
    nodes += [helper.make_node("Softmax", ["masked" if masked else "scores"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "x"], ["hidden"])]
    out = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "sequence_length", 8])
    graph = helper.make_graph(nodes, "encoder", inputs, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("sizes", [[4, 8], [8]])
def test_padding_that_is_not_masked_is_refused(sizes):
    with pytest.raises(ModelError) as err:
        tvm_nimble.build(encoder(masked=False), "llvm", buckets={"sequence_length": sizes})
    text = _one_line(err)
    assert "padding sequence_length is not masked" in text and "attention mask" in text, text


def test_a_masked_encoder_is_right_at_every_length():
    model = encoder(masked=True)
    ex = NimbleExecutor(tvm_nimble.build(model, "llvm", buckets={"sequence_length": [4, 8]}))
    ref = ReferenceEvaluator(model)
    ids = np.random.default_rng(2).integers(0, 16, (1, 8)).astype(np.int64)
    for n in range(1, 9):
        feeds = _feeds(ids[:, :n])
        np.testing.assert_allclose(ex(**feeds)[0].numpy(), ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_the_onnx_checker_runs_once_for_all_buckets(monkeypatch):
    """The buckets of one model differ only in their inputs' sizes: the ONNX checker (seconds on a decoder's
    hundreds of MB) runs on the first bucket's model, not on every bucket's; a plain build still runs it."""
    import onnx

    calls = []
    real = onnx.checker.check_model
    monkeypatch.setattr(onnx.checker, "check_model", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = encoder(masked=True)
    tvm_nimble.build(model, "llvm", buckets={"sequence_length": [2, 4, 8]})
    assert len(calls) == 1
    tvm_nimble.build(model, "llvm", shape_dict={"input_ids": [1, 4], "attention_mask": [1, 4]})
    assert len(calls) == 2


# ---- bad requests: one line ------------------------------------------------------------------------
def test_an_unknown_dimension_name_lists_the_models():
    with pytest.raises(ShapeError) as err:
        tvm_nimble.build(encoder(masked=True), "llvm", buckets={"seq_len": [4, 8]})
    text = _one_line(err)
    assert "'seq_len'" in text and "'sequence_length'" in text, text


def test_a_dynamic_dimension_left_open_is_one_line():
    model = encoder(masked=False)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.raises(ShapeError) as err:
        tvm_nimble.build(model, "llvm", buckets={"sequence_length": [4, 8]})
    text = _one_line(err)
    assert "dynamic dim 0 ('batch')" in text and "shape_dict" in text, text


@pytest.mark.parametrize("bad, match", [({"sequence_length": [0, 4]}, r"buckets\['sequence_length'\] must be"),
                                        (5, "buckets must be a mapping"),
                                        ([("s", [1]), ("s", [2])], "names dimension 's' twice")])
def test_bad_bucket_options_are_one_line(bad, match):
    with pytest.raises(NimbleError, match=match) as err:
        tvm_nimble.build(encoder(masked=True), "llvm", buckets=bad)
    _one_line(err)


def test_batch_sizes_and_buckets_together_are_one_line():
    with pytest.raises(NimbleError, match="give batch_sizes or buckets, not both") as err:
        tvm_nimble.build(encoder(masked=True), "llvm", buckets={"sequence_length": [4]}, batch_sizes=[1, 2])
    _one_line(err)


# ---- explain and the command line ------------------------------------------------------------------
def test_explain_shows_each_bucket():
    text = tvm_nimble.explain_model(encoder(masked=True), "llvm", buckets={"sequence_length": [4, 8]})
    lines = text.splitlines()
    assert lines[0].startswith("buckets: sequence_length 4, 8")
    rows = [l.split() for l in lines if "not measured" in l]
    assert [r[0] for r in rows] == ["4", "8"] and all(int(r[2]) >= 1 for r in rows)
    assert "the largest bucket (sequence_length=8):" in text


def test_cli_compile_and_run_with_buckets(tmp_path, capsys):
    import onnx

    from tvm_nimble.cli.main import main

    model = encoder(masked=True)
    src = str(tmp_path / "enc.onnx")
    onnx.save(model, src)
    out = str(tmp_path / "enc.nimble")
    assert main(["compile", src, "-o", out, "--target", "llvm", "--buckets", "sequence_length=4,8"]) == 0
    assert "buckets sequence_length 4, 8" in capsys.readouterr().out
    feeds = _feeds(np.array([[3, 1, 4, 1, 5]], np.int64))
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
    assert main(["run", out, "--output-dir", str(tmp_path / "o"),
                 *[arg for name in feeds for arg in ("--input", f"{name}={tmp_path / (name + '.npy')}")]]) == 0
    got = np.load(tmp_path / "o" / "output0.npy")
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(SystemExit) as err:  # a usage error: exit code 2
        main(["compile", src, "-o", str(tmp_path / "bad"), "--buckets", "sequence_length"])
    assert err.value.code == 2


@pytest.mark.parametrize("width", [4, 64])
def test_a_short_input_leaves_zeros_after_its_prefix_in_the_bucket(width):
    """A shorter input after a longer one in the same bucket: the positions past its extent are zeros again, not what
    the longer one left there, whether the bucket's buffer is small enough to be padded on the host and copied once
    (width 4: 8 KB at 512 positions) or is the prefix copied and the rest zeroed on the device (width 64: 128 KB).
    Outputs against numpy."""
    from tvm_nimble.runtime import bucketed

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", width])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ex = NimbleExecutor(tvm_nimble.build(model, "llvm", buckets={"n": [64, 512]}))
    assert (width * 512 * 4 <= bucketed.HOST_PAD_BYTES) == (width == 4)
    rng = np.random.default_rng(0)
    for n in (500, 300):
        x = rng.standard_normal((1, n, width)).astype(np.float32) + 1
        np.testing.assert_array_equal(ex(x)[0].numpy(), np.maximum(x, 0))
        held = ex.bucket(512).input_views()[0].numpy()
        np.testing.assert_array_equal(held[0, :n], x[0])
        assert not held[0, n:].any()


@pytest.mark.parametrize("options", [{"buckets": {"batch": [1], "sequence_length": [4, 8]}},
                                     {"batch_sizes": [1, 2], "shape_dict": {"input_ids": [1, 8],
                                                                            "attention_mask": [1, 8]}}],
                         ids=["sequence", "batch"])
def test_a_buckets_reference_compiled_by_a_child_is_that_buckets_module(options):
    """A bucketed CUDA build compiles each bucket's float32 reference in a child process from that bucket's import
    on (here forced on llvm): the child imports the bucket as the build does (the weights lifted to inputs and
    bound back, the inputs at the bucket's sizes), so its module is the build's, hash for hash, and its library
    gives what stock TVM's build of the build's module gives; the model is written once for all the children and
    removed after."""
    import dataclasses

    import tvm

    import decoder_models
    from tvm_nimble.compiler import accuracy, reference_build
    from tvm_nimble.compiler.buckets import BucketRequest
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.compiler.session import BuildSession
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm

    pytest.importorskip("transformers")
    options = dict(options)
    shape_dict = options.pop("shape_dict", None)
    opts = BuildOptions.create("llvm", precision="fp16", timing_cache="off", **options)
    request = BucketRequest(decoder_models.tiny_gpt2_onnx(), opts, shape_dict)
    small = 1024  # bytes: the tiny model's weights are small; lifted as a real model's are
    lifted = reference_build.BucketImport.lifted(request.onnx_model, small)
    assert lifted[1]
    session = BuildSession(request.options)
    rng = np.random.default_rng(0)
    with reference_build.model_file(request.onnx_model) as path:
        for key, bucket in request.imports():
            bucket = dataclasses.replace(bucket, min_weight_bytes=small)
            mod = bucket.module(lifted)
            pending = accuracy.start_reference(path, None, mod, session, background=True, bucket=bucket)
            child = pending.executable()
            assert child is not None, key  # the child's module hash is the build's
            ids = rng.integers(0, 256, request.shapes_at(key)["input_ids"]).astype(np.int64)
            x = [ids, np.ones(ids.shape, np.int64)]
            here = StockVM(build_stock_vm(mod, tvm.target.Target("llvm")), tvm.cpu(), x).outputs()
            there = StockVM(child, tvm.cpu(), x).outputs()
            assert len(here) == len(there) == 1 and np.array_equal(here[0], there[0]), key
        assert os.path.isfile(path)
    assert not os.path.exists(path)
