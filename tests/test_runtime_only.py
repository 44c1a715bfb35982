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
source = sys.argv[1]
model = tvm.runtime.load_module(source) if source.endswith(".so") else source
ex = tvm_nimble.NimbleExecutor(model)
np.save(sys.argv[3], ex(np.load(sys.argv[2]))[0].numpy())
"""


def run_runtime_only(tmp_path, model_path: str, x: np.ndarray) -> np.ndarray:
    """Run ``model_path`` (artifact dir or .so) in a subprocess that has a TVM copy without the compiler."""
    site = tmp_path / "site"
    if not site.exists():
        shutil.copytree(os.path.dirname(tvm.__file__), site / "tvm", ignore=SKIP)
        shutil.copytree(os.path.dirname(tvm_ffi.__file__), site / "tvm_ffi", ignore=SKIP)
    assert not (site / "tvm" / "lib" / "libtvm_compiler.so").exists()
    np.save(tmp_path / "x.npy", x)
    # the runtime-only copy comes first on the path; numpy etc. from this environment
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), ROOT, sysconfig.get_paths()["purelib"]]))
    r = subprocess.run([sys.executable, "-S", "-c", PROGRAM, model_path, str(tmp_path / "x.npy"),
                        str(tmp_path / "y.npy")], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return np.load(tmp_path / "y.npy")


def test_artifact_runs_with_runtime_only_tvm(nasnet_built, tmp_path):
    b = nasnet_built
    art = str(tmp_path / "model.nimble")
    b.module.export(art)
    y = run_runtime_only(tmp_path, art, next(iter(b.inputs.values())))
    np.testing.assert_allclose(y, b.reference[0], rtol=1e-4, atol=1e-4)


def test_tvm_compiled_library_runs_with_runtime_only_tvm(nasnet_built, tmp_path):
    """The README's TVM way: tvm.compile(relax_pipeline="nimble") -> export_library -> load_module ->
    NimbleExecutor, where only the TVM runtime is installed; checked against the stock VM and ONNX."""
    from tvm_nimble.compiler.frontend import from_onnx
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm
    from tvm_nimble.compiler.target import resolve_target

    b = nasnet_built
    mod = from_onnx(b.model)
    so = str(tmp_path / "model.so")
    tvm.compile(mod, tvm.target.Target("llvm"), relax_pipeline="nimble").export_library(so)
    x = next(iter(b.inputs.values()))
    y = run_runtime_only(tmp_path, so, x)
    stock = StockVM(build_stock_vm(mod, resolve_target("llvm")), tvm.cpu(), [x]).outputs()[0]
    np.testing.assert_allclose(y, stock, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, b.reference[0], rtol=1e-4, atol=1e-4)
    assert np.abs(b.reference[0]).max() > 1e-3  # a non-degenerate output
