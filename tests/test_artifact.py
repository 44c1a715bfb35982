"""The deployable artifact: round trip, checksums, versions, and CUDA kernels as a fatbin."""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

import tvm_nimble
from tvm_nimble import NimbleExecutor, load
from tvm_nimble.runtime.artifact import ArtifactError
from tvm_nimble.runtime.device import DeviceError


@pytest.fixture
def artifact(inception_built, tmp_path):
    path = str(tmp_path / "model.nimble")
    inception_built.module.export(path)
    return path


def test_round_trip_matches_an_independent_reference(inception_built, artifact):
    """The loaded artifact against the ONNX reference evaluator and TVM's stock Relax VM (not itself)."""
    import tvm

    from tvm_nimble.compiler.frontend import from_onnx
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm
    from tvm_nimble.compiler.target import resolve_target

    b = inception_built
    assert sorted(os.listdir(artifact)) == ["kernels.so", "manifest.json", "params.npz", "plan.json"]
    loaded = load(artifact)
    assert loaded.plan == b.module.plan
    with NimbleExecutor(artifact) as ex:
        again = [o.numpy() for o in ex(*b.inputs.values())]
    stock = StockVM(build_stock_vm(from_onnx(b.model), resolve_target("llvm")), tvm.cpu(),
                    list(b.inputs.values())).outputs()
    assert len(again) == len(b.reference) == len(stock)
    for got, onnx_ref, vm_ref in zip(again, b.reference, stock):
        assert np.abs(onnx_ref).max() > 1e-3  # a non-degenerate output
        np.testing.assert_allclose(got, onnx_ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got, vm_ref, rtol=1e-5, atol=1e-5)


def _one_line(excinfo) -> str:
    assert "\n" not in str(excinfo.value), str(excinfo.value)
    return str(excinfo.value)


def test_an_onnx_file_is_named_as_such(inception_built, tmp_path):
    from tvm_nimble import zoo

    path = zoo.save(inception_built.model, tmp_path / "model.onnx")
    for call in (load, NimbleExecutor):
        with pytest.raises(ArtifactError, match=r"is an ONNX model, not a built artifact: build it first with "
                                                r"tvm_nimble.build.*tvm-nimble compile") as e:
            call(str(path))
        _one_line(e)
    (tmp_path / "lib.so").write_bytes(b"\x7fELF")
    with pytest.raises(ArtifactError, match="shared library.*tvm.runtime.load_module"):
        load(str(tmp_path / "lib.so"))


def test_tvm_version_mismatch_warns_with_both_versions(artifact):
    import tvm

    from tvm_nimble.runtime.artifact import TVMVersionWarning

    mpath = os.path.join(artifact, "manifest.json")
    manifest = json.load(open(mpath))
    assert manifest["tvm_version"] == tvm.__version__
    manifest["tvm_version"] = "0.19.0"
    json.dump(manifest, open(mpath, "w"))
    with pytest.warns(TVMVersionWarning, match=rf"built with TVM 0\.19\.0, this process runs TVM {tvm.__version__}.*rebuild"):
        load(artifact)


def test_plan_naming_a_kernel_the_library_lacks(artifact):
    from tvm_nimble.runtime.module import KernelNotFoundError

    ppath = os.path.join(artifact, "plan.json")
    plan = json.load(open(ppath))
    plan["launches"][2]["kernel"] = "fused_from_another_build"
    text = json.dumps(plan)
    open(ppath, "w").write(text)
    mpath = os.path.join(artifact, "manifest.json")
    manifest = json.load(open(mpath))
    manifest["sha256"]["plan.json"] = hashlib.sha256(text.encode()).hexdigest()
    json.dump(manifest, open(mpath, "w"))
    with pytest.raises(KernelNotFoundError, match="launch 2 of the plan calls kernel 'fused_from_another_build', "
                                                  "which the kernel library does not have.*inconsistent.*rebuild") as e:
        load(artifact)
    _one_line(e)


@pytest.mark.parametrize("victim", ["plan.json", "params.npz", "kernels.so"])
def test_corruption_is_detected_by_checksum(artifact, victim):
    with open(os.path.join(artifact, victim), "r+b") as f:
        f.seek(20)
        f.write(b"\x00garbage\x00")
    with pytest.raises(ArtifactError, match=f"{victim} does not match its checksum"):
        load(artifact)


def test_missing_file_and_missing_artifact(artifact, tmp_path):
    os.remove(os.path.join(artifact, "params.npz"))
    with pytest.raises(ArtifactError, match="params.npz is missing"):
        load(artifact)
    with pytest.raises(ArtifactError, match="artifact not found"):
        load(str(tmp_path / "nope"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(ArtifactError, match="no manifest.json"):
        load(str(tmp_path / "plain"))


def test_format_version_mismatch(artifact):
    mpath = os.path.join(artifact, "manifest.json")
    manifest = json.load(open(mpath))
    manifest["version"] = 42
    json.dump(manifest, open(mpath, "w"))
    with pytest.raises(ArtifactError, match="version 42.*rebuild"):
        load(artifact)


def test_export_refuses_to_clobber_a_non_artifact(inception_built, tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    with pytest.raises(ArtifactError, match="not a tvm-nimble artifact"):
        inception_built.module.export(str(tmp_path / "precious"))
    assert (tmp_path / "precious" / "notes.txt").exists()


def gpu_arch():
    """``sm_XY`` of the visible GPU, or None (no driver, no GPU, no TVM CUDA runtime)."""
    import tvm

    from tvm_nimble.runtime.device import ensure_cuda_runtime

    try:
        ensure_cuda_runtime()
        dev = tvm.cuda(0)
        return f"sm_{dev.compute_version.replace('.', '')}" if dev.exist else None
    except Exception:
        return None


NO_NVCC = pytest.mark.skipif(not shutil.which("nvcc") and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                             reason="nvcc is not installed: CUDA artifacts are compiled to a fatbin at build time")


@NO_NVCC
def test_cuda_artifact_holds_a_fatbin_and_runs_only_where_it_fits(tmp_path):
    """On a machine without a GPU: a clear error naming the GPU. With a GPU of the built arch: it runs and
    matches the ONNX reference. With a GPU of another arch: an error naming both archs."""
    from onnx.reference import ReferenceEvaluator

    from tvm_nimble import zoo

    model = zoo.get_model("inception", blocks=1)
    module = tvm_nimble.build(model, {"kind": "cuda", "arch": "sm_90"})
    path = str(tmp_path / "cuda.nimble")
    module.export(path)
    blob = open(os.path.join(path, "kernels.so"), "rb").read()
    assert b"__global__" not in blob  # no CUDA source left to JIT-compile at load time
    assert b"\x50\xed\x55\xba" in blob  # fatbin magic
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    assert manifest["target"] == {"kind": "cuda", "arch": "sm_90"}
    arch = gpu_arch()
    if arch is None:
        with pytest.raises(DeviceError, match="NVIDIA") as e:
            NimbleExecutor(path)
        _one_line(e)
    elif arch != "sm_90":
        with pytest.raises(DeviceError, match=f"built for sm_90 but this GPU is {arch}"):
            NimbleExecutor(path)
    else:
        inputs = zoo.random_inputs(model, seed=0)
        want = ReferenceEvaluator(model).run(None, inputs)
        with NimbleExecutor(path) as ex:
            got = [o.numpy() for o in ex(*inputs.values())]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3)


FALLBACK_PROGRAM = """
import tvm, tvm_nimble
from tvm_nimble import zoo
from tvm_nimble.compiler.frontend import from_onnx
ex = tvm.compile(from_onnx(zoo.get_model("inception", blocks=1)), tvm.target.Target("nimble/h100"),
                 relax_pipeline="nimble")
try:
    tvm_nimble.NimbleExecutor(ex)
except tvm_nimble.NimbleError as err:
    print("MESSAGE:", err)
"""


@NO_NVCC
def test_cuda_executable_without_a_cuda_runtime_says_so(tmp_path):
    """tvm.compile(..., relax_pipeline='nimble') for CUDA in a process whose TVM cannot run CUDA kernels
    (here: TVM's compiler without its CUDA runtime, which leaves a CUDA fallback module): the error says
    that and how to deploy, not that the executable lacks the Nimble plan."""
    import subprocess
    import sys

    if gpu_arch() is not None:
        pytest.skip("a GPU is visible: the executable may run here")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", FALLBACK_PROGRAM], capture_output=True, text=True, cwd=root,
                       timeout=600)
    lines = [line for line in r.stdout.splitlines() if line.startswith("MESSAGE:")]
    assert len(lines) == 1, r.stdout[-2000:] + r.stderr[-2000:]
    msg = lines[0]
    assert "not built with relax_pipeline" not in msg
    assert "NVIDIA GPU" in msg and ("CUDA kernels that this process cannot load" in msg or "none is visible" in msg)
    assert "export_library" in msg or "none is visible" in msg


def test_a_bf16_artifact_loads_back_and_runs_as_built(tmp_path):
    """np.savez stores bfloat16 constants as raw bytes ('|V2'); loading views them as the plan's bfloat16
    again, so a fresh executor of the exported artifact gives exactly the in-memory build's outputs."""
    from tvm_nimble import zoo

    model = zoo.get_model("inception", blocks=1)
    module = tvm_nimble.build(model, "llvm", precision="bf16")
    assert any(module.plan.tensors[c].dtype == "bfloat16" for c in module.plan.constants)
    inputs = zoo.random_inputs(model, seed=0)
    with NimbleExecutor(module) as ex:
        want = [o.numpy() for o in ex(**inputs)]
    path = str(tmp_path / "bf16.nimble")
    module.export(path)
    with NimbleExecutor(path) as ex:
        got = [o.numpy() for o in ex(**inputs)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert np.abs(want[0]).max() > 1e-3  # a non-degenerate output
