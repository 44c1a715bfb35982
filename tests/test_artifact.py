"""The deployable artifact: round trip, checksums, versions, and CUDA kernels as a fatbin."""
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


def test_round_trip_gives_identical_outputs(inception_built, artifact):
    b = inception_built
    assert sorted(os.listdir(artifact)) == ["kernels.so", "manifest.json", "params.npz", "plan.json"]
    loaded = load(artifact)
    assert loaded.plan == b.module.plan
    direct = NimbleExecutor(b.module)(*b.inputs.values())[0].numpy()
    again = NimbleExecutor(artifact)(*b.inputs.values())[0].numpy()
    np.testing.assert_array_equal(direct, again)


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


@pytest.mark.skipif(not shutil.which("nvcc") and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                    reason="nvcc is not installed: CUDA artifacts are compiled to a fatbin at build time")
def test_cuda_artifact_holds_a_fatbin_and_needs_a_gpu(tmp_path):
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
    with pytest.raises(DeviceError, match="NVIDIA"):
        NimbleExecutor(path)
