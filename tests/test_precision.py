"""Precision as a build option: fp16 and bf16 builds on llvm against the ONNX reference evaluator and
the fp32 build, the mixed-precision policy read from the built IR, the accuracy report and its guard."""
import subprocess
import sys

import numpy as np
import pytest
import tvm
from onnx.reference import ReferenceEvaluator
from tvm import relax

from tvm_nimble import NimbleExecutor, build, zoo
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
    report = result.info["accuracy"]
    assert report["precision"] == precision and report["input_dependent"]
    assert 0 < report["rel_l2"] < BOUND[precision]


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
    assert result.info["accuracy"]["rel_l2"] is None
    with pytest.raises(NimbleError, match=r"^max_error needs the build's error measured"):
        build(model, {"kind": "cuda", "arch": "sm_90"}, precision="fp16", kernels="tvm", max_streams=None,
              compile_kernels=False, max_error=1e-2)


def test_the_command_line_takes_precision_names_and_refuses_others_in_one_line(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(zoo.get_model("inception", blocks=1, hw=8).SerializeToString())
    r = subprocess.run([sys.executable, "-m", "tvm_nimble.cli", "compile", str(path), "--target", "llvm",
                        "--precision", "bf16", "--max-streams", "1", "-o", str(tmp_path / "m.tar")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "accuracy (bf16): " in r.stdout and "relative L2 from float32" in r.stdout
    r = subprocess.run([sys.executable, "-m", "tvm_nimble.cli", "explain", str(path), "--target", "llvm",
                        "--precision", "int8"], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "tvm-nimble: error: precision must be one of fp32, tf32, fp16, bf16, got 'int8'"]
