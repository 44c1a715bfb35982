"""Stage 1 on real models: the annotated IR shows the schedule and survives the later passes."""
import re

import pytest
import tvm

from tvm_nimble.compiler.target import resolve_target
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.relay_passes.annotate import ATTR_NUM_STREAMS, AnnotateStreams
from tvm_nimble.relay_passes.lowered_ir import read_lowered_function
from tvm_nimble.compiler.stages import lower
from tvm_nimble.relay_passes.pipeline import backend_for, kernel_passes
from tvm_nimble.relay_passes.stream_assignment import assign_streams

LLVM = resolve_target("llvm")


def lower_and_annotate(mod, target, max_streams=None):
    return AnnotateStreams(max_streams)(lower(mod, target))


def lowered(model):
    with LLVM:
        return tvm.transform.Sequential(kernel_passes(LLVM))(from_onnx(model))


def test_every_zoo_model_is_annotated_readably(zoo_built):
    mod = lower_and_annotate(from_onnx(zoo_built.model), LLVM)
    text = mod["main"].script()
    program = read_lowered_function(mod)
    # one set_stream marker per kernel, one record per event, one wait per sync
    assert text.count('"nimble.set_stream"') == len(program.kernels)
    assert text.count('"nimble.wait_event"') == sum(len(k.waits) for k in program.kernels)
    assert text.count('"nimble.record_event"') == sum(len(k.records) for k in program.kernels)
    assert int(mod["main"].attrs[ATTR_NUM_STREAMS]) == len({k.stream for k in program.kernels})


def test_annotation_matches_the_algorithm_on_the_kernel_dag(zoo_built):
    base = lowered(zoo_built.model)
    program = read_lowered_function(base)
    expected = assign_streams(len(program.kernels), program.dependency_edges())
    annotated = read_lowered_function(AnnotateStreams()(base))
    by_func_order = [k.stream for k in annotated.kernels]
    assert by_func_order == [expected.stream_of[v] for v in expected.order]
    assert sum(len(k.waits) for k in annotated.kernels) == len(expected.syncs)


def test_views_and_reshapes_are_not_stream_nodes(inception_built):
    program = read_lowered_function(lowered(inception_built.model))
    assert all(v.kind != "view" or v.base is not None for v in program.values)
    for k in program.kernels:
        assert not k.func.startswith("relax.")


def test_annotation_survives_the_remaining_tvm_passes(nasnet_built):
    mod = lower_and_annotate(from_onnx(nasnet_built.model), LLVM)
    before = read_lowered_function(mod)
    with LLVM:
        finalized = tvm.transform.Sequential(list(backend_for(LLVM).finalize_passes(LLVM)))(mod)
    text = finalized["main"].script()
    # markers are kept, in the same order relative to the kernels
    markers = [m for line in text.splitlines()
               for m in re.findall(r'"(nimble\.(?:set_stream|wait_event|record_event))"', line)]
    expected = []
    for k in before.kernels:
        expected += ["nimble.set_stream"] + ["nimble.wait_event"] * len(k.waits) + ["nimble.record_event"] * len(k.records)
    assert markers == expected
    assert int(finalized["main"].attrs[ATTR_NUM_STREAMS]) == int(mod["main"].attrs[ATTR_NUM_STREAMS])


def test_max_streams_reaches_the_ir(nasnet_built):
    mod = lower_and_annotate(from_onnx(nasnet_built.model), LLVM, max_streams=2)
    program = read_lowered_function(mod)
    assert len({k.stream for k in program.kernels}) <= 2
    single = read_lowered_function(lower_and_annotate(from_onnx(nasnet_built.model), LLVM, max_streams=1))
    assert {k.stream for k in single.kernels} == {0} and all(not k.waits for k in single.kernels)


def test_annotating_twice_is_refused(inception_built):
    mod = lower_and_annotate(from_onnx(inception_built.model), LLVM)
    with pytest.raises(Exception, match="already stream-annotated"):
        AnnotateStreams()(mod)
