"""Precision as a build option: fp16 and bf16 builds on llvm against the ONNX reference evaluator and
the fp32 build, the mixed-precision policy read from the built IR, the accuracy report and its guard."""

import numpy as np
import pytest
import tvm
from onnx.reference import ReferenceEvaluator
from tvm import relax

from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.contract import vendor_abi
from tvm_nimble.runtime.timing import random_inputs
from tvm_nimble.compiler.stages import import_model
from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes.precision import Policy, to_precision

#: the relative L2 error each reduced precision stays within on the zoo nets (fp16 keeps 11 bits of
#: mantissa, bf16 8: an error of a few ulps over a few dozen operators)
BOUND = {"fp16": 1e-2, "bf16": 5e-2}


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("name", ["inception", "vit"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_builds_match_the_reference_and_report_their_error(name, precision):
    model = zoo.get_model(name)
    inputs = zoo.random_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, inputs)[0]
    other = ReferenceEvaluator(model).run(None, zoo.random_inputs(model, seed=1))[0]
    result = build(model, "llvm", precision=precision, max_streams=None)
    dtype = {"fp16": "float16", "bf16": "bfloat16"}[precision]
    assert any(t.dtype == dtype for t in result.plan.tensors)  # it really computes in the reduced dtype
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    assert out.dtype == np.float32  # inputs and outputs keep the model's dtypes
    err = _rel(out, ref)
    assert err < BOUND[precision] and _rel(other, ref) > 10 * err  # close, and the check is not vacuous
    report = result.report.accuracy
    assert report.precision == precision and report.input_dependent
    assert 0 < report.rel_l2 < BOUND[precision]


def test_the_fp32_reference_is_kept_for_the_next_build_of_the_same_model_and_weights():
    """The accuracy report's reference (a whole stock TVM build) is computed once per model and weights: the next
    build of the model, in another precision, takes it from the timing cache and reports the error that a
    reference built again gives; the same graph with other weights gets a reference of its own."""
    import onnx
    from onnx import numpy_helper

    from tvm_nimble.compiler import accuracy
    from tvm_nimble.compiler.build import build_with
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.compiler.session import BuildSession, CacheMemory

    memory = CacheMemory()  # what one process's builds measured (no GPU here: nothing on disk)
    model = zoo.get_model("inception")
    first = build_with(model, BuildOptions.create("llvm", precision="fp16"), cache=memory)
    second = build_with(model, BuildOptions.create("llvm", precision="bf16"), cache=memory)
    assert first.report.accuracy.reference_cached is False
    assert second.report.accuracy.reference_cached is True
    # a reference built again (a new session), stock TVM on this CPU, gives the same error
    fresh = accuracy.measure(import_model(model), second, tvm.cpu(), BuildSession(second.options))
    assert fresh.reference_cached is False and fresh.rel_l2 == second.report.accuracy.rel_l2
    other = onnx.ModelProto()
    other.CopyFrom(model)
    w = other.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 0.5, w.name))
    rebuilt = build_with(other, BuildOptions.create("llvm", precision="bf16"), cache=memory)
    assert rebuilt.report.accuracy.reference_cached is False  # other weights: not the first model's reference
    assert 0 < rebuilt.report.accuracy.rel_l2 < BOUND["bf16"]


def test_the_fp32_reference_compiled_by_a_child_process_gives_the_same_report(tmp_path):
    """A CUDA build compiles its reference in a child process from its import on (here forced on llvm): the child's
    library gives the error the reference built in the process gives; a child whose module is not the parent's
    (another model's file) is not used (the reference is built here), and nothing is left in its folder."""
    import os

    import onnx

    from tvm_nimble.compiler import accuracy
    from tvm_nimble.compiler.session import BuildSession

    from tvm_nimble.compiler.stock import StockVM, build_stock_vm

    model = zoo.get_model("inception")
    built = build(model, "llvm", precision="fp16", max_streams=None, timing_cache="off")
    fp32_mod = import_model(model)
    x = random_inputs(built.plan, 0)
    here = StockVM(build_stock_vm(fp32_mod, tvm.target.Target("llvm")), tvm.cpu(), x).outputs()
    child = accuracy.start_reference(model, None, fp32_mod, BuildSession(built.options), background=True).executable()
    assert child is not None
    assert all(np.array_equal(a, b) for a, b in zip(StockVM(child, tvm.cpu(), x).outputs(), here))

    session = BuildSession(built.options)
    pending = accuracy.start_reference(model, None, fp32_mod, session, background=True)
    report = accuracy.measure(fp32_mod, built, tvm.cpu(), session, pending)
    assert report.reference_cached is False and report.rel_l2 == built.report.accuracy.rel_l2 > 0
    assert not os.path.exists(pending.folder)
    # cached now in this session: no child is started
    assert accuracy.start_reference(model, None, fp32_mod, session, background=True) is None

    other = tmp_path / "other.onnx"
    onnx.save(zoo.get_model("inception", seed=1), str(other))
    session = BuildSession(built.options)
    wrong = accuracy.start_reference(str(other), None, fp32_mod, session, background=True)
    assert wrong.executable() is None and not os.path.exists(wrong.folder)
    assert accuracy.measure(fp32_mod, built, tvm.cpu(), session, wrong).rel_l2 == built.report.accuracy.rel_l2


def test_a_model_over_protobufs_limit_gets_no_child_reference():
    """A ModelProto over protobuf's 2 GB limit (a 0.5B decoder in float32) cannot be written for a child: no child is
    started (the accuracy stage builds the reference itself) where sizing it raised "Failed to serialize proto" and
    failed the build. Its weights' size comes from their dims (here 4 GiB of dims with no data)."""
    from onnx import TensorProto, helper

    from tvm_nimble.compiler.reference_build import start

    target = tvm.target.Target("llvm")
    small = zoo.get_model("inception")
    fp32_mod = import_model(small)
    pending = start(small, None, fp32_mod, target, "0")
    assert pending is not None
    pending.cancel()
    huge = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 29, 2])
    big = helper.make_model(helper.make_graph([], "big", [], [], initializer=[huge]))
    assert start(big, None, fp32_mod, target, "0") is None
    assert start(small, None, fp32_mod, target, "0", limit=1000) is None


def _dtypes_by_op(mod):
    """op name -> set of dtypes it computes in, read from the module."""
    seen = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and isinstance(v.ty, relax.TensorType):
                seen.setdefault(v.op.name, set()).add(str(v.ty.dtype))
    return seen


def test_the_policy_keeps_reductions_softmax_and_norms_in_fp32_and_can_be_overridden():
    mod = import_model(zoo.get_model("vit"))
    by_op = _dtypes_by_op(to_precision(mod, "bfloat16"))
    assert by_op["relax.matmul"] == {"bfloat16"} and by_op["relax.nn.conv2d"] == {"bfloat16"}
    for kept in ("relax.nn.softmax", "relax.mean"):
        assert by_op[kept] == {"float32"}, kept
    assert "bfloat16" in by_op["relax.add"]  # elementwise operators follow their inputs
    # a convolution's bias (a constant reshaped to [1, C, 1, 1]) is a weight: its add and the ReLU after
    # it stay in the reduced dtype instead of sending the whole net back to fp32
    conv_net = _dtypes_by_op(to_precision(import_model(zoo.get_model("inception")), "float16"))
    assert conv_net["relax.add"] == {"float16"} and conv_net["relax.nn.relu"] == {"float16"}
    by_op = _dtypes_by_op(to_precision(mod, "float16", Policy().with_fp32(["matmul"])))
    assert by_op["relax.matmul"] == {"float32"} and by_op["relax.nn.conv2d"] == {"float16"}


def test_the_same_policy_in_a_built_module_keeps_fp32_outputs_and_matches_the_fp32_build():
    """The fp32 build is an independent reference here: stock TVM on the imported model."""
    model = zoo.get_model("inception")
    mod = import_model(model)
    ref_vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    result = build(model, "llvm", precision="fp16", keep_fp32=("conv2d", "matmul"), max_streams=None)
    inputs = random_inputs(result.plan, 3)
    ref = ref_vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    out = NimbleExecutor(result)(*inputs)[0].numpy()
    assert _rel(out, ref) < 1e-5  # every GEMM and convolution in fp32: nothing left to round much


def test_max_error_refuses_a_build_over_it_in_one_line():
    model = zoo.get_model("inception", blocks=1, hw=8)
    with pytest.raises(NimbleError, match=r"^the bf16 build is .* from float32, over max_error 1e-06: ") as err:
        build(model, "llvm", precision="bf16", max_streams=None, max_error=1e-6)
    assert "\n" not in str(err.value)
    build(model, "llvm", precision="bf16", max_streams=None, max_error=0.5)  # within it: built


def test_a_cuda_build_without_its_gpu_says_the_error_was_not_measured():
    model = zoo.get_model("inception", blocks=1, hw=8)
    result = build(model, {"kind": "cuda", "arch": "sm_90"}, precision="fp16", kernels="tvm", max_streams=None,
                   compile_kernels=False)
    assert result.report.accuracy.rel_l2 is None
    with pytest.raises(NimbleError, match=r"^max_error needs the build's error measured"):
        build(model, {"kind": "cuda", "arch": "sm_90"}, precision="fp16", kernels="tvm", max_streams=None,
              compile_kernels=False, max_error=1e-2)


def test_the_command_line_takes_precision_names_and_refuses_others_in_one_line(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(zoo.get_model("inception", blocks=1, hw=8).SerializeToString())
    from cli_runner import run_cli

    r = run_cli("compile", str(path), "--target", "llvm", "--precision", "bf16", "--max-streams", "1", "-o",
                str(tmp_path / "m.tar"))
    assert r.returncode == 0, r.stderr
    assert "accuracy (bf16): " in r.stdout and "relative L2 from float32" in r.stdout
    r = run_cli("explain", str(path), "--target", "llvm", "--precision", "int8")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "tvm-nimble: error: precision must be one of fp32, tf32, fp16, bf16, got 'int8'"]


# ---- element-wise chains in float32, rounded once per kernel (issue #31) -------------------------------
def _lowered(model, dtype, policy, target="llvm"):
    from tvm_nimble.compiler import stages
    from tvm_nimble.compiler.options import BuildOptions

    opts = BuildOptions.create(target, max_streams=None, kernels="tvm", compile_kernels=False)
    return stages.build_fixed(to_precision(import_model(model), dtype, policy), opts)


def _kernel_outputs(result):
    """(kernel count, the dtype of each tensor a kernel writes that is not a model output, in order)."""
    p = result.program
    outputs = set(p.outputs)
    return len(p.kernels), [p.values[w].dtype for k in p.kernels for w in k.writes if w not in outputs]


def _gelu_kernel(result):
    """The TIR of the fused kernel that computes the GELU after the MLP's first matmul."""
    names = [gv for gv in result.lowered.functions if "erf" in gv.name_hint]
    assert len(names) == 1  # (both ViT blocks call the same kernel)
    return result.lowered[names[0]].script()


@pytest.mark.parametrize("name", ["vit", "nasnet", "bert"])
def test_elementwise_chains_compute_in_fp32_in_the_same_kernels_with_16_bit_tensors_between_them(name):
    """Read from the lowered IR: the chain after a matmul (bias, GELU's divide/erf/add/multiply/multiply)
    computes in float32 inside its kernel and is rounded once at its output; the kernels and the dtypes
    of the tensors between them are those of per-operator rounding (no new float32 buffer)."""
    model = zoo.bert() if name == "bert" else zoo.get_model(name)
    on = _lowered(model, "bfloat16", Policy())
    off = _lowered(model, "bfloat16", Policy(elementwise_fp32=False))
    assert _kernel_outputs(on) == _kernel_outputs(off)
    assert "bfloat16" in _kernel_outputs(on)[1]
    if name == "vit":
        wide, narrow = _gelu_kernel(on), _gelu_kernel(off)
        buffers = {line.split(" = ")[0].strip(): line for line in wide.splitlines() if "sblock_alloc_buffer" in line}
        # inside the kernel: the matmul (on TVM's kernel) accumulates in float32, as every value of the chain ...
        assert '"' not in buffers.pop("matmul_intermediate") and len(buffers) >= 6  # no dtype: float32
        assert 'matmul_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(16), T.int64(64)), "bfloat16")' \
            in narrow  # per-operator rounding (the policy's switch off): it summed in bf16
        assert all('"' not in line or '"float32"' in line for line in buffers.values()), buffers
        assert "T.erf(T_divide_intermediate" in wide
        # ... and its result leaves in bf16; with per-operator rounding every intermediate was bf16
        head = [line for line in wide.splitlines() if line.startswith("def main")][0]
        assert head.endswith('(T.int64(1), T.int64(16), T.int64(64)), "bfloat16")):')
        assert 'T_divide_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(16), T.int64(64)), "bfloat16")' in narrow

def test_on_a_gpu_target_the_gelu_epilogue_is_float32_math_with_one_rounding():
    """CUDA keeps bf16 arithmetic (TVM legalizes bf16 to fp32 inside a kernel only on targets without
    it, e.g. llvm): the scheduled CUDA kernel of the GELU chain casts up, computes, and casts down once."""
    import re

    model = zoo.get_model("vit")
    target = {"kind": "cuda", "arch": "sm_90"}

    def store(policy):
        result = _lowered(model, "bfloat16", policy, target)
        func = result.lowered[[gv for gv in result.lowered.functions if "erf" in gv.name_hint][0]]
        t = result.tvm_target
        with t:
            from tvm.s_tir.pipeline import default_s_tir_pipeline

            text = default_s_tir_pipeline()[0](tvm.IRModule({"main": func.with_attr("target", t)})).script()
        return [line for line in text.splitlines() if "T.erf(" in line][0]

    wide, narrow = store(Policy()), store(Policy(elementwise_fp32=False))
    assert re.search(r'= T\.Cast\("bfloat16", .*T\.erf\(.*T\.float32\(', wide)  # fp32 math, one rounding
    assert "T.Cast" not in narrow and "T.bfloat16(0.5)" in narrow  # bf16 arithmetic, rounding every op


def _mean_error(model, dtype, policy, seeds=(0, 1, 2, 3)):
    from tvm_nimble.compiler import stages
    from tvm_nimble.compiler.accuracy import rel_l2
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm

    fp32 = import_model(model)
    opts = BuildOptions.create("llvm", max_streams=None, kernels="tvm")
    result = stages.build_fixed(to_precision(fp32, dtype, policy), opts)
    ref, run = StockVM(build_stock_vm(fp32, opts.target), tvm.cpu(), []), NimbleExecutor(result)
    errors = []
    for seed in seeds:
        x = random_inputs(result.plan, seed)
        errors.append(rel_l2([run(*x)[0].numpy()], [ref.main(*[tvm.runtime.tensor(a) for a in x]).numpy()]))
    return float(np.mean(errors))


@pytest.mark.parametrize("name", ["inception", "vit"])
def test_rounding_once_per_chain_is_closer_to_fp32_than_rounding_every_operator(name):
    """fp16 on llvm rounds every operator's result (LLVM's half arithmetic); bf16 on llvm cannot show the
    difference (TVM legalizes bf16 to fp32 inside each kernel there, both modes give identical outputs),
    on the GPU it does (the test above). The chains in fp32 lower fp16's error by 5-15% here, and both
    stay within the bound."""
    model = zoo.get_model(name)
    once = _mean_error(model, "float16", Policy())
    every = _mean_error(model, "float16", Policy(elementwise_fp32=False))
    assert once < 0.95 * every, (once, every)
    assert every < BOUND["fp16"] and once < BOUND["fp16"]


def test_the_policy_reads_as_fields_elementwise_fp32_and_follow_in_fp16():
    p = Policy()
    assert p.elementwise_fp32 == ("float16", "bfloat16") and "erf" in p.elementwise and "add" in p.elementwise
    assert Policy(elementwise_fp32=False).elementwise_fp32 == () and Policy(elementwise_fp32="bf16").elementwise_fp32 == ("bfloat16",)
    assert Policy().with_fp32("matmul").elementwise_fp32 == p.elementwise_fp32  # overriding keeps the other fields
    with pytest.raises(ValueError, match="elementwise_fp32"):
        Policy(elementwise_fp32="float32")
    # layer_norm follows its input in fp16 (topi keeps its statistics in fp32), fp32 math in bf16
    assert p.rule("relax.nn.layer_norm", "float16") == "follow" and p.rule("relax.nn.layer_norm", "bfloat16") == "fp32_math"
    mod = import_model(zoo.get_model("vit"))
    assert _dtypes_by_op(to_precision(mod, "float16"))["relax.nn.layer_norm"] == {"float16"}
    assert _dtypes_by_op(to_precision(mod, "float16", Policy(follow_in_fp16=())))["relax.nn.layer_norm"] == {"float32"}
    assert "element-wise chains in float32" in p.describe() and "element-wise" not in Policy(elementwise_fp32=False).describe()


def test_vendor_chains_of_a_bf16_build_still_offload_and_the_chain_after_them_computes_in_fp32():
    """The offload matches the graph ``to_precision`` leaves (the fp32 chains are made by the lowering's
    first pass, after it): a bf16 conv + bias + ReLU goes to cuDNN and a matmul + bias to cuBLASLt (our GEMV at
    one row, as inception's classifier) as before, and the GELU after the cuBLASLt call is then one TVM kernel in
    fp32 with bf16 in and out."""
    from tvm_nimble.compiler import stages
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.relay_passes.providers.chains import ACT_RELU
    from tvm_nimble.relay_passes.vendor_offload import CONV2D, MATMUL, OffloadReport, OffloadToVendor

    def offload(name, policy):
        report = OffloadReport()
        mod = OffloadToVendor(report=report)(to_precision(import_model(zoo.get_model(name)), "bfloat16", policy))
        return mod, report

    for name in ("inception", "vit"):
        (mod, on), (_, off) = offload(name, Policy()), offload(name, Policy(elementwise_fp32=False))
        linears = sum(n for k, n in on.offloaded.items() if k == MATMUL or k.startswith(vendor_abi.GEMV.prefix))
        assert on.offloaded == off.offloaded and on.offloaded.get(CONV2D, 0) > 0 and linears > 0
        calls = [b.value for block in mod["main"].body.blocks for b in block.bindings
                 if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_dps_packed"]
        assert calls and all(str(c.args[1].fields[0].ty.dtype) == "bfloat16" for c in calls)
        if name == "inception":  # conv + bias + relu in one cuDNN call, in bf16
            convs = [c for c in calls if str(c.args[0].global_symbol) == CONV2D]
            assert convs and all(int(c.args[1].fields[-1].values[7]) == ACT_RELU for c in convs)
    opts = BuildOptions.create({"kind": "cuda", "arch": "sm_90"}, max_streams=None, kernels="vendor", compile_kernels=False)
    lowered = stages.lower(mod, opts.target)
    gelu = [gv for gv in lowered.functions if "erf" in gv.name_hint]
    assert len(gelu) == 1 and "matmul" not in gelu[0].name_hint  # the matmul + bias went to cuBLASLt
    text = lowered[gelu[0]].script()
    head = [line for line in text.splitlines() if line.startswith("def main")][0]
    assert head.count('"bfloat16"') == 2 and '"float32"' not in head  # bf16 in, bf16 out
    assert "T.float32(0.5)" in text and "T.bfloat16(0.5)" not in text  # GELU's constants: fp32 math


def _padded_cell(seed: int = 0):
    """NASNet's reduction-cell pattern as torch exports it, after a convolution (so that the reduced dtype reaches
    it): ReLU, ZeroPad2d((1, 0, 1, 0)) (an ONNX Pad, which TVM's importer writes as an opaque TE call with float32
    buffers), a strided depthwise + pointwise convolution, then x[:, :, 1:, 1:]. The padded tensor is an output too,
    so the importer's pad fold (frontend/fold_pads.py) leaves the Pad an opaque TE call."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    c = 8
    inits = [numpy_helper.from_array(rng.standard_normal((c, c, 1, 1)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.standard_normal((c, 1, 3, 3)).astype(np.float32), "wd"),
             numpy_helper.from_array(rng.standard_normal((c, c, 1, 1)).astype(np.float32), "wp"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 0, 0], np.int64), "pads"),
             numpy_helper.from_array(np.array([1, 1], np.int64), "starts"),
             numpy_helper.from_array(np.array([1 << 30, 1 << 30], np.int64), "ends"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "axes")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"]), helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node("Pad", ["r", "pads"], ["p"]),
             helper.make_node("Conv", ["p", "wd"], ["d"], group=c, strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "wp"], ["q"]),
             helper.make_node("Slice", ["q", "starts", "ends", "axes"], ["y"])]
    graph = helper.make_graph(nodes, "padded_cell",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8]),
                               helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, c, 17, 17])], inits)
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_an_opaque_te_call_keeps_the_dtypes_its_function_was_made_for(precision):
    """TVM's ONNX importer writes Pad as a TE call whose PrimFunc takes float32; cast to the reduced dtype, its input
    made FuseTIR fail on nasnetalarge in half precision. Its input stays float32 now."""
    model = _padded_cell()
    half = to_precision(import_model(model), {"fp16": "float16", "bf16": "bfloat16"}[precision])
    te_inputs = [f for block in half["main"].body.blocks for b in block.bindings
                 if isinstance(b.value, relax.Call) and b.value.op.same_as(tvm.ir.Op.get("relax.call_tir"))
                 for f in b.value.args[1].fields]
    assert te_inputs and all(str(f.ty.dtype) == "float32" for f in te_inputs)
    # lowered for a GPU (no kernels compiled: no GPU here), where FuseTIR failed before
    build(model, {"kind": "cuda", "arch": "sm_90"}, precision=precision, kernels="tvm", compile_kernels=False,
          max_streams=None, timing_cache="off")
    x = zoo.random_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, x)[0]
    assert _rel(ReferenceEvaluator(model).run(None, zoo.random_inputs(model, seed=1))[0], ref) > 0.5
    out = NimbleExecutor(build(model, "llvm", precision=precision, max_streams=None, timing_cache="off"))(*x.values())
    assert _rel(out[0].numpy(), ref) < BOUND[precision]


def _astype_reads(mod):
    """For every cast in ``main``: the op that computes what it reads (None for a parameter)."""
    values = {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}
    return [getattr(values.get(b.value.args[0]), "op", None) for block in mod["main"].body.blocks
            for b in block.bindings if isinstance(b.value, relax.Call) and b.value.op.name == "relax.astype"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_casts_move_before_data_movement_and_change_no_value(precision):
    """The fp16 classifier's input: mean (fp32), the permutation back from channels-last, the reshape, the cast to
    the GEMM's dtype. ``hoist_casts`` puts the cast on the mean; stock TVM runs both modules to the same bits."""
    from tvm_nimble.compiler import stages
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.relay_passes.layout import to_nhwc
    from tvm_nimble.relay_passes.precision import hoist_casts

    model = zoo.get_model("inception")
    opts = BuildOptions.create("llvm", precision=precision, layout="nhwc", timing_cache="off")
    before = to_nhwc(stages.apply_precision(import_model(model), opts))
    after = hoist_casts(before)
    moves = {"relax.permute_dims", "relax.reshape"}
    assert any(op is not None and op.name in moves for op in _astype_reads(before))
    assert not any(op is not None and op.name in moves for op in _astype_reads(after))
    x = list(zoo.random_inputs(model, seed=0).values())
    outs = []
    for mod in (before, after):
        vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
        outs.append(vm["main"](*[tvm.runtime.tensor(a) for a in x]).numpy())
    assert np.array_equal(outs[0], outs[1]) and np.abs(outs[0]).max() > 0


def test_a_half_precision_classifier_reads_the_mean_kernel_directly():
    """On a GPU target (vendor kernels, nothing compiled): the classifier's GEMV (one row) reads, through views,
    what the mean's kernel wrote (the cast fused into it), not a permute/reshape/cast kernel of its own."""
    result = build(zoo.get_model("inception"), {"kind": "cuda", "arch": "sm_90"}, precision="fp16", kernels="vendor",
                   compile_kernels=False, max_streams=1)
    plan = result.plan

    def root(t):
        while plan.tensors[t].view_of is not None:
            t = plan.tensors[t].view_of
        return t

    writer = {root(w): l.kernel for l in plan.launches for w in l.writes}
    gemm = [l for l in plan.launches if l.kernel.startswith(vendor_abi.GEMV.prefix)][-1]
    assert "mean" in writer[root(gemm.args[0])]


def _overflowing_model():
    """y = sum(1e5 * (x @ W)): finite in float32 (|y| ~ 1e6), but x @ W computes in fp16 and 1e5 times it
    overflows fp16's 65504, so the fp16 build's sum is infinite or NaN."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((16, 16)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "scale"], ["s"]),
         helper.make_node("ReduceSum", ["s"], ["y"], keepdims=0)],
        "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1e5, "float32"), "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("max_error", [None, 1.0])
def test_a_build_whose_outputs_overflow_where_float32s_are_finite_fails_in_one_line(max_error):
    model = _overflowing_model()
    x = zoo.random_inputs(model, seed=0)
    assert np.all(np.isfinite(ReferenceEvaluator(model).run(None, x)[0]))  # float32 is finite
    with pytest.raises(NimbleError, match=r"^the fp16 build's outputs hold \d+ NaN or infinite values where "
                                          r"float32's are finite") as raised:
        build(model, "llvm", precision="fp16", max_error=max_error, timing_cache="off")
    assert "\n" not in str(raised.value)
    # bf16 keeps float32's exponent: no overflow, and the build passes
    assert np.isfinite(build(model, "llvm", precision="bf16", timing_cache="off").report.accuracy.rel_l2)


@pytest.mark.parametrize("to", ["float16", "bfloat16"])
def test_a_constant_narrows_as_each_element_would(to):
    """``narrowed`` against an element-by-element reference: float32's extremes (the exporters' mask values)
    saturate to the dtype's largest finite value, NaN and infinities stay, other values round (overflowing to
    infinity when over the range), whether or not the array also holds NaN."""
    import ml_dtypes

    from tvm_nimble.relay_passes.precision import SENTINEL, narrowed

    dtype = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[to]
    top = float(ml_dtypes.finfo(dtype).max)
    f32 = np.finfo(np.float32)
    rng = np.random.default_rng(3)
    for planted in ([], [np.nan], [f32.min], [f32.max, np.nan], [np.inf, -np.inf, 7e4, -3e38]):
        value = rng.standard_normal(64).astype(np.float32)
        value[rng.choice(64, len(planted), replace=False)] = planted
        want = [np.sign(v) * top if np.isfinite(v) and abs(v) >= SENTINEL else v for v in value.tolist()]
        with np.errstate(over="ignore"):
            want = np.array(want, np.float32).astype(dtype)
            got = narrowed(value, to)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("to", ["float16", "bfloat16"])
def test_a_large_constant_narrows_in_chunks_on_threads_as_in_one_piece(to, monkeypatch):
    """A tensor of several chunks (a decoder's weights: on ``TVM_NIMBLE_JOBS`` threads), transposed (not contiguous),
    with float32's extreme planted in the last chunk and a NaN in the first: the same bits as one cast of the whole
    array with the extreme saturated."""
    import ml_dtypes

    from tvm_nimble import env
    from tvm_nimble.relay_passes import precision

    monkeypatch.setattr(precision, "CHUNK_ELEMENTS", 1000)
    monkeypatch.setenv(env.JOBS, "4")
    dtype = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[to]
    value = np.random.default_rng(5).standard_normal((80, 100)).astype(np.float32).T  # 8,000 elements: 4 chunks
    value[0, 0], value[-1, -1] = np.nan, np.finfo(np.float32).min
    want = np.where(np.isfinite(value) & (np.abs(value) >= precision.SENTINEL),
                    np.sign(value) * float(ml_dtypes.finfo(dtype).max), value).astype(dtype)
    got = precision.narrowed(value, to)
    assert got.shape == value.shape and got.dtype == dtype
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(precision.narrowed(value[:, :5], to).view(np.uint16), want[:, :5].view(np.uint16))
    scalar = precision.narrowed(np.array(0.5, np.float32), to)  # a scalar stays a scalar (inlined in kernels)
    assert scalar.shape == () and scalar == 0.5
