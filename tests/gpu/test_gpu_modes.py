"""Every GPU executor mode against the ONNX reference on the zoo nets; threads and the pool on the GPU."""
import threading

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

pytestmark = pytest.mark.gpu

ZOO = ["inception", "nasnet", "resnet", "mobilenet", "random_dag"]
MODES = ["cuda-graph", "single-stream", "streams"]
_built = {}


def _case(name, arch):
    if name not in _built:
        import tvm_nimble
        from tvm_nimble import zoo

        model = zoo.get_model(name)
        inputs = zoo.random_inputs(model, seed=0)
        reference = [np.asarray(r) for r in ReferenceEvaluator(model).run(None, inputs)]
        _built[name] = (tvm_nimble.build(model, {"kind": "cuda", "arch": arch}), inputs, reference)
    return _built[name]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ZOO)
def test_every_mode_matches_the_onnx_reference(gpu_arch, name, mode):
    from tvm_nimble import NimbleExecutor

    module, inputs, reference = _case(name, gpu_arch)
    with NimbleExecutor(module, mode=mode) as ex:
        for _ in range(3):  # repeated runs (graph replays) stay right
            out = [o.numpy() for o in ex(**inputs)]
            for o, r in zip(out, reference):
                np.testing.assert_allclose(o, r, rtol=1e-3, atol=1e-3)
        ex.set_input(0, next(iter(inputs.values())))
        ex.run()
        np.testing.assert_allclose(ex.get_output(0).numpy(), reference[0], rtol=1e-3, atol=1e-3)
        if mode != "single-stream":
            rows = ex.profile()
            assert len(rows) == len(module.plan.launches) and all(end >= start for *_, start, end in rows)


def test_threads_share_one_gpu_executor_and_a_pool(gpu_arch):
    from tvm_nimble import NimbleExecutor
    from tvm_nimble.runtime.pool import NimblePool

    module, inputs, _ = _case("inception", gpu_arch)
    base = next(iter(inputs.values()))
    xs = [(base * (1 + 0.25 * k)).astype(base.dtype) for k in range(8)]
    with NimbleExecutor(module) as ex:
        refs = [ex(x)[0].numpy() for x in xs]
        with NimblePool(module) as pool:
            assert pool.replicas >= 1
            for runner in (ex, pool):
                wrong = []

                def worker(k, runner=runner):
                    for _ in range(50):
                        if not np.allclose(runner(xs[k])[0].numpy(), refs[k], rtol=1e-5, atol=1e-6):
                            wrong.append(k)

                threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert wrong == []


def test_best_kernels_record_their_measurement(gpu_arch):
    """``auto`` on a GPU machine is ``best``: both kernels of each distinct chain were timed here, the faster
    one is in the plan, and the measurement is kept with the build (it goes into the artifact)."""
    module, _, _ = _case("inception", gpu_arch)
    assert module.report.options.kernels == "best"
    choice = module.report.kernel_choice.timings
    assert choice and all(c.vendor_ms > 0 and c.tvm_ms > 0 for c in choice)
    check = module.report.kernel_choice.check
    if check is not None and check.kept == "vendor":  # the whole model overruled the mix
        assert check.vendor_ms <= check.best_ms and all(c.kernel == "vendor" for c in choice)
    else:
        assert all(c.kernel == ("vendor" if c.vendor_ms <= c.tvm_ms else "tvm") for c in choice)
        assert (check is None) == all(c.kernel == "vendor" for c in choice)
    n_vendor = sum(c.count for c in choice if c.kernel == "vendor")
    assert sum(l.kernel.startswith("nimble.") for l in module.plan.launches) == n_vendor


def test_auto_streams_measure_every_candidate_and_keep_the_fastest(gpu_arch):
    """``max_streams='auto'`` (the default) replays every candidate cap on this GPU; the one-stream plan
    is kept unless another beats it by more than MIN_GAIN."""
    from tvm_nimble.compiler.stream_choice import MIN_GAIN

    module, _, _ = _case("nasnet", gpu_arch)
    record = module.report.stream_choice
    times = {(c.max_streams, c.order): c.measured_ms for c in record.candidates}
    assert len(times) >= 3 and all(t > 0 for t in times.values())
    assert any(order == "slack" for _, order in times)  # the cost-aware caps were measured too
    fastest = min(times, key=times.get)
    if times[fastest] <= times[(1, "program")] * (1 - MIN_GAIN):
        assert (record.chosen, record.chosen_order) == fastest
    else:
        assert record.chosen == 1 and module.plan.num_streams == 1


def test_prioritized_streams_keep_the_outputs(gpu_arch):
    """Critical-path streams at the device's greatest priority (a graph instantiated with per-node
    priorities): the same kernels, the same results."""
    from tvm_nimble import NimbleExecutor, build, zoo
    from tvm_nimble.compiler.stream_choice import prioritized

    model = zoo.get_model("inception")
    inputs = zoo.random_inputs(model, seed=0)
    reference = [np.asarray(r) for r in ReferenceEvaluator(model).run(None, inputs)]
    widest = build(model, {"kind": "cuda", "arch": gpu_arch}, max_streams=None, kernels="tvm")
    result = prioritized(widest, [1.0] * len(widest.plan.launches))
    assert 0 < sum(result.plan.stream_priority) < result.plan.num_streams
    for mode in ("cuda-graph", "streams"):
        with NimbleExecutor(result, mode=mode) as ex:
            for _ in range(3):
                np.testing.assert_allclose(ex(**inputs)[0].numpy(), reference[0], rtol=1e-3, atol=1e-3)


def test_training_steps_on_the_gpu_match_the_cpu(gpu_arch):
    """Five steps of the training benchmark's multi-branch net at batch 1 (cross-entropy labels: index
    inputs), on the GPU's multi-stream graph and on the CPU."""
    from tvm_nimble.bench.training import make_case, nimble_losses
    from tvm_nimble.compiler.build import build
    from tvm_nimble.compiler.training import NimbleTrainer

    case = make_case("cifar_inception", batch=1, steps=5, small=True)
    gpu = NimbleTrainer(build(case.step.mod, {"kind": "cuda", "arch": gpu_arch}, max_streams=None, kernels="tvm"),
                        case.step)
    cpu = NimbleTrainer(build(case.step.mod, "llvm"), case.step)
    np.testing.assert_allclose(nimble_losses(gpu, case), nimble_losses(cpu, case), rtol=1e-4)
    for name, value in cpu.params.items():
        np.testing.assert_allclose(gpu.params[name], value, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("precision,bound", [("fp16", 1e-2), ("bf16", 5e-2)])
def test_a_reduced_precision_build_on_the_gpu_reports_its_error(gpu_arch, precision, bound):
    """The accuracy report runs the build and stock TVM's fp32 module on this GPU; the ONNX reference
    evaluator checks the report's own claim."""
    import tvm_nimble
    from tvm_nimble import NimbleExecutor, zoo

    model = zoo.get_model("inception")
    result = tvm_nimble.build(model, {"kind": "cuda", "arch": gpu_arch}, precision=precision)
    report = result.report.accuracy
    assert report.input_dependent and 0 < report.rel_l2 < bound
    inputs = zoo.random_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, inputs)[0]
    out = NimbleExecutor(result)(**inputs)[0].numpy()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < bound


def test_tvm_kernels_are_programmatic_dependents_in_the_graph(gpu_arch, monkeypatch):
    """On sm_90+ the graph's edges into TVM's kernels are programmatic (the kernels begin with the wait), on several
    streams too, and the outputs stay the ONNX reference's replay after replay; NIMBLE_PDL=0 leaves every edge a
    full dependency with the same outputs."""
    if int(gpu_arch[3:5]) < 90:
        pytest.skip("programmatic dependent launch needs sm_90+")
    from tvm_nimble import NimbleExecutor, build, zoo
    from tvm_nimble.runtime.cuda_graph import programmatic_edges

    model = zoo.get_model("inception")
    inputs = zoo.random_inputs(model, seed=0)
    reference = [np.asarray(r) for r in ReferenceEvaluator(model).run(None, inputs)]
    module = build(model, {"kind": "cuda", "arch": gpu_arch}, kernels="tvm", max_streams=None)
    assert module.plan.dependent_launch and module.plan.num_streams > 1
    edges = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("NIMBLE_PDL", pdl)
        with NimbleExecutor(module, mode="cuda-graph") as ex:
            for k in range(3):
                x = {n: (v * (1 + 0.5 * k)).astype(v.dtype) for n, v in inputs.items()}
                want = [np.asarray(r) for r in ReferenceEvaluator(model).run(None, x)] if k else reference
                for o, r in zip(ex(**x), want):
                    np.testing.assert_allclose(o.numpy(), r, rtol=1e-3, atol=1e-3)
            edges[pdl] = programmatic_edges(ex._graphs[0].graph)
    assert edges["0"] == 0 < edges["1"]
