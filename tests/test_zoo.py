"""The model zoo: valid ONNX, the advertised structure, and stock TVM agrees with ONNX's reference."""
from collections import Counter

import numpy as np
import onnx
import pytest
import tvm
from onnx.reference import ReferenceEvaluator

from tvm_nimble import zoo
from tvm_nimble.compiler.frontend import from_onnx

LLVM = tvm.target.Target({"kind": "llvm"})


def run_stock_tvm(model: onnx.ModelProto, inputs: dict) -> list:
    """Compile with stock TVM for llvm and run on the Relax VM; outputs as numpy arrays."""
    ex = tvm.compile(from_onnx(model), target=LLVM)
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v, tvm.cpu()) for v in inputs.values()])
    # a single-output model gives one tvm.runtime.Tensor, several outputs give an Array of them
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [o.numpy() for o in out]


def assert_matches_reference(model: onnx.ModelProto, seed: int = 0):
    inputs = zoo.random_inputs(model, seed=seed)
    ref = ReferenceEvaluator(model).run(None, inputs)
    got = run_stock_tvm(model, inputs)
    assert len(got) == len(ref) == 1
    assert got[0].shape == ref[0].shape
    assert np.all(np.isfinite(ref[0])) and np.abs(ref[0]).max() > 1e-2  # not a degenerate all-zero net
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-4)


def live_nodes(model: onnx.ModelProto) -> int:
    """Number of nodes the graph outputs depend on."""
    producer = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
    live, stack = set(), [o.name for o in model.graph.output]
    while stack:
        t = stack.pop()
        i = producer.get(t)
        if i is not None and i not in live:
            live.add(i)
            stack.extend(model.graph.node[i].input)
    return len(live)


def op_counts(model):
    return Counter(n.op_type for n in model.graph.node)


# ---- every zoo model ------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_zoo_model_is_valid_onnx_with_the_common_interface(name):
    model = zoo.get_model(name)
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert [i.name for i in model.graph.input] == ["input"]
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [o.name for o in model.graph.output] == ["output"]
    shape = zoo.input_shape(model)["input"]
    assert len(shape) == 4 and shape[0] == 1 and all(isinstance(d, int) and d > 0 for d in shape)
    ops = [n.op_type for n in model.graph.node]
    head = ["LayerNormalization", "ReduceMean", "Gemm"] if name == "vit" else ["GlobalAveragePool", "Flatten", "Gemm"]
    assert ops[-3:] == head
    assert live_nodes(model) == len(model.graph.node)  # no dead ops
    # seeded: same seed, same bytes; another seed, other weights
    assert zoo.get_model(name).SerializeToString() == model.SerializeToString()
    assert zoo.get_model(name, seed=1).SerializeToString() != model.SerializeToString()


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_zoo_model_stock_tvm_matches_onnx_reference(name):
    assert_matches_reference(zoo.get_model(name))


# ---- structure of each family --------------------------------------------------------------
def test_inception_blocks_have_four_branches_joined_by_concat():
    model = zoo.inception(blocks=3)
    concats = [n for n in model.graph.node if n.op_type == "Concat"]
    assert len(concats) == 3 and all(len(n.input) == 4 for n in concats)
    assert all(a.i == 1 for n in concats for a in n.attribute if a.name == "axis")
    c = op_counts(model)
    assert c["MaxPool"] == 3
    # stem + per block 1 + 2 + 3 + 1 convs, each followed by Relu
    assert c["Conv"] == 1 + 3 * 7 and c["Relu"] == c["Conv"]
    producer = {n.output[0]: n for n in model.graph.node}
    for n in model.graph.node:
        if n.op_type == "Conv":
            consumers = [m for m in model.graph.node if n.output[0] in m.input]
            assert [m.op_type for m in consumers] == ["Relu"]
    for cat in concats:  # the pool branch: MaxPool(stride 1, pad 1) -> 1x1 conv -> Relu
        branch_convs = [producer[producer[i].input[0]] for i in cat.input]
        pool_conv = branch_convs[3]
        assert producer[pool_conv.input[0]].op_type == "MaxPool"
        attrs = {a.name: list(a.ints) for a in producer[pool_conv.input[0]].attribute}
        assert attrs["strides"] == [1, 1] and attrs["pads"] == [1, 1, 1, 1]


def test_inception_scales_and_chains_blocks():
    model = zoo.inception(blocks=2, batch=2, hw=8, channels=8)
    assert zoo.input_shape(model) == {"input": (2, 3, 8, 8)}
    assert op_counts(model)["Concat"] == 2
    assert_matches_reference(model)
    with pytest.raises(ValueError, match="multiple of 4"):
        zoo.inception(channels=10)


def test_nasnet_cells_use_separable_convs_pools_adds_and_skips():
    model = zoo.nasnet(cells=3, channels=16)
    c = op_counts(model)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    groups = [next((a.i for a in n.attribute if a.name == "group"), 1) for n in convs]
    assert groups.count(16) == 3 * 5  # five separable convs per cell, each a depthwise + a 1x1 conv
    assert c["AveragePool"] == 3 * 2 and c["MaxPool"] == 3
    assert c["Add"] == 3 * 5
    concats = [n for n in model.graph.node if n.op_type == "Concat"]
    assert len(concats) == 3 and all(len(n.input) == 5 for n in concats)
    # every cell concat is followed by a 1x1 conv back to 16 channels: the cell output
    inits = {t.name: t for t in model.graph.initializer}
    cell_outs = []
    for cat in concats:
        (nxt,) = [n for n in model.graph.node if cat.output[0] in n.input]
        assert nxt.op_type == "Conv" and list(inits[nxt.input[1]].dims) == [16, 80, 1, 1]
        cell_outs.append(nxt.output[0])
    # skip connections: cell i reads the outputs of cells i-1 and i-2 (the stem stands in for
    # both before cell 0), so the stem feeds cells 0 (twice) and 1, cell 0 feeds cells 1 and 2,
    # cell 1 only cell 2 (the last), and cell 2 the head
    stem = convs[0].output[0]
    readers = {t: sum(t in n.input for n in model.graph.node) for t in [stem] + cell_outs}
    assert readers == {stem: 3, cell_outs[0]: 2, cell_outs[1]: 1, cell_outs[2]: 1}


def test_nasnet_more_cells_matches_reference():
    assert_matches_reference(zoo.nasnet(cells=3, hw=8, channels=8, seed=3))


def test_resnet_chain_residuals():
    model = zoo.resnet_chain(blocks=4)
    c = op_counts(model)
    assert c["Add"] == 4 and c["Conv"] == 1 + 4 * 2
    for add in (n for n in model.graph.node if n.op_type == "Add"):
        (nxt,) = [n for n in model.graph.node if add.output[0] in n.input]
        assert nxt.op_type == "Relu"
    assert_matches_reference(zoo.resnet_chain(blocks=2, batch=2, seed=5))


def test_mobilenet_chain_depthwise_clip_and_residual_where_shapes_match():
    model = zoo.mobilenet_chain(blocks=4, channels=16)
    c = op_counts(model)
    assert c["Clip"] == 1 + 4 * 2
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    depthwise = [n for n in convs if next((a.i for a in n.attribute if a.name == "group"), 1) > 1]
    assert len(depthwise) == 4
    # block 0 widens 8 -> 16 channels and block 2 has stride 2: no residual there
    assert c["Add"] == 2
    strides = [next(list(a.ints) for a in n.attribute if a.name == "strides") for n in depthwise]
    assert strides == [[1, 1], [1, 1], [2, 2], [1, 1]]


def test_zoo_kwargs_are_validated():
    with pytest.raises(ValueError, match="blocks"):
        zoo.resnet_chain(blocks=0)
    with pytest.raises(ValueError, match="num_ops"):
        zoo.random_dag(num_ops=0)


# ---- random DAGs -----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 7])
@pytest.mark.parametrize("num_ops", [1, 5, 12, 40])
def test_random_dag_is_valid_deterministic_and_has_no_dead_ops(seed, num_ops):
    model = zoo.random_dag(num_ops=num_ops, seed=seed)
    onnx.checker.check_model(model, full_check=True)
    assert model.SerializeToString() == zoo.random_dag(num_ops=num_ops, seed=seed).SerializeToString()
    assert live_nodes(model) == len(model.graph.node)
    assert set(op_counts(model)) <= {"Conv", "Add", "Concat", "Relu", "GlobalAveragePool", "Flatten", "Gemm"}
    # at least num_ops ops besides the stem conv and the 3-node head
    assert len(model.graph.node) - 4 >= num_ops
    # every tensor before the head has the same channel count and spatial size
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for vi in inferred.graph.value_info:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if len(dims) == 4 and not vi.name.startswith(("concat", "globalaveragepool")):
            assert dims == [1, 8, 8, 8], vi.name


def test_random_dag_seeds_give_different_graphs():
    graphs = {tuple((n.op_type, tuple(n.input)) for n in zoo.random_dag(num_ops=12, seed=s).graph.node)
              for s in range(6)}
    assert len(graphs) == 6


@pytest.mark.parametrize("seed,num_ops", [(1, 8), (2, 20)])
def test_random_dag_matches_reference(seed, num_ops):
    assert_matches_reference(zoo.random_dag(num_ops=num_ops, seed=seed))


def test_densenet_layers_concatenate_onto_all_earlier_features():
    for concat in ("nested", "list"):
        model = zoo.densenet(blocks=(2, 3), growth=4, init_channels=8, concat=concat)
        ops = op_counts(model)
        # per layer BN-Relu-Conv1x1-BN-Relu-Conv3x3; a transition BN-Relu-Conv1x1-AvgPool; stem and head BN
        assert ops["Conv"] == 1 + 2 * 5 + 1 and ops["BatchNormalization"] == 1 + 2 * 5 + 1 + 1
        assert ops["AveragePool"] == 1 and ops["Concat"] == 5
        cats = [n for n in model.graph.node if n.op_type == "Concat"]
        if concat == "nested":  # each concat's first input is the previous layer's concat (within a block)
            assert all(len(c.input) == 2 for c in cats)
            assert cats[1].input[0] == cats[0].output[0] and cats[3].input[0] == cats[2].output[0]
        else:  # each concat takes the block's input and every layer output so far
            assert [len(c.input) for c in cats] == [2, 3, 2, 3, 4]
    # torchvision densenet121's shape: 120 convs, 58 dense layers, 7.98M weights, 1024 features at 7x7
    label, big = zoo.get_bench_model("densenet121")
    ops = op_counts(big)
    assert label == "densenet121" and ops["Conv"] == 120 and ops["Concat"] == 58 and ops["AveragePool"] == 3
    learned = ("w_", "bn_scale", "bn_shift", "fc_w", "fc_b")  # torchvision's parameters (running stats are buffers)
    params = sum(int(np.prod(t.dims)) for t in big.graph.initializer if t.name.startswith(learned))
    assert params == 7_978_856 - 1000 * 1025 + 10 * 1025  # torchvision densenet121's count, with a 10-class head


# ---- helpers ---------------------------------------------------------------------------------
def test_get_model_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as e:
        zoo.get_model("vgg")
    msg = str(e.value)
    assert "'vgg'" in msg
    for name in ("inception", "nasnet", "resnet", "mobilenet", "densenet", "random_dag", "vit"):
        assert name in msg
    assert set(zoo.ZOO) == {"inception", "nasnet", "resnet", "mobilenet", "densenet", "random_dag", "vit"}
    assert zoo.ZOO["resnet"] is zoo.resnet_chain and zoo.ZOO["mobilenet"] is zoo.mobilenet_chain


def test_get_model_passes_kwargs():
    model = zoo.get_model("random_dag", num_ops=3, seed=4, batch=3)
    assert zoo.input_shape(model) == {"input": (3, 3, 8, 8)}
    assert model.SerializeToString() == zoo.random_dag(num_ops=3, seed=4, batch=3).SerializeToString()


def test_save_roundtrip(tmp_path):
    model = zoo.resnet_chain(blocks=1)
    path = zoo.save(model, tmp_path / "sub" / "r.onnx")
    assert path == str(tmp_path / "sub" / "r.onnx")
    assert onnx.load(path).SerializeToString() == model.SerializeToString()


def test_input_shape_and_random_inputs():
    model = zoo.inception(blocks=1, batch=2, hw=12, channels=8, in_channels=5)
    assert zoo.input_shape(model) == {"input": (2, 5, 12, 12)}
    a, b, c = (zoo.random_inputs(model, seed=s) for s in (0, 0, 1))
    assert list(a) == ["input"] and a["input"].dtype == np.float32 and a["input"].shape == (2, 5, 12, 12)
    np.testing.assert_array_equal(a["input"], b["input"])
    assert not np.array_equal(a["input"], c["input"])


def test_input_shape_reports_symbolic_dims_and_random_inputs_refuses_them():
    from onnx import TensorProto, helper

    from tvm_nimble.errors import ShapeError

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert zoo.input_shape(model) == {"x": ("N", 3)}
    with pytest.raises(ShapeError, match="'x'"):
        zoo.random_inputs(model)


def test_random_inputs_bound_ids_by_the_embedding_behind_a_reshape_and_give_masks_right_padding():
    """GPT-2's export reshapes input_ids to [-1, seq] before its embedding's Gather: the ids stay below the
    table's rows (not 0/1); an integer input that indexes nothing is a padding mask whose first position is
    kept, so no query row of a causal decoder is fully masked (checked against the ONNX reference evaluator:
    a Gather of an id past the table raises there)."""
    from onnx import TensorProto, helper, numpy_helper

    rows, seq = 50, 8
    table = numpy_helper.from_array(np.arange(rows * 4, dtype=np.float32).reshape(rows, 4), "table")
    shape = numpy_helper.from_array(np.array([-1, seq], dtype=np.int64), "shape")
    g = helper.make_graph(
        [helper.make_node("Reshape", ["input_ids", "shape"], ["flat"]),
         helper.make_node("Gather", ["table", "flat"], ["emb"], axis=0),
         helper.make_node("Cast", ["attention_mask"], ["keep"], to=TensorProto.FLOAT),
         helper.make_node("Unsqueeze", ["keep", "axes"], ["keep3"]),
         helper.make_node("Mul", ["emb", "keep3"], ["y"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, 4])],
        initializer=[table, shape, numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = zoo.random_inputs(model, seed=0)
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.max() < rows and len(np.unique(ids)) > 2  # ids across the table, not a 0/1 mask
    np.testing.assert_array_equal(mask, [[1] * (seq - seq // 4) + [0] * (seq // 4)])
    y = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_array_equal(y[0, :, 0], np.where(mask[0] == 1, ids[0] * 4.0, 0.0))
