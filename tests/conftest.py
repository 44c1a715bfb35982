"""Shared fixtures: zoo models built once per test session (CPU, llvm)."""
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

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
