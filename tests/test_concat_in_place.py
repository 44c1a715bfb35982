"""Concatenations built in place (relay_passes/concat_in_place.py): the branch kernels write their
slices of the concat directly, the copy kernel is gone, and every output still equals the ONNX
reference evaluator's, on every executor path (Nimble's, the race simulator's, TVM's own VM)."""
import copy
import random

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from tvm import relax

from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.codegen.checker import check_plan
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.relay_passes.concat_in_place import concat_axis
from tvm_nimble.runtime.executable import module_from_executable
from tvm_nimble.runtime.race_check import check_races


def _concat_launches(plan) -> int:
    return sum("concatenate" in l.kernel for l in plan.launches)


def _model(channels: list[int], hw: int, nested: bool = False, reuse_branch: bool = False, batch: int = 1):
    """x -> one 1x1 conv + relu per entry of ``channels`` -> concat (of the first two first, if
    ``nested``) -> 1x1 conv (channels[0] outputs); ``reuse_branch`` adds the first branch to the result
    of one more conv, after the concat's last reader."""
    rng = np.random.default_rng(len(channels) + hw)
    cin = 3
    inits, nodes = [], []
    for i, c in enumerate(channels):
        inits.append(numpy_helper.from_array(rng.standard_normal((c, cin, 1, 1)).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"]), helper.make_node("Relu", [f"c{i}"], [f"b{i}"])]
    names = [f"b{i}" for i in range(len(channels))]
    if nested:
        nodes.append(helper.make_node("Concat", names[:2], ["inner"], axis=1))
        names = ["inner"] + names[2:]
    nodes.append(helper.make_node("Concat", names, ["cat"], axis=1))
    cout = channels[0]
    inits.append(numpy_helper.from_array(rng.standard_normal((cout, sum(channels), 1, 1)).astype(np.float32), "wo"))
    nodes.append(helper.make_node("Conv", ["cat", "wo"], ["conv"]))
    if reuse_branch:  # one more conv, so that the concat is dead when the branch is read again
        inits.append(numpy_helper.from_array(rng.standard_normal((cout, cout, 1, 1)).astype(np.float32), "w2"))
        nodes += [helper.make_node("Conv", ["conv", "w2"], ["conv2"]), helper.make_node("Add", ["conv2", "b0"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", ["conv"], ["y"]))
    graph = helper.make_graph(nodes, "concat_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, cin, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, cout, hw, hw])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(module, x):
    with NimbleExecutor(module) as ex:
        return ex(x)[0].numpy()


def _check_against_reference(model, module):
    """Outputs equal the ONNX reference for two inputs, and differ between them (not a constant net)."""
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    outs = []
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        got = _run(module, x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        outs.append(got)
    assert not np.allclose(outs[0], outs[1])


@pytest.mark.parametrize("nested", [False, True])
def test_branches_write_into_the_concat_and_the_copy_is_gone(nested):
    model = _model([16, 32, 16], hw=8, nested=nested)
    module = build(model, "llvm", max_streams=None)
    plain = build(model, "llvm", max_streams=None, concat_in_place=False)
    # a nested concat is flattened first (TVM would fuse the two into one kernel of its own order)
    assert module.report.concats_in_place == 1
    assert _concat_launches(module.plan) == 0 and _concat_launches(plain.plan) == 1
    assert module.plan.num_streams == 3  # the branches still run concurrently
    slices = [t for t in module.plan.tensors if t.view_of is not None and t.offset > 0]
    assert len(slices) >= 2 and all(t.offset % 64 == 0 for t in slices)
    assert check_plan(module.plan) == []
    _check_against_reference(model, module)


def test_concat_stays_a_kernel_where_slices_are_not_contiguous_or_aligned_or_outlive_it():
    for model in (_model([16, 16], hw=8, batch=2),  # batch 2: a channel slice is strided
                  _model([3, 5], hw=5),  # 3 * 25 floats: the second slice would start at byte 300
                  _model([16, 16], hw=8, reuse_branch=True)):  # a branch read after the concat is dead
        module = build(model, "llvm")
        assert module.report.concats_in_place == 0 and _concat_launches(module.plan) == 1
        _check_against_reference(model, module)


def test_zoo_inception_blocks_concat_in_place_and_pass_the_race_simulator(inception_built):
    b = inception_built
    assert b.module.report.concats_in_place > 0 and _concat_launches(b.module.plan) == 0
    assert check_races(b.module, b.inputs, b.reference, seeds=range(20)) == []


def test_dropping_a_wait_on_a_slice_writer_is_caught():
    """A reader of the concat depends on every slice's writer: drop the event wait that orders one
    writer before it and both the static checker and the race simulator must notice."""
    model = zoo.get_model("inception", blocks=2, hw=8, channels=16)
    module = build(model, "llvm", max_streams=None)
    plan = module.plan
    inputs = zoo.random_inputs(model, seed=0)
    reference = [np.asarray(r) for r in ReferenceEvaluator(model).run(None, inputs)]
    slice_writers = {l.idx for l in plan.launches for t in l.writes if plan.tensors[t].offset > 0}
    recorder = plan.recorder_of_event()
    caught = 0
    for l in plan.launches:
        for e in l.waits:
            if recorder[e] not in slice_writers:
                continue
            broken = copy.copy(module)
            broken.plan = copy.deepcopy(plan)
            broken.plan.launches[l.idx].waits.remove(e)
            problems = check_plan(broken.plan)
            if any("missing sync" in p for p in problems):
                caught += 1
                assert check_races(broken, inputs, reference, seeds=range(20)) != []
    assert caught > 0


def test_the_relax_vm_runs_the_nimble_executable_with_slices():
    """tvm.compile(relax_pipeline='nimble') leaves the slices in main: TVM's own VM runs it, right."""
    model = _model([16, 32, 16], hw=8, nested=True)
    mod = from_onnx(model)
    target = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(mod, target, relax_pipeline="nimble")
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert any(t.offset > 0 for t in module_from_executable(ex).plan.tensors)  # the slices are really there


def test_concat_axis_agrees_with_numpy():
    rng = random.Random(0)
    for _ in range(300):
        ndim = rng.randint(1, 4)
        axis = rng.randrange(ndim)
        base = [rng.randint(1, 4) for _ in range(ndim)]
        shapes = []
        for _ in range(rng.randint(2, 4)):
            s = list(base)
            s[axis] = rng.randint(1, 5)
            shapes.append(tuple(s))
        out = np.concatenate([np.zeros(s) for s in shapes], axis=axis).shape
        assert concat_axis(shapes, out) == axis
        wrong = list(out)
        wrong[axis] += 1
        assert concat_axis(shapes, tuple(wrong)) is None


def test_slices_written_by_unordered_launches_get_memory_only_after_all_of_them(nasnet_built):
    """NASNet cells concat branches that run on different streams: a slice's writer is not ordered
    with the first writer of the concat. The pool must wait for every writer (write_ready), which
    differs here from what happens before the first one, and the plan must stay race-free."""
    from tvm_nimble.codegen.happens_before import access_masks, plan_happens_before, write_ready

    plan = nasnet_built.module.plan
    before = plan_happens_before(plan)
    launches = [(l.idx, l.args, l.writes) for l in plan.launches]
    first_write, _ = access_masks(launches, plan.root)
    ready = write_ready(launches, plan.root, before)
    assert any(ready[t] != before[first_write[t]] for t in ready)
    assert check_plan(plan) == []
    assert check_races(nasnet_built.module, nasnet_built.inputs, nasnet_built.reference, seeds=range(20)) == []


def _mixed_vendor_inception():
    """Zoo inception with every other convolution signature on the vendor path: TVM's fusion then
    pulls the vendor outputs into the concat's kernel first, out of concatenation order."""
    from tvm_nimble.relay_passes.vendor_offload import OffloadToVendor, find_offloads

    model = zoo.get_model("inception")
    mod = from_onnx(model)
    keep = set(sorted({o.signature for o in find_offloads(mod["main"])})[::2])
    return model, OffloadToVendor(select=lambda o: o.signature in keep)(mod)


def test_slices_follow_the_kernels_parameter_order_not_the_concats(vendor_reference):
    model, mod = _mixed_vendor_inception()
    module = build(mod, "llvm", max_streams=None)
    assert module.report.concats_in_place == 3 and _concat_launches(module.plan) == 0
    slice_writers = {l.kernel for l in module.plan.launches for t in l.writes if module.plan.tensors[t].view_of is not None
                     and module.plan.tensors[t].shape[1] == 4}
    assert any(k.startswith("nimble.") for k in slice_writers) and any(not k.startswith("nimble.") for k in slice_writers)
    inputs = zoo.random_inputs(model, seed=0)
    other = zoo.random_inputs(model, seed=1)
    ref = ReferenceEvaluator(model).run(None, inputs)[0]
    got = NimbleExecutor(module)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert not np.allclose(got, NimbleExecutor(module)(*other.values())[0].numpy())


@pytest.mark.parametrize("target", ["llvm", {"kind": "cuda", "arch": "sm_90"}])
def test_slice_starts_read_off_the_scheduled_kernel_match_the_concat_order(target):
    """The concat kernels of the mixed build take the vendor outputs first; on llvm (unscheduled) and
    on CUDA (DLight's fused thread index) the slice of each parameter is where the Relax concat puts
    that tensor."""
    from tvm_nimble.relay_passes.concat_kernel import slice_starts
    from tvm_nimble.relay_passes.pipeline import kernel_passes

    _, mod = _mixed_vendor_inception()
    concats = [b.value for blk in mod["main"].body.blocks for b in blk.bindings
               if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.concat"]
    target = tvm.target.Target(target)
    with target:
        lowered = tvm.transform.Sequential(kernel_passes(target))(mod)
    kernels = {gv.name_hint: f for gv, f in lowered.functions.items() if "concatenate" in gv.name_hint}
    assert kernels
    out_of_order = 0
    for func in kernels.values():
        shapes = [tuple(int(d) for d in p.ty.shape) for p in list(func.params)[:-1]]
        starts = slice_starts(func, shapes)
        names = [p.name for p in list(func.params)[:-1]]
        # the parameters are named after the Relax tensors; find that concat and its field order
        concat = next(c for c in concats if {f.name for f in c.args[0].fields} >= {n.removesuffix("_vendor_0") for n in names})
        order = [f.name for f in concat.args[0].fields]
        elems = [int(np.prod(s)) for s in shapes]
        expected = {f: sum(elems[:order.index(f)]) for f in order}  # equal slices: the field's position
        assert starts == [expected[n.removesuffix("_vendor_0")] for n in names]
        out_of_order += starts != sorted(starts)
    assert out_of_order > 0


def test_densenet_nested_concats_build_in_place_and_match_the_reference():
    """DenseNet (zoo.densenet): each layer's concat takes the previous one; every concat but each block's
    last (fused into the next BatchNormalization) becomes a slice of the next, on every executor path."""
    model = zoo.densenet(blocks=(2, 3), growth=4, init_channels=8)
    module = build(model, "llvm", max_streams=None)
    assert module.report.concats_in_place == 5 - 2
    fused = [l.kernel for l in module.plan.launches if "concatenate" in l.kernel]
    assert len(fused) == 2 and all(k.startswith("fused_concatenate") and k != "fused_concatenate" for k in fused)
    assert check_plan(module.plan) == []
    inputs = zoo.random_inputs(model)
    want = ReferenceEvaluator(model).run(None, inputs)
    np.testing.assert_allclose(_run(module, inputs["input"]), want[0], rtol=1e-4, atol=1e-4)
    assert check_races(module, inputs, want, seeds=range(5)) == []
