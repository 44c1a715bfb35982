"""Faults that no test caught when they were planted (issue #33), each with a CPU test that fails when it is:

1. ``cuda_graph.issue`` skipping a sync or a join wait: the issue loop is driven through its stream
   interface by a recorder, and what it issues is compared op for op with the plan's checked sequence.
2. The race simulator not poisoning the blocks before the run: a read before the input copy that
   only the poison reveals (the stale bytes are right), and kernels that see the blocks they get.
3. ``vendor.so`` left out of an artifact's checksums: a corrupted one must be refused.
4. ``clip(0, hi)`` fused as relu6, or relu6 fused as relu, by the vendor offload: against onnx.reference.
5. (tests/test_carry.py) the carry check that refuses an input written by a kernel.
6. Shape folding that ignores what If / Loop bodies read: against onnx.reference.
"""
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvm_nimble.contract import vendor_abi
from tvm_nimble.runtime import cuda_graph
from tvm_nimble.runtime.issue import LAUNCH, RECORD, WAIT, Op, check_sequence, issue_sequence
from tvm_nimble.runtime.module import NimbleModule
from tvm_nimble.contract.plan import Launch, Plan, Storage, TensorSlot
from tvm_nimble.runtime.race_check import POISON, check_races

OPSET = [helper.make_opsetid("", 17)]


def _py_kernel(fn):
    def kernel(*args):
        *ins, out = args
        out.copyfrom(fn(*[t.numpy() for t in ins]).astype(out.dtype))
    return kernel


# ---- 1. cuda_graph.issue executes the checked sequence, op for op --------------------------------------

def _three_stream_plan():
    """c = relu(x) on s0, a = -x on s1, b = relu(c) on s2 (waits for c), y = a + b on s0 (waits for a and b):
    fork waits on two helpers, sync waits on two streams, two join waits."""
    shape, nb = [2, 4], 32
    tensors = [TensorSlot(0, "x", shape, "float32", "input", 0)]
    tensors += [TensorSlot(i, n, shape, "float32", "intermediate", i) for i, n in ((1, "c"), (2, "a"), (3, "b"))]
    tensors += [TensorSlot(4, "y", shape, "float32", "output", 4)]
    launches = [Launch(0, "relu", [0, 1], [1], 0, records=[0]),
                Launch(1, "neg", [0, 2], [2], 1, records=[1]),
                Launch(2, "relu", [1, 3], [3], 2, waits=[0], records=[2]),
                Launch(3, "add", [2, 3, 4], [4], 0, waits=[1, 2])]
    plan = Plan(target={"kind": "cuda"}, num_streams=3, num_events=3, tensors=tensors,
                storages=[Storage(i, nb, k) for i, k in enumerate(("input", "pool", "pool", "pool", "output"))],
                launches=launches, inputs=[0], outputs=[4], constants=[])
    plan.validate()
    return plan


class RecordingStreams:
    """The stream interface of ``cuda_graph.issue`` (what ``CudaStreamOps`` does on a GPU), recording
    every call as the Op it issues; a launch also runs the kernel it is given."""

    def __init__(self):
        self.ops: list[Op] = []
        self.labels: list[str] = []

    def wait(self, stream, event, what):
        self.ops.append(Op(WAIT, stream, event))
        self.labels.append(what)

    def record(self, stream, event, what):
        self.ops.append(Op(RECORD, stream, event))
        self.labels.append(what)

    def launch(self, stream, index, func, args):
        self.ops.append(Op(LAUNCH, stream, launch=index))
        self.labels.append(None)
        func(*args)


@pytest.mark.parametrize("single_stream", [False, True])
def test_cuda_graph_issue_issues_the_checked_sequence_op_for_op(single_stream):
    plan = _three_stream_plan()
    planned = issue_sequence(plan, single_stream=single_stream)
    assert check_sequence(plan, planned, single_stream=single_stream) == []
    ran = []  # (launch, its arguments) as the kernels were called
    funcs = [lambda *a, i=i: ran.append((i, a)) for i in range(len(plan.launches))]
    args = [(f"args of {i}",) for i in range(len(plan.launches))]
    rec = RecordingStreams()
    cuda_graph.issue(planned, funcs, args, rec)
    # what reaches the streams is the planned list itself: every fork, sync and join wait and record
    assert rec.ops == [Op(LAUNCH, op.stream, launch=op.launch) if op.kind == LAUNCH
                       else Op(op.kind, op.stream, op.event) for op in planned]
    assert rec.labels == [op.label if op.kind != LAUNCH else None for op in planned]  # errors name the call
    assert check_sequence(plan, rec.ops, single_stream=single_stream) == []
    assert ran == [(i, args[i]) for i in range(len(plan.launches))]  # each kernel with its own arguments
    if not single_stream:
        roles = [op.role for op in planned if op.kind == WAIT]
        assert roles.count("sync") == 3 and roles.count("join") == 2 and roles.count("fork") == 2


# ---- 2. the race simulator poisons every block before the run ------------------------------------------

def _hidden_state_module():
    """y0 = relu(x) on the main stream, y1 = h / 2 on stream 1. h is a recurrent model's first hidden
    state: zeros, the very bytes the workspace starts an input block with. Without the fork, stream 1
    reads h before the host copies it in; it finds the right values there unless the block is poisoned."""
    shape, nb = [4, 8], 128
    tensors = [TensorSlot(0, "x", shape, "float32", "input", 0), TensorSlot(1, "h", shape, "float32", "input", 1),
               TensorSlot(2, "y0", shape, "float32", "output", 2), TensorSlot(3, "y1", shape, "float32", "output", 3)]
    plan = Plan(target={"kind": "llvm"}, num_streams=2, num_events=0, tensors=tensors,
                storages=[Storage(i, nb, k) for i, k in enumerate(("input", "input", "output", "output"))],
                launches=[Launch(0, "relu", [0, 2], [2], 0), Launch(1, "halve", [1, 3], [3], 1)],
                inputs=[0, 1], outputs=[2, 3], constants=[])
    plan.validate()
    kernels = {"relu": _py_kernel(lambda x: np.maximum(x, 0)), "halve": _py_kernel(lambda h: h / 2)}
    x, h = np.linspace(-3, 3, 32, dtype=np.float32).reshape(shape), np.zeros(shape, np.float32)
    return NimbleModule(plan, kernels, {}), {"x": x, "h": h}, [np.maximum(x, 0), h / 2]


def test_a_read_before_the_input_copy_is_caught_only_by_the_poison():
    module, inputs, reference = _hidden_state_module()
    ops = issue_sequence(module.plan)
    assert check_races(module, inputs, reference, seeds=range(20)) == []
    no_fork = [op for op in ops if op.role != "fork"]
    assert any("may start before the run begins" in p for p in check_sequence(module.plan, no_fork))
    assert check_races(module, inputs, reference, seeds=range(20), ops=no_fork, poison=False) == []  # stale = right
    assert check_races(module, inputs, reference, seeds=range(20), ops=no_fork) != []


def test_every_pool_and_output_block_is_poison_when_the_run_starts():
    """A kernel that accumulates into its output (y += x, as if the buffer were zeroed) and one that reads a
    pool block no launch writes: both read a block before it is written, and must find poison there
    (all-ones bytes), whatever the allocator handed out. Odd sizes: no other test's freed block fits."""
    shape = [3, 37]
    nb = 3 * 37 * 4
    tensors = [TensorSlot(i, n, shape, "float32", k, i)
               for i, (n, k) in enumerate((("x", "input"), ("p", "intermediate"), ("y", "output"), ("z", "output")))]
    plan = Plan(target={"kind": "llvm"}, num_streams=1, num_events=0, tensors=tensors,
                storages=[Storage(0, nb, "input"), Storage(1, nb, "pool"), Storage(2, nb, "output"),
                          Storage(3, nb, "output")],
                launches=[Launch(0, "accumulate", [0, 2], [2], 0), Launch(1, "read_p", [1, 3], [3], 0)],
                inputs=[0], outputs=[2, 3], constants=[])
    plan.validate()
    seen = {}

    def accumulate(x, y):
        seen["output"] = y.numpy().view(np.uint8).copy()
        y.copyfrom(y.numpy() + x.numpy())

    def read_p(p, z):
        seen["pool"] = p.numpy().view(np.uint8).copy()
        z.copyfrom(p.numpy())

    module = NimbleModule(plan, {"accumulate": accumulate, "read_p": read_p}, {})
    x = np.ones(shape, np.float32)
    assert check_races(module, {"x": x}, [x, np.zeros(shape, np.float32)], seeds=[0]) == [0]
    assert set(seen) == {"output", "pool"}
    for kind, data in seen.items():
        assert (data == POISON).all(), f"the {kind} block was not poisoned before the run"


# ---- 3 and 4: a convolution offloaded to the vendor kernels, on CPU through their numpy contract ----------
#
# TVM's ONNX importer turns Clip into maximum / minimum kernels (never relax.clip), so an ONNX model's
# clip is not fused at all; the fusion (relax.clip(0, 6) -> the vendor call's relu6) is reached from a
# Relax module, e.g. torch's frontend's. Each case is therefore both: an ONNX model, the reference and
# the importer's path, and the same computation written with relax.clip, the fusion's path.

def _conv_case(hi):
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 3, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    consts = [numpy_helper.from_array(np.asarray(v, np.float32), n)
              for n, v in (("w", w), ("b", b), ("lo", 0), ("hi", hi))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    graph = helper.make_graph(nodes, "conv_clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], consts)

    def relax_body(bb, x):
        from tvm import relax

        c = bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=[1, 1, 1, 1]))
        return bb.emit(relax.op.add(c, relax.const(b.reshape(1, 4, 1, 1))))

    return helper.make_model(graph, opset_imports=OPSET), relax_body


def _gemm_case(hi):
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    consts = [numpy_helper.from_array(np.asarray(v, np.float32), n)
              for n, v in (("w", w), ("b", b), ("lo", 0), ("hi", hi))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["c"]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    graph = helper.make_graph(nodes, "gemm_clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], consts)

    def relax_body(bb, x):
        from tvm import relax

        return bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, relax.const(w))), relax.const(b)))

    return helper.make_model(graph, opset_imports=OPSET), relax_body


def _relax_module(model, relax_body, hi):
    """``model``'s computation as a Relax module whose clip is ``relax.clip(0, hi)``."""
    from tvm import relax

    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.clip(relax_body(bb, x), 0.0, hi))
        bb.emit_func_output(y)
    return bb.get()


def _offloaded(mod):
    """``mod`` (a Relax module or an ONNX model) with its convolutions / GEMMs offloaded to the vendor
    kernels, built for llvm."""
    import tvm

    from tvm_nimble.compiler.build import build
    from tvm_nimble.compiler.frontend import from_onnx
    from tvm_nimble.relay_passes.vendor_offload import OffloadToVendor

    module = build(OffloadToVendor()(mod if isinstance(mod, tvm.IRModule) else from_onnx(mod)), "llvm")
    assert module.plan.uses_vendor_kernels
    return module


@pytest.mark.parametrize("source", ["relax", "onnx"])
@pytest.mark.parametrize("case", [_conv_case, _gemm_case], ids=["conv", "gemm"])
@pytest.mark.parametrize("hi", [6.0, 4.0])  # relu6, and a clip that is not relu6
def test_an_offloaded_clip_keeps_its_bounds(source, case, hi, vendor_reference):
    from tvm_nimble import NimbleExecutor

    model, relax_body = case(hi)
    x_shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = (4 * np.random.default_rng(2).standard_normal(x_shape)).astype(np.float32)
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    unclipped = ReferenceEvaluator(model).run(["c"], {"x": x})[0]
    assert unclipped.max() > 6 + 1 and unclipped.min() < -1  # both bounds bite (and a relu6 differs from hi=4)
    module = _offloaded(_relax_module(model, relax_body, hi) if source == "relax" else model)
    if source == "relax" and case is _conv_case and hi == 6:  # the fusion under test does happen
        assert all(l.kernel.startswith(vendor_abi.CUDNN.prefix) for l in module.plan.launches)
    out = NimbleExecutor(module)(x)[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_a_corrupted_vendor_library_in_an_artifact_is_refused(tmp_path):
    """The vendor extension is code the artifact loads (ctypes), so it is checksummed like kernels.so. The
    real one needs CUDA to load; the checksum is verified before anything loads, so any file does here."""
    from tvm_nimble.runtime.artifact import VENDOR_FILE, ArtifactError, load_artifact_files
    from tvm_nimble.runtime.module import load

    built = _offloaded(_conv_case(6.0)[0])
    lib = tmp_path / "libnimble_vendor.so"
    lib.write_bytes(b"\x7fELF" + bytes(range(256)) * 16)
    module = NimbleModule(built.plan, built.kernels, built.params, vendor_library=str(lib))
    path = str(tmp_path / "m.nimble")
    module.export(path)
    load_artifact_files(path)  # intact: every checksum matches
    vendor = os.path.join(path, VENDOR_FILE)
    data = bytearray(open(vendor, "rb").read())
    data[100] ^= 0x01  # one flipped bit
    with open(vendor, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(ArtifactError, match=rf"{VENDOR_FILE} does not match its checksum") as err:
        load(path)
    assert "\n" not in str(err.value) and "rebuild the artifact" in str(err.value)


# ---- 6. shape folding keeps what If / Loop bodies read ----------------------------------------------------

def _scalar(name, value, dtype=np.float32):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype), name))


def _if_model(decided=False):
    """s = Shape(relu(x)) and sf = Cast(s) fold to constants; only the If branches read them (and the
    constant k): then y = relu(x) * k + sum(sf), else y = Reshape(-relu(x), s). The condition is an
    input, or (``decided``) computed from the shape: s[0] == 2, which folds too, deciding the If."""
    fx = [2, 3]
    then = helper.make_graph(
        [helper.make_node("Mul", ["r", "k"], ["rk"]), helper.make_node("ReduceSum", ["sf"], ["tot"], keepdims=0),
         helper.make_node("Add", ["rk", "tot"], ["y_then"])], "then", [],
        [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, fx)])
    other = helper.make_graph(
        [helper.make_node("Neg", ["r"], ["nr"]), helper.make_node("Reshape", ["nr", "s"], ["y_else"])], "else", [],
        [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, fx)])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT), _scalar("k", 2.0)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, fx)]
    if decided:
        nodes += [_scalar("zero", 0, np.int64), _scalar("two", 2, np.int64),
                  helper.make_node("Gather", ["s", "zero"], ["rows"], axis=0),
                  helper.make_node("Equal", ["rows", "two"], ["cond"])]
    else:
        inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    nodes.append(helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other))
    graph = helper.make_graph(nodes, "if_reads_outer", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, fx)])
    return helper.make_model(graph, opset_imports=OPSET)


def _loop_model():
    """Three iterations of v = Reshape(v + sum(sf), s) (then) or Reshape(v, s) (else), the choice an If
    inside the Loop body makes: the outer s and sf are read two subgraphs deep."""
    fx = [2, 3]
    then = helper.make_graph(
        [helper.make_node("ReduceSum", ["sf"], ["tot"], keepdims=0), helper.make_node("Add", ["v_in", "tot"], ["vt"]),
         helper.make_node("Reshape", ["vt", "s"], ["w_then"])], "then", [],
        [helper.make_tensor_value_info("w_then", TensorProto.FLOAT, fx)])
    other = helper.make_graph([helper.make_node("Reshape", ["v_in", "s"], ["w_else"])], "else", [],
                              [helper.make_tensor_value_info("w_else", TensorProto.FLOAT, fx)])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("If", ["flag"], ["v_out"], then_branch=then, else_branch=other)], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, fx)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, fx)])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             _scalar("trips", 3, np.int64), _scalar("go", True, np.bool_),
             helper.make_node("Loop", ["trips", "go", "r"], ["y"], body=body)]
    graph = helper.make_graph(nodes, "loop_reads_outer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, fx),
                                                          helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, fx)])
    return helper.make_model(graph, opset_imports=OPSET)


@pytest.mark.parametrize("make", [_if_model, _loop_model, lambda: _if_model(decided=True)],
                         ids=["if", "loop", "shape-decided-if"])
@pytest.mark.parametrize("flag", [True, False])
def test_shape_folding_keeps_what_subgraphs_read(make, flag):
    from tvm_nimble.compiler.frontend import fold_static_shapes

    model = make()
    folded = fold_static_shapes(model)
    assert folded is not model and "Shape" not in [n.op_type for n in folded.graph.node]  # s was folded
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    feeds = dict(zip([i.name for i in model.graph.input], [x, np.array(flag)]))  # (the decided If takes x only)
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(ReferenceEvaluator(folded).run(None, feeds)[0], ref, rtol=0, atol=0)
