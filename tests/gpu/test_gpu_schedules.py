"""Our GPU schedules of TVM's kernels on the GPU (``relay_passes.schedules``): what they compute, against numpy."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

#: relative L2 against float64: one rounding of the output to the dtype (the inputs are exact in it)
BOUND = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1.5e-2}


@pytest.mark.parametrize("dtype", list(BOUND))
def test_a_vectorized_silu_multiply_matches_numpy(gpu_arch, dtype):
    """A 16-bit decoder's SiLU-multiply at 512 rows of a 4864-wide MLP (four outputs a thread, one 8- or 16-byte load
    of each half and one store: ``vectorized_elementwise``), built and run as a user would, against numpy in float64;
    and the same with the gate two columns in (not vectorized), so both schedules run, and as a model at batch 1 has it
    ([1, 512, 9728])."""
    import ml_dtypes
    import tvm

    from elementwise_modules import silu_multiply, silu_multiply_reference
    from tvm_nimble import NimbleExecutor, build
    from tvm_nimble.compiler import stages
    from tvm_nimble.compiler.target import resolve_target

    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.random.default_rng(0).standard_normal((512, 2 * 4864)).astype(np_dtype)
    target = {"kind": "cuda", "arch": gpu_arch}
    for gate_at, vectorized, lead in ((0, True, ()), (2, False, ()), (0, True, (1,))):
        mod = silu_multiply(dtype, gate_at=gate_at, lead=lead)
        lowered = stages.lower(mod, resolve_target("cuda", gpu_arch))
        kernels = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
        assert any("T.vectorized" in f.script() for f in kernels) == vectorized
        with NimbleExecutor(build(mod, target, kernels="tvm")) as ex:
            got = ex(x.reshape(*lead, *x.shape))[0].numpy().astype(np.float64)
        want = silu_multiply_reference(x, 4864, gate_at).reshape(*lead, 512, 4864)
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < BOUND[dtype], (dtype, gate_at)


@pytest.mark.parametrize("dtype", list(BOUND))
def test_a_vectorized_rotary_embedding_matches_numpy(gpu_arch, dtype):
    """A decoder's rotary embedding over [1, 16, 512, 64] (rotate-half's branch taken by the whole vector, one 8- or
    16-byte access of each side: ``vectorized_elementwise``), and with the half boundary at 30 (DLight's schedule),
    built and run as a user would, against numpy in float64."""
    import ml_dtypes

    from elementwise_modules import rotary, rotary_reference
    from tvm_nimble import NimbleExecutor, build

    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 512, 64)).astype(np_dtype)
    angle = rng.uniform(-np.pi, np.pi, (1, 1, 512, 64))
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    for split_at in (32, 30):
        with NimbleExecutor(build(rotary(dtype, split_at=split_at), {"kind": "cuda", "arch": gpu_arch},
                                  kernels="tvm")) as ex:
            got = ex(x, cos, sin)[0].numpy().astype(np.float64)
        want = rotary_reference(x, cos.astype(np.float64), sin.astype(np.float64), split_at)
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < BOUND[dtype], (dtype, split_at)


@pytest.mark.parametrize("threads", [32, 128, 256])
@pytest.mark.parametrize("dtype", list(BOUND))
def test_threads_per_row_normalizations_match_numpy(gpu_arch, dtype, threads, monkeypatch):
    """RMSNorm, LayerNorm and a softmax over the last axis of 512 (and 1536) float32 rows rounded to ``dtype``, with
    ``threads`` threads a row (``NIMBLE_ROW_THREADS``: ``threads_per_row``), built and run as a user would, against
    numpy in float64; and at 197 rows (DLight's block per row) so both schedules run."""
    from elementwise_modules import ROW_NORMS, row_norm, row_norm_reference
    from tvm_nimble import NimbleExecutor, build

    monkeypatch.setenv("NIMBLE_ROW_THREADS", str(threads))
    rng = np.random.default_rng(0)
    for kind in ROW_NORMS:
        for rows, width in ((512, 896), (1536, 256), (197, 768)):
            x = (rng.standard_normal((1, rows, width)) * 3 + 1).astype(np.float32)
            weight, bias = rng.standard_normal((2, width)).astype(np.float32)
            with NimbleExecutor(build(row_norm(kind, rows, width, dtype), {"kind": "cuda", "arch": gpu_arch},
                                      kernels="tvm")) as ex:
                got = ex(x, weight, bias)[0].numpy().astype(np.float64)
            want = row_norm_reference(kind, x, weight, bias)
            assert np.isfinite(got).all()
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < BOUND[dtype] + 1e-6, (kind, rows, dtype)
