"""Our GEMV provider (relay_passes/providers/gemv.py, codegen/vendor/gemv.cu) on the CPU: which Linear chains it
takes (16-bit, at most eight rows, K a multiple of 8), that it stores the weights [N, K] whatever the model's layout,
that its epilogue is cuBLASLt's (bias, tanh GELU, a float32 residual), and that the offloaded module computes what
stock TVM computes for the chains it replaces (the call runs as its numpy contract, tests/vendor_reference.py).
``kernels="vendor"`` gives these chains to the GEMV (the gated and normed ones first), ahead of cuBLASLt."""
import numpy as np
import pytest
from tvm import relax

from test_dpl_chains import _function, _same_as_stock
from tvm_nimble.relay_passes.providers import gemv, registered
from tvm_nimble.relay_passes.vendor_offload import find_offloads

RNG = np.random.default_rng(5)
K, N = 16, 24
W_KN = RNG.standard_normal((K, N)).astype("float32")  # as GPT-2's Conv1D stores it
BIAS = RNG.standard_normal(N).astype("float32")


def _decode_linear(dtype: str, rows: int = 1, tail: str = "residual32", k: int = K, transposed: bool = False):
    """x [1, rows, k] -> reshape [rows, k] -> matmul with W (or a permute of W^T) -> + bias -> reshape [1, rows, N] ->
    ``tail``: "residual32" (cast up, + a float32 residual), "gelu" (tanh GELU) or "none"."""
    op = relax.op
    w = W_KN[:k] if k <= K else np.tile(W_KN, (k // K + 1, 1))[:k]

    def body(emit, x, r):
        x2 = emit(op.reshape(x, (rows, k)))
        weight = (op.permute_dims(relax.const(np.ascontiguousarray(w.T).astype(dtype)), [1, 0]) if transposed
                  else relax.const(w.astype(dtype)))
        a = emit(op.add(emit(op.matmul(x2, emit(weight) if transposed else weight)),
                        relax.const(BIAS.astype(dtype))))
        a3 = emit(op.reshape(a, (1, rows, N)))
        if tail == "gelu":
            return op.nn.gelu_tanh(a3)
        if tail == "none":
            return op.multiply(a3, a3)
        return op.add(emit(op.astype(a3, "float32")), r)

    return _function([("x", (1, rows, k), dtype), ("r", (1, rows, N), "float32")], body)


def _inputs(dtype, rows=1, k=K):
    return [RNG.standard_normal((1, rows, k)).astype(dtype), RNG.standard_normal((1, rows, N)).astype("float32")]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("rows", [1, 4, 8])
def test_a_decode_linear_with_its_float32_residual_is_one_gemv(rows, transposed, vendor_reference):
    func = _decode_linear("float16", rows, transposed=transposed)
    (found,) = find_offloads(func, providers=[gemv.PROVIDER])
    assert found.signature.split(" -> ")[1].startswith(gemv.MATMUL_ADD)
    call = found.value[0]
    weight = call.args[1].fields[1].value.numpy()  # call_dps_packed(func, (x, W, bias, z, attrs))
    np.testing.assert_array_equal(weight, W_KN.T.astype("float16"))  # [N, K], each column one contiguous row
    assert str(call.ty_args[0].fields[0].dtype) == "float32"
    _same_as_stock(func, _inputs("float16", rows), 2e-2)


def test_the_tanh_gelu_is_the_gemvs_activation(vendor_reference):
    func = _decode_linear("float16", tail="gelu")
    (found,) = find_offloads(func, providers=[gemv.PROVIDER])
    assert found.signature.endswith(", [4])")
    _same_as_stock(func, _inputs("float16"), 2e-2)


@pytest.mark.parametrize("dtype, rows, k, reason", [
    ("float16", 9, K, "at most 8 rows"), ("float16", 1, 12, "multiple of 8"), ("float32", 1, K, None)])
def test_what_the_gemv_leaves_to_others(dtype, rows, k, reason):
    """More than eight rows, K not a multiple of 8, and float32 (cuBLASLt's or our SIMT GEMM's) are not its."""
    assert find_offloads(_decode_linear(dtype, rows, tail="none", k=k), providers=[gemv.PROVIDER]) == []


def test_kernels_vendor_gives_a_decode_linear_to_the_gemv_not_cublaslt():
    names = [p.name for p in registered()]
    assert names.index("gemv_glu") < names.index("gemv_norm") < names.index("gemv") < names.index("cublaslt")
    both = [p for p in registered() if p.name in ("cublaslt", "gemv")]  # in the order a build offers them
    (found,) = find_offloads(_decode_linear("float16"), providers=both)
    assert found.provider == "gemv"
    (found,) = find_offloads(_decode_linear("float16", rows=9), providers=both)
    assert found.provider == "cublaslt"  # more rows than the GEMV's


def _normed_linear(norm: str, dtype: str = "float16", src_dtype: str = "float32", rows: int = 1,
                   residual: bool = True, shared: bool = False):
    """A decoder layer's norm before its projection, as the precision policy leaves it: r [1, rows, K] (``src_dtype``)
    -> float32 LayerNorm / RMSNorm over the last axis -> astype(dtype) -> reshape [rows, K] -> matmul -> + bias ->
    reshape [1, rows, N] (-> astype float32 + r2 with ``residual``). ``shared``: the norm's output is read twice."""
    op = relax.op
    gamma = (1.0 + 0.1 * RNG.standard_normal(K)).astype("float32")
    beta = (0.1 * RNG.standard_normal(K)).astype("float32")

    def body(emit, r, r2):
        x = emit(op.astype(r, "float32")) if src_dtype != "float32" else r
        if norm == "layer":
            normed = emit(op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-5))
        else:
            normed = emit(op.nn.rms_norm(x, relax.const(gamma), axes=[-1], epsilon=1e-6))
        half = emit(op.astype(normed, dtype))
        x2 = emit(op.reshape(half, (rows, K)))
        a = emit(op.add(emit(op.matmul(x2, relax.const(W_KN.astype(dtype)))), relax.const(BIAS.astype(dtype))))
        a3 = emit(op.reshape(a, (1, rows, N)))
        out = emit(op.add(emit(op.astype(a3, "float32")), r2)) if residual else a3
        return relax.Tuple([out, normed]) if shared else out

    return _function([("r", (1, rows, K), src_dtype), ("r2", (1, rows, N), "float32")], body)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("src_dtype, rows, residual", [("float32", 1, True), ("float16", 1, False)])
def test_the_norm_before_a_decode_linear_is_the_gemvs_prologue(norm, src_dtype, rows, residual, vendor_reference):
    """With ``gemv_norm`` named, GPT-2's LayerNorm and Llama's RMSNorm (float32, cast to the 16-bit dtype) go into the
    GEMV's call: its x is the norm's input, its parameters float32, and the module computes what stock TVM
    computes."""
    func = _normed_linear(norm, src_dtype=src_dtype, rows=rows, residual=residual)
    (found,) = find_offloads(func, providers=[gemv.NORM_PROVIDER])
    name = found.signature.split(" -> ")[1]
    assert name.startswith(gemv.NORM_MATMUL_ADD if residual else gemv.NORM_MATMUL + "(")
    ops = [b.value.op.name.split(".")[-1] for b in found.bindings if isinstance(b.value, relax.Call)]
    assert ("layer_norm" if norm == "layer" else "rms_norm") in ops
    call = found.value[0]
    x, gamma, beta = call.args[1].fields[:3]
    assert str(x.ty.dtype) == src_dtype and str(gamma.ty.dtype) == "float32" == str(beta.ty.dtype)
    inputs = [RNG.standard_normal((1, rows, K)).astype(src_dtype), RNG.standard_normal((1, rows, N)).astype("float32")]
    _same_as_stock(func, inputs, 2e-2, providers=[gemv.NORM_PROVIDER])


def test_the_norm_prologue_takes_one_row():
    """Four rows (a batch of four decoding): the plain GEMV's, the norm stays TVM's."""
    func = _normed_linear("rms", rows=4)
    assert find_offloads(func, providers=[gemv.NORM_PROVIDER]) == []
    (found,) = find_offloads(func, providers=[gemv.PROVIDER, gemv.NORM_PROVIDER])
    assert found.provider == "gemv"


def _normed_head(columns: int):
    """An LM head as a decoder ends: a float32 LayerNorm, cast to fp16, then a Linear of ``columns`` outputs."""
    op = relax.op
    w = RNG.standard_normal((K, columns)).astype("float16")

    def body(emit, r, _):
        normed = emit(op.nn.layer_norm(r, relax.const(np.ones(K, "float32")), relax.const(np.zeros(K, "float32")),
                                       axes=[-1], epsilon=1e-5))
        x2 = emit(op.reshape(emit(op.astype(normed, "float16")), (1, K)))
        return op.matmul(x2, relax.const(w))

    return _function([("r", (1, 1, K), "float32"), ("r2", (1, 1, 1), "float32")], body)


def test_the_norm_prologue_is_not_offered_for_an_lm_heads_width():
    """Past MAX_NORM_COLUMNS every block normalizing the row again costs more than the norm kernel (measured on GPT-2's
    and Llama's heads): the plain GEMV takes the Linear and the norm stays its own kernel; up to it, the prologue."""
    wide = _normed_head(gemv.MAX_NORM_COLUMNS + 8)
    assert find_offloads(wide, providers=[gemv.NORM_PROVIDER]) == []
    (found,) = find_offloads(wide, providers=[gemv.NORM_PROVIDER, gemv.PROVIDER])
    assert found.provider == "gemv"
    (found,) = find_offloads(_normed_head(gemv.MAX_NORM_COLUMNS), providers=[gemv.NORM_PROVIDER, gemv.PROVIDER])
    assert found.provider == "gemv_norm"


def test_a_norm_read_elsewhere_stays_its_own_kernel(vendor_reference):
    """A norm whose output is also returned is computed once, by TVM; the plain GEMV reads the cast."""
    func = _normed_linear("layer", shared=True)
    assert find_offloads(func, providers=[gemv.NORM_PROVIDER]) == []
    (found,) = find_offloads(func, providers=[gemv.PROVIDER, gemv.NORM_PROVIDER])
    assert found.signature.split(" -> ")[1].startswith(gemv.MATMUL_ADD + "(")
    inputs = [RNG.standard_normal((1, 1, K)).astype("float32"), RNG.standard_normal((1, 1, N)).astype("float32")]
    _same_as_stock(func, inputs, 2e-2, providers=[gemv.PROVIDER, gemv.NORM_PROVIDER])


I = N // 2  # the gated MLP's width: W_GU's N columns are gate (first half) then up
W_GU = (0.25 * W_KN).astype("float32")  # small enough that the 16-bit products keep a few units' magnitude


def _gated_mlp(dtype: str = "float16", norm: bool = True, rows: int = 1, order: str = "gate-first",
               gate_read_elsewhere: bool = False):
    """Llama's / Qwen's MLP up to its down projection as a merged build leaves it (tests/test_merge_siblings): r [1, rows,
    K] float32 -> [RMSNorm -> astype] -> matmul with the merged gate/up W [K, 2I] -> split in two halves -> g *
    sigmoid(g) * u (``order``: which operand comes first in each product) -> matmul with the down projection."""
    op = relax.op
    gamma = (1.0 + 0.1 * RNG.standard_normal(K)).astype("float32")
    down = (0.25 * RNG.standard_normal((I, K))).astype(dtype)

    def body(emit, r, r2):
        x = emit(op.astype(emit(op.nn.rms_norm(r, relax.const(gamma), axes=[-1], epsilon=1e-6)), dtype)) if norm \
            else emit(op.astype(r, dtype))
        merged = emit(op.matmul(x, relax.const(W_GU.astype(dtype))))
        halves = emit(op.split(merged, [I], axis=-1))
        g, u = emit(relax.TupleGetItem(halves, 0)), emit(relax.TupleGetItem(halves, 1))
        s = emit(op.sigmoid(g))
        silu = emit(op.multiply(g, s) if order == "gate-first" else op.multiply(s, g))
        h = emit(op.multiply(silu, u) if order == "gate-first" else op.multiply(u, silu))
        out = emit(op.matmul(h, relax.const(down)))
        return relax.Tuple([out, g]) if gate_read_elsewhere else out

    return _function([("r", (1, rows, K), "float32"), ("r2", (1, rows, K), "float32")], body)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("order", ["gate-first", "gate-last"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_gated_mlps_projection_and_gate_are_one_gemv(norm, order, dtype, vendor_reference):
    """``gemv_glu``: the merged gate/up projection, its split and silu(gate) * up become one call of the gated
    width (with the RMSNorm before it in the prologue), its weights' rows interleaved gate/up; the module computes
    what stock TVM computes."""
    func = _gated_mlp(dtype, norm=norm, order=order)
    (found,) = find_offloads(func, providers=[gemv.GLU_PROVIDER])
    name = found.signature.split(" -> ")[1]
    assert name.startswith((gemv.GLU_NORM_MATMUL if norm else gemv.GLU_MATMUL) + "(")
    ops = {b.value.op.name.split(".")[-1] for b in found.bindings if isinstance(b.value, relax.Call)}
    assert {"matmul", "split", "sigmoid", "multiply"} <= ops and (("rms_norm" in ops) == norm)
    call = found.value[0]
    assert tuple(int(d) for d in call.ty_args[0].fields[0].shape) == (1, 1, I)
    weight = call.args[1].fields[3 if norm else 1].value.numpy()
    want = np.empty((N, K), dtype)
    want[0::2], want[1::2] = W_GU.T[:I].astype(dtype), W_GU.T[I:].astype(dtype)  # row 2j gate j, row 2j + 1 up j
    np.testing.assert_array_equal(weight, want)
    inputs = [RNG.standard_normal((1, 1, K)).astype("float32"), RNG.standard_normal((1, 1, K)).astype("float32")]
    _same_as_stock(func, inputs, 2e-2, providers=[gemv.GLU_PROVIDER])


@pytest.mark.parametrize("case", ["gate read elsewhere", "two rows"])
def test_what_the_gated_gemv_leaves_to_others(case):
    """A gate the model also reads elsewhere, or more than one row (the kernel's gate takes one): not its chain."""
    func = _gated_mlp(gate_read_elsewhere=case == "gate read elsewhere", rows=2 if case == "two rows" else 1)
    assert find_offloads(func, providers=[gemv.GLU_PROVIDER]) == []


def test_the_decode_providers_are_used_by_default():
    by_name = {p.name: p for p in registered()}
    assert by_name["gemv_glu"].by_default and by_name["gemv_norm"].by_default
    assert by_name["attention_append"].by_default
