"""The run's sandbox (its caches in a folder of its own, nothing written under $HOME: ``run_sandbox``) and
shared fixtures: zoo models built once per test session (CPU, llvm; once per worker under pytest-xdist)."""
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from run_sandbox import HomeListing, RunCaches, nvcc_summary

_RUN = pytest.StashKey[dict]()


def pytest_addoption(parser):
    parser.addoption("--nimble-cache-dir", default=None, metavar="DIR",
                     help="keep the run's caches (compiled vendor units, kernels, timings) in DIR, for later runs "
                          "(default: a temporary folder of this run's, removed at its end)")


def pytest_configure(config):
    """Before any test module is imported: every cache into the run's folder, and $HOME listed. A pytest-xdist
    worker inherits the variables its controller set (one folder for the run) and checks nothing itself."""
    if hasattr(config, "workerinput"):
        return
    caches = RunCaches.create(config.getoption("--nimble-cache-dir"))
    os.environ.update(caches.environment())
    # CPU kernels built without LLVM's optimizations: they compile about twice as fast, and the suite checks their
    # results, not their speed (a developer can set another level; tvm_nimble/env.py)
    os.environ.setdefault("TVM_NIMBLE_LLVM_OPT_LEVEL", "0")
    # likewise the vendor extension's units where no GPU can run them (a third of the time to compile them), at
    # full optimization where one is (tests/gpu runs its kernels)
    if not _has_gpu():
        os.environ.setdefault("TVM_NIMBLE_VENDOR_OPT_LEVEL", "0")
    home = os.path.expanduser("~")
    # $OUT: where a GPU-machine run (scripts/gpu_session.sh) logs what the run is doing, beside the tests
    skip = [str(config.rootpath), tempfile.gettempdir(), caches.folder] + ([os.environ["OUT"]] if os.environ.get("OUT") else [])
    config.stash[_RUN] = {"caches": caches, "skip": skip, "started": time.time(),
                          "home": HomeListing.take(home, skip), "wrote": []}


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    """The run fails if it wrote anything under $HOME."""
    run = session.config.stash.get(_RUN, None)
    if run is None:
        return
    run["wrote"] = run["home"].changes(HomeListing.take(run["home"].root, run["skip"]))
    if run["wrote"]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    run = config.stash.get(_RUN, None)
    if run is None:
        return
    terminalreporter.write_line(nvcc_summary(run["caches"].cache_root, run["started"]))
    if run["wrote"]:
        terminalreporter.write_line(f"FAILED: the run wrote under $HOME ({len(run['wrote'])} entries; tests must "
                                    "write under tmp_path, caches go to the run's folder):", red=True)
        for line in run["wrote"][:20]:
            terminalreporter.write_line(f"  {line}", red=True)


def pytest_unconfigure(config):
    run = config.stash.get(_RUN, None)
    if run is not None:
        run["caches"].remove()

ZOO_NAMES = ["inception", "nasnet", "resnet", "mobilenet", "random_dag"]


class Built:
    def __init__(self, name):
        from tvm_nimble import build, zoo

        self.name = name
        self.model = zoo.get_model(name)
        self.inputs = zoo.random_inputs(self.model, seed=0)
        self.reference = [np.asarray(r) for r in ReferenceEvaluator(self.model).run(None, self.inputs)]
        self.module = build(self.model, "llvm")


_cache = {}


def built(name):
    if name not in _cache:
        _cache[name] = Built(name)
    return _cache[name]


@pytest.fixture(params=ZOO_NAMES)
def zoo_built(request):
    return built(request.param)


@pytest.fixture
def inception_built():
    return built("inception")


@pytest.fixture
def nasnet_built():
    return built("nasnet")


@pytest.fixture
def vendor_reference():
    """The vendor functions' numpy contract under their global names, for this test only."""
    from vendor_reference import reference_functions

    with reference_functions():
        yield
