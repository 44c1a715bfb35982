"""The providers' chain steps as TVM dataflow patterns (relay_passes/providers/chains.py): which epilogues and GELU
spellings a vendor call folds in, and that the folded call computes what stock TVM computes for the chain it
replaces (the calls run as their numpy contract, tests/vendor_reference.py)."""
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from tvm_nimble.compiler.stock import StockVM, build_stock_vm
from tvm_nimble.compiler.target import resolve_target
from tvm_nimble.relay_passes.providers import chains as chains_module
from tvm_nimble.relay_passes.providers import cublaslt, cudnn, simt_gemm
from tvm_nimble.relay_passes.vendor_offload import OffloadToVendor, find_offloads

RNG = np.random.default_rng(11)
C = 4
W = RNG.standard_normal((C, C, 3, 3)).astype("float32")
B = RNG.standard_normal(C).astype("float32")
FULL = RNG.standard_normal((1, C, 6, 6)).astype("float32")
LW = RNG.standard_normal((8, 12)).astype("float32")
LB = RNG.standard_normal(12).astype("float32")


def _conv(tail: str):
    """x [1, 4, 6, 6] -> conv2d -> + bias (reshaped, bound to a var) -> ``tail``."""
    @R.function
    def relu(x: R.Tensor((1, C, 6, 6), "float32"), r: R.Tensor((1, C, 6, 6), "float32")):
        with R.dataflow():
            bias = R.reshape(R.const(B), [1, C, 1, 1])
            y = R.nn.conv2d(x, R.const(W), padding=[1, 1, 1, 1])
            z = R.add(bias, y)  # the constant first: the pattern's add is commutative
            out = R.nn.relu(z)
            R.output(out)
        return out

    @R.function
    def relu6(x: R.Tensor((1, C, 6, 6), "float32"), r: R.Tensor((1, C, 6, 6), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, R.const(W), padding=[1, 1, 1, 1])
            z = R.add(y, R.const(B.reshape(1, C, 1, 1)))
            out = R.clip(z, 0, 6)
            R.output(out)
        return out

    @R.function
    def clip5(x: R.Tensor((1, C, 6, 6), "float32"), r: R.Tensor((1, C, 6, 6), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, R.const(W), padding=[1, 1, 1, 1])
            z = R.add(y, R.const(B.reshape(1, C, 1, 1)))
            out = R.clip(z, 0, 5)
            R.output(out)
        return out

    @R.function
    def residual(x: R.Tensor((1, C, 6, 6), "float32"), r: R.Tensor((1, C, 6, 6), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, R.const(W), padding=[1, 1, 1, 1])
            z = R.add(y, R.const(B.reshape(1, C, 1, 1)))
            s = R.add(r, z)
            out = R.nn.relu(s)
            R.output(out)
        return out

    @R.function
    def constant_sum(x: R.Tensor((1, C, 6, 6), "float32"), r: R.Tensor((1, C, 6, 6), "float32")):
        with R.dataflow():
            full = R.reshape(R.const(FULL), [1, C, 6, 6])
            y = R.nn.conv2d(x, R.const(W), padding=[1, 1, 1, 1])
            z = R.add(y, R.const(B.reshape(1, C, 1, 1)))
            s = R.add(full, z)
            out = R.nn.relu(s)
            R.output(out)
        return out

    return {"relu": relu, "relu6": relu6, "clip5": clip5, "residual": residual, "constant_sum": constant_sum}[tail]


def _linear_gelu(sqrt2: float = 2 ** 0.5, half: float = 0.5, order: str = "torch"):
    """x [6, 8] -> matmul with constant W -> + bias -> the erf GELU spelled with the given constants."""
    s, h = np.float32(sqrt2), np.float32(half)
    if order == "torch":
        @R.function
        def f(x: R.Tensor((6, 8), "float32")):
            with R.dataflow():
                mm = R.matmul(x, R.const(LW))
                a = R.add(mm, R.const(LB))
                d = R.divide(a, R.const(s))
                e = R.erf(d)
                p = R.add(R.const(np.float32(1)), e)
                q = R.multiply(a, p)
                out = R.multiply(q, R.const(h))
                R.output(out)
            return out
    elif order == "hf":
        @R.function
        def f(x: R.Tensor((6, 8), "float32")):
            with R.dataflow():
                mm = R.matmul(x, R.const(LW))
                a = R.add(mm, R.const(LB))
                hh = R.multiply(R.const(h), a)
                d = R.divide(a, R.const(s))
                e = R.erf(d)
                p = R.add(e, R.const(np.float32(1)))
                out = R.multiply(p, hh)
                R.output(out)
            return out
    else:
        @R.function
        def f(x: R.Tensor((6, 8), "float32")):
            with R.dataflow():
                mm = R.matmul(x, R.const(LW))
                a = R.add(mm, R.const(LB))
                out = R.nn.gelu(a)
                R.output(out)
            return out
    return f


def _computes_the_same(func, inputs):
    """The offloaded module's output equals stock TVM's on the original function."""
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    target = resolve_target("llvm")
    want = StockVM(build_stock_vm(mod, target), tvm.cpu(), inputs).outputs()[0]
    got = StockVM(build_stock_vm(OffloadToVendor()(mod), target), tvm.cpu(), inputs).outputs()[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tail, ops, act", [("relu", "conv2d+add+relu", 1), ("relu6", "conv2d+add+clip", 2),
                                            ("clip5", "conv2d+add", 0), ("residual", "conv2d+add+add+relu", 1),
                                            ("constant_sum", "conv2d+add", 0)])
def test_the_convolution_epilogue_folds_bias_residual_and_relu_or_relu6_only(tail, ops, act, vendor_reference):
    """cuDNN's chain: a per-channel bias (also a reshaped constant bound to a var, on either side of the add), then
    a computed residual, then ReLU or clip(0, 6); a clip to another range and a constant added after the bias stay
    on TVM's kernels."""
    func = _conv(tail)
    (found,) = find_offloads(func, providers=[cudnn.PROVIDER])
    assert found.signature.split(" -> ")[0] == ops
    assert [int(v) for v in found.value[0].args[1].fields[-1].values][7] == act
    assert (cudnn.CONV2D_ADD in found.signature) == (tail == "residual")
    inputs = [RNG.standard_normal((1, C, 6, 6)).astype("float32") for _ in range(2)]
    _computes_the_same(func, inputs)


@pytest.mark.parametrize("order", ["torch", "hf", "op"])
def test_every_spelling_of_the_exact_gelu_is_the_linears_activation(order, vendor_reference):
    func = _linear_gelu(order=order)
    (found,) = find_offloads(func, providers=[cublaslt.PROVIDER])
    assert found.signature.split(" -> ")[1].endswith(", [0,3,0])")
    assert len(found.bindings) == (7 if order != "op" else 3)
    _computes_the_same(func, [RNG.standard_normal((6, 8)).astype("float32")])


@pytest.mark.parametrize("sqrt2, half", [(3 ** 0.5, 0.5), (2 ** 0.5, 0.49), (2 ** 0.5 * (1 + 1e-4), 0.5)])
def test_a_gelu_spelled_with_other_constants_is_not_folded(sqrt2, half):
    """The scalars are checked to 1e-6 of sqrt(2), 1 and 0.5: another constant leaves the Linear with its bias
    only (the rest stays on TVM's kernels)."""
    for order in ("torch", "hf"):
        (found,) = find_offloads(_linear_gelu(sqrt2, half, order), providers=[cublaslt.PROVIDER])
        assert found.signature.split(" -> ")[0] == "matmul+add"
        assert found.signature.endswith(", [0,0,0])")


def test_a_gelu_whose_input_is_read_elsewhere_is_not_folded():
    @R.function
    def f(x: R.Tensor((6, 8), "float32")):
        with R.dataflow():
            mm = R.matmul(x, R.const(LW))
            a = R.add(mm, R.const(LB))
            g = R.nn.gelu(a)
            out = R.add(g, a)
            R.output(out)
        return out

    (found,) = find_offloads(f, providers=[cublaslt.PROVIDER])
    assert found.signature.split(" -> ")[0] == "matmul+add"


def test_a_constant_is_seen_through_its_binding_and_a_reshape():
    """Chains.const: an inline constant, one bound to a var, and a reshape of one (in the reshape's shape)."""
    @R.function
    def f(x: R.Tensor((1, C), "float32")):
        with R.dataflow():
            c = R.reshape(R.const(B), [1, C])
            y = R.add(x, c)
            z = R.add(y, x)
            R.output(z)
        return z

    block = f.body.blocks[0]
    chains = chains_module.Chains(block, chains_module.use_counts(f))
    c, y, _ = (b.var for b in block.bindings)
    np.testing.assert_array_equal(chains.const(c), B.reshape(1, C))
    np.testing.assert_array_equal(chains.const(relax.const(B)), B)
    assert chains.const(y) is None and chains.const(f.params[0]) is None


def _function(params, body):
    """A one-block function of ``params`` ((name, shape, dtype), ...) whose bindings ``body(emit, *params)`` emits
    (the BlockBuilder: TVMScript does not take a dtype from a variable)."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, dtype)) for name, shape, dtype in params]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(bb.emit, *args))
        bb.emit_func_output(out)
    return bb.finalize()["main"]


def _linear_gelu_tanh(dtype: str = "float32", cube: str = "mul", order: str = "hf", k: float = 0.044715,
                      rows: int = 6):
    """x [rows, 8] -> matmul -> + bias -> GELU's tanh approximation, its scalars in ``dtype`` (an fp16 export's are
    rounded: 0.044715 is 0.0447082...), the cube spelled ``x * x * x`` or ``pow(x, 3)``; "op": relax.nn.gelu_tanh."""
    op = relax.op

    def c(v):
        return relax.const(np.array(v, dtype=dtype))

    def body(emit, x):
        a = emit(op.add(emit(op.matmul(x, relax.const(LW.astype(dtype)))), relax.const(LB.astype(dtype))))
        if order == "op":
            return op.nn.gelu_tanh(a)
        scale = float(np.sqrt(2 / np.pi))
        if cube == "mul":
            cu = emit(op.multiply(emit(op.multiply(a, a)), a))
            inner = emit(op.add(a, emit(op.multiply(cu, c(k)))))
            t = emit(op.tanh(emit(op.multiply(inner, c(scale)))))
            half_x = emit(op.multiply(a, c(0.5)))
            return op.multiply(half_x, emit(op.add(t, c(1.0))))
        cu = emit(op.power(a, c(3.0)))
        inner = emit(op.add(emit(op.multiply(c(k), cu)), a))
        t = emit(op.tanh(emit(op.multiply(c(scale), inner))))
        return op.multiply(emit(op.multiply(a, emit(op.add(c(1.0), t)))), c(0.5))

    return _function([("x", (rows, 8), dtype)], body)


def _same_as_stock(func, inputs, tol, providers=None):
    """The offloaded module's outputs (dtypes, shapes, values) equal stock TVM's on the original function."""
    mod = tvm.IRModule({"main": func})
    target = resolve_target("llvm")
    want = StockVM(build_stock_vm(mod, target), tvm.cpu(), inputs).outputs()
    got = StockVM(build_stock_vm(OffloadToVendor(providers=providers)(mod), target), tvm.cpu(), inputs).outputs()
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype("float32"), w.astype("float32"), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cube, order", [("mul", "hf"), ("pow", "torch"), ("mul", "op")])
def test_every_spelling_of_the_tanh_gelu_is_the_linears_gelu_epilogue(dtype, cube, order, vendor_reference):
    """GPT-2's gelu_new, its scalars rounded to the compute dtype, is activation 4 (cuBLASLt's GELU epilogue)."""
    func = _linear_gelu_tanh(dtype, cube, order)
    (found,) = find_offloads(func, providers=[cublaslt.PROVIDER])
    assert found.signature.split(" -> ")[1].endswith(", [0,4,0])")
    assert len(found.bindings) == (3 if order == "op" else 11 if cube == "mul" else 10)
    _same_as_stock(func, [RNG.standard_normal((6, 8)).astype(dtype)], 1e-4 if dtype == "float32" else 2e-2)


def test_our_fp32_gemm_leaves_a_tanh_gelu_after_its_linear(vendor_reference):
    """Our fp32 GEMM compiles no tanh GELU (gemm_simt_kernels.h, kSimtMaxActivation): it takes the Linear and
    its bias, the GELU stays with TVM, and the module computes what stock TVM does; cuBLASLt folds the same GELU."""
    func = _linear_gelu_tanh("float32", rows=32)
    (found,) = find_offloads(func, providers=[simt_gemm.PROVIDER])
    assert found.signature.split(" -> ")[0] == "matmul+add" and found.signature.endswith("[0])")
    (lt,) = find_offloads(func, providers=[cublaslt.PROVIDER])
    assert lt.signature.endswith(", [0,4,0])")
    _same_as_stock(func, [RNG.standard_normal((32, 8)).astype("float32")], 1e-5, providers=[simt_gemm.PROVIDER])


@pytest.mark.parametrize("k", [0.05, 0.044715 * (1 + 2e-3)])
def test_a_tanh_gelu_with_another_constant_is_not_folded(k):
    """The scalars may be off by their rounding to fp16 (2^-11), not more."""
    (found,) = find_offloads(_linear_gelu_tanh("float16", k=k), providers=[cublaslt.PROVIDER])
    assert found.signature.split(" -> ")[0] == "matmul+add"


def _conv1d_block(dtype: str, tail: str):
    """GPT-2's Conv1D as exported: x [1, 3, 8] reshaped to [3, 8], matmul, + bias, reshaped back to [1, 3, 12], then
    ``tail``: "residual32" (cast up and added to a float32 residual stream, as a 16-bit build leaves it),
    "residual" (added in the compute dtype), "gelu" (the tanh GELU) or "split" (a reshape to heads, read by a
    split: nothing to fold)."""
    op = relax.op
    r_dtype = "float32" if tail == "residual32" else dtype

    def body(emit, x, r):
        x2 = emit(op.reshape(x, (3, 8)))
        a = emit(op.add(emit(op.matmul(x2, relax.const(LW.astype(dtype)))), relax.const(LB.astype(dtype))))
        if tail == "split":
            return op.split(emit(op.reshape(a, (1, 3, 4, 3))), 3, axis=2)
        a3 = emit(op.reshape(a, (1, 3, 12)))
        if tail == "gelu":
            return op.nn.gelu_tanh(a3)
        if tail == "residual":
            return op.add(r, a3)
        return op.add(emit(op.astype(a3, "float32")), r)

    return _function([("x", (1, 3, 8), dtype), ("r", (1, 3, 12), r_dtype)], body)


@pytest.mark.parametrize("dtype, tail, ops, act", [
    ("float16", "residual32", "matmul+add+reshape+astype+add", 0),
    ("bfloat16", "residual32", "matmul+add+reshape+astype+add", 0),
    ("float32", "residual", "matmul+add+reshape+add", 0),
    ("float16", "gelu", "matmul+add+reshape+gelu_tanh", 4),
    ("float16", "split", "matmul+add", 0)])
def test_the_linears_epilogue_is_read_through_a_reshape_of_the_rows(dtype, tail, ops, act, vendor_reference):
    """What follows the GEMM through a reshape of its rows is folded in (the call writes the reshaped shape), and a
    16-bit GEMM adds a float32 residual in fp32 (it writes float32, the residual stream's dtype: no cast or add
    kernel is left); a reshape that is not the rows' stays outside the call."""
    func = _conv1d_block(dtype, tail)
    (found,) = find_offloads(func, providers=[cublaslt.PROVIDER])
    assert found.signature.split(" -> ")[0] == ops
    assert found.signature.endswith(f", [0,{act},0])")
    assert (cublaslt.MATMUL_ADD in found.signature) == tail.startswith("residual")
    out_ty = found.value[0].ty_args[0].fields[0]  # the call's result (the workspace is field 1)
    assert [int(d) for d in out_ty.shape] == ([3, 12] if tail == "split" else [1, 3, 12])
    assert str(out_ty.dtype) == ("float32" if tail == "residual32" else dtype)
    if dtype != "bfloat16":  # (numpy gives the VM no bfloat16 input: the float16 case runs the same chain)
        ins = [RNG.standard_normal((1, 3, 8)).astype(dtype), RNG.standard_normal((1, 3, 12)).astype(
            "float32" if tail == "residual32" else dtype)]
        _same_as_stock(func, ins, 1e-4 if dtype == "float32" else 2e-2)
