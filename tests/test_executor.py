"""NimbleExecutor on CPU: outputs against stock TVM VM and the ONNX reference; misuse errors."""
import numpy as np
import pytest
import tvm

from tvm_nimble import NimbleExecutor, NimbleError, ShapeError
from tvm_nimble.compiler.target import resolve_target
from tvm_nimble.runtime.executor import InputError, NotReadyError
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.compiler.stock import StockVM, build_stock_vm


def test_outputs_match_stock_vm_and_onnx_reference(zoo_built):
    b = zoo_built
    vm = StockVM(build_stock_vm(from_onnx(b.model), resolve_target("llvm")), tvm.cpu(), list(b.inputs.values()))
    vm_out = vm.outputs()
    with NimbleExecutor(b.module) as ex:
        out = [o.numpy() for o in ex(**b.inputs)]
    for o, v, r in zip(out, vm_out, b.reference):
        np.testing.assert_allclose(o, v, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4)


def test_graph_executor_style_api(inception_built):
    b = inception_built
    ex = NimbleExecutor(b.module)
    assert ex.get_num_inputs() == 1 and ex.get_num_outputs() == 1
    name, value = next(iter(b.inputs.items()))
    ex.set_input(name, value)
    ex.run()
    view = ex.get_output(0, copy=False)
    copy = ex.get_output(0)
    np.testing.assert_allclose(view.numpy(), b.reference[0], rtol=1e-4, atol=1e-4)
    # get_output returns a copy the caller owns; copy=False a view of the static buffer, which the next
    # run overwrites
    ex.set_input(0, tvm.runtime.tensor(np.zeros_like(value)))
    ex.run()
    assert not np.allclose(view.numpy(), copy.numpy())
    np.testing.assert_allclose(copy.numpy(), b.reference[0], rtol=1e-4, atol=1e-4)
    ex.close()
    with pytest.raises(NimbleError, match="closed"):
        ex.run()


def test_dlpack_input(inception_built):
    b = inception_built
    value = next(iter(b.inputs.values()))

    class DLPackOnly:  # any producer of DLPack, e.g. a torch tensor
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kw):
            return self.arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    with NimbleExecutor(b.module) as ex:
        out = ex(DLPackOnly(value))[0].numpy()
    np.testing.assert_allclose(out, b.reference[0], rtol=1e-4, atol=1e-4)


def test_bad_inputs_name_the_problem(inception_built):
    b = inception_built
    name, value = next(iter(b.inputs.items()))
    with NimbleExecutor(b.module) as ex:
        with pytest.raises(InputError, match="unknown input 'nope'.*input"):
            ex.set_input("nope", value)
        with pytest.raises(InputError, match="out of range"):
            ex.set_input(3, value)
        with pytest.raises(ShapeError, match=r"shape \[1, 3\].*built for"):
            ex.set_input(name, np.zeros((1, 3), dtype="float32"))
        with pytest.raises(InputError, match="dtype float64.*cast"):
            ex.set_input(name, value.astype("float64"))
        with pytest.raises(InputError, match="takes 1 input"):
            ex(value, value)
        with pytest.raises(InputError, match="expected a numpy array"):
            ex.set_input(name, object())


def test_strided_host_input_is_copied_correctly(inception_built):
    b = inception_built
    value = next(iter(b.inputs.values()))
    strided = np.swapaxes(np.swapaxes(value, 1, 3).copy(), 1, 3)  # same values, non-contiguous
    assert not strided.flags.c_contiguous
    with NimbleExecutor(b.module) as ex:
        np.testing.assert_allclose(ex(strided)[0].numpy(), b.reference[0], rtol=1e-4, atol=1e-4)


def test_call_returns_owned_outputs_and_views_only_on_request(inception_built):
    b = inception_built
    value = next(iter(b.inputs.values()))
    with NimbleExecutor(b.module) as ex:
        owned = ex(value)[0]
        view = ex(value, copy=False)[0]
        ex(np.zeros_like(value))
        np.testing.assert_allclose(owned.numpy(), b.reference[0], rtol=1e-4, atol=1e-4)  # untouched by later runs
        assert not np.allclose(view.numpy(), b.reference[0], rtol=1e-4, atol=1e-4)  # the view was overwritten


def test_single_thread_trio_keeps_working(inception_built):
    """The graph-executor pattern of the benchmark harness: inputs set once, then run/get_output repeatedly."""
    b = inception_built
    name, value = next(iter(b.inputs.items()))
    with NimbleExecutor(b.module) as ex:
        ex.set_input(name, value)
        for _ in range(3):
            ex.run()
            np.testing.assert_allclose(ex.get_output(0).numpy(), b.reference[0], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(ex.get_output(0, copy=False).numpy(), b.reference[0], rtol=1e-4, atol=1e-4)
        ex(np.zeros_like(value))  # __call__ in the same thread, then the trio again
        ex.set_input(0, value)
        ex.run()
        np.testing.assert_allclose(ex.get_output(0).numpy(), b.reference[0], rtol=1e-4, atol=1e-4)


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


def test_read_before_run_raises(inception_built):
    with NimbleExecutor(inception_built.module) as ex:
        with pytest.raises(NotReadyError, match=r"get_output\(\) before any run\(\).*run\(\) first") as e:
            ex.get_output(0)
        _one_line(e)
        with pytest.raises(NotReadyError, match="before any run"):
            ex.get_output(0, copy=False)
        ex.set_input(0, next(iter(inception_built.inputs.values())))
        with pytest.raises(NotReadyError, match="before any run"):
            ex.get_output(0)  # inputs set, but nothing ran yet


def test_run_before_set_input_raises(inception_built):
    with NimbleExecutor(inception_built.module) as ex:
        with pytest.raises(NotReadyError, match=r"run\(\) before set_input: input\(s\) \['input'\] were never set") as e:
            ex.run()
        _one_line(e)


def test_run_before_every_input_is_set_raises_constants_are_not_inputs():
    """Two inputs, one constant: setting one input is not enough; the constant never needs setting."""
    from onnx import TensorProto, helper, numpy_helper

    from tvm_nimble import build

    c = numpy_helper.from_array(np.full((2, 3), 2.0, dtype=np.float32), "c")
    nodes = [helper.make_node("Add", ["x", "y"], ["t"]), helper.make_node("Mul", ["t", "c"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "xy"],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x, y = np.ones((2, 3), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    with NimbleExecutor(build(model, "llvm")) as ex:
        assert ex.get_num_inputs() == 2
        ex.set_input("x", x)
        with pytest.raises(NotReadyError, match=r"\['y'\] were never set"):
            ex.run()
        ex.set_input("y", y)
        ex.run()
        np.testing.assert_allclose(ex.get_output(0).numpy(), (x + y) * 2.0)
        with pytest.raises(InputError, match="given twice"):
            ex(x, x=x)


def test_missing_kernel_is_named_at_load(inception_built):
    import copy

    from tvm_nimble.runtime.module import KernelNotFoundError, NimbleModule

    module = inception_built.module
    plan = copy.deepcopy(module.plan)
    plan.launches[3].kernel = "fused_no_such_kernel"
    with pytest.raises(KernelNotFoundError, match=r"launch 3 of the plan calls kernel 'fused_no_such_kernel'.*"
                                                  r"inconsistent.*rebuild") as e:
        NimbleExecutor(NimbleModule(plan, module.kernels, module.params))
    _one_line(e)


def test_gpu_modes_are_refused_for_a_cpu_artifact(inception_built):
    with pytest.raises(ValueError, match="does not apply"):
        NimbleExecutor(inception_built.module, mode="cuda-graph")


def test_out_of_memory_at_prepare_time_is_a_clean_error(inception_built):
    import copy

    from tvm_nimble.runtime.device import DeviceError

    module = copy.copy(inception_built.module)
    module.plan = copy.deepcopy(module.plan)
    pool = next(s for s in module.plan.storages if s.kind == "pool")
    pool.nbytes = 1 << 50  # a petabyte: no machine has it
    with pytest.raises(DeviceError, match="could not allocate"):
        NimbleExecutor(module)


def test_cuda_errors_become_clear_exceptions_without_a_gpu():
    """Real cuda-python calls on a machine without a driver: the status is named, not ignored."""
    pytest.importorskip("cuda.bindings")
    from tvm_nimble.runtime.cuda_graph import CudaError, StreamSet, cuda_runtime

    if cuda_runtime().cudaGetDeviceCount()[0] == cuda_runtime().cudaError_t.cudaSuccess:
        pytest.skip("a CUDA device is present: this checks the no-driver path")
    with pytest.raises(CudaError, match=r"cudaStreamCreate\w* failed: cudaError\w+"):
        StreamSet(2)


def test_zero_dim_constants_and_inputs():
    """0-d tensors stay 0-d (torchvision's mobilenet_v2 has scalar Clip bounds; a 1-d copy broke it)."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from tvm_nimble import build

    lo = numpy_helper.from_array(np.array(0.5, dtype=np.float32), "lo")
    hi = numpy_helper.from_array(np.array(6.0, dtype=np.float32), "hi")
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["t"]), helper.make_node("Mul", ["t", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [lo, hi])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.linspace(-2, 9, 6, dtype=np.float32).reshape(2, 3)
    s = np.array(1.5, dtype=np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x, "s": s})[0]
    with NimbleExecutor(build(model, "llvm")) as ex:
        np.testing.assert_allclose(ex(x, s)[0].numpy(), want, rtol=1e-6)


def test_float16_build_matches_the_reference_to_fp16_precision(inception_built):
    """The benchmark's fp16 table: TVM's ToMixedPrecision, then the same Nimble plan and executor."""
    from tvm_nimble import build
    from tvm_nimble.compiler.stages import import_model
    from tvm_nimble.relay_passes.precision import to_precision

    b = inception_built
    mod16 = to_precision(import_model(b.model), "float16")
    assert "float16" in mod16.script()
    with NimbleExecutor(build(mod16, "llvm")) as ex:
        out = ex(**b.inputs)[0].numpy()
    assert out.dtype == np.float32  # the interface stays fp32
    scale = float(np.abs(b.reference[0]).max())
    err = float(np.abs(out - b.reference[0]).max())
    assert err < 2e-2 * max(scale, 1.0)
    assert err > 0  # really computed in half precision, not silently in fp32
