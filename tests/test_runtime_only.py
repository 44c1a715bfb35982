"""An artifact loads and runs with the TVM *runtime* alone (no libtvm_compiler), as on a deploy box."""
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import tvm
import tvm_ffi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = shutil.ignore_patterns("libtvm_compiler.so", "3rdparty", "src", "include", "web", "__pycache__")

PROGRAM = """
import sys, numpy as np, tvm
try:
    from tvm import relax
    relax.transform.LegalizeOps
    sys.exit("the TVM compiler is importable: not a runtime-only install")
except (ImportError, AttributeError, OSError):
    pass
import tvm_nimble
ex = tvm_nimble.NimbleExecutor(sys.argv[1])
np.save(sys.argv[3], ex(np.load(sys.argv[2]))[0].numpy())
"""


def test_artifact_runs_with_runtime_only_tvm(nasnet_built, tmp_path):
    b = nasnet_built
    art = str(tmp_path / "model.nimble")
    b.module.export(art)
    site = tmp_path / "site"
    shutil.copytree(os.path.dirname(tvm.__file__), site / "tvm", ignore=SKIP)
    shutil.copytree(os.path.dirname(tvm_ffi.__file__), site / "tvm_ffi", ignore=SKIP)
    assert not (site / "tvm" / "lib" / "libtvm_compiler.so").exists()
    x = next(iter(b.inputs.values()))
    np.save(tmp_path / "x.npy", x)
    # the runtime-only copy comes first on the path; numpy etc. from this environment
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), ROOT, sysconfig.get_paths()["purelib"]]))
    r = subprocess.run([sys.executable, "-S", "-c", PROGRAM, art, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), b.reference[0], rtol=1e-4, atol=1e-4)
