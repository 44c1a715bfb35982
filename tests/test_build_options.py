"""BuildOptions: every option checked once with a one-line error, the same from Python and the command
line; precision as a build option, checked against the ONNX reference evaluator."""

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from tvm_nimble import NimbleExecutor, build, zoo
from tvm_nimble.compiler.options import BuildOptions
from tvm_nimble.errors import NimbleError

BAD = [
    ({"kernels": "cudnn"}, r"^kernels must be one of \('auto', 'tvm', 'vendor', 'best'\), got 'cudnn'$"),
    ({"precision": "bfloat17"}, r"^precision must be one of fp32, tf32, fp16, bf16, got 'bfloat17'$"),
    ({"keep_fp32": ("softmaxx",)}, r"^keep_fp32 takes Relax operator names such as matmul, conv2d or softmax; "
                                   r"'softmaxx' is none$"),
    ({"max_error": 0}, r"^max_error must be a positive number \(the largest relative L2 error against fp32\), got 0$"),
    ({"max_streams": 0}, r"^max_streams must be an integer >= 1, None or 'auto', got 0$"),
    ({"max_streams": "fast"}, r"^max_streams must be an integer >= 1, None or 'auto', got 'fast'$"),
    ({"memory_budget": -5}, r"^memory_budget must be a positive number of bytes, got -5$"),
    ({"reuse": "always"}, r"^reuse must be one of \('concurrent', 'sequential', 'none'\), got 'always'$"),
    ({"rpc_key": "h100"}, r"^measuring through an RPC tracker needs both"),
    ({"kernels": "vendor"}, r"^kernels='vendor' \(cuDNN / cuBLAS and our kernels\) need a CUDA target; use kernels='tvm' "
                            r"for llvm$"),
    ({"kernels": "best"}, r"^kernels='best' \(cuDNN / cuBLAS and our kernels\) need a CUDA target; use kernels='tvm' "
                          r"for llvm$"),
    ({"max_stream": 2}, r"^unknown build option 'max_stream'; the options are allow_tf32, batch_sizes, buckets, compile_kernels, "),
]


@pytest.mark.parametrize("options,message", BAD, ids=[f"{k}={v}" for o, _ in BAD for k, v in list(o.items())[:1]])
def test_a_bad_option_is_one_line_before_anything_is_built(options, message):
    with pytest.raises(NimbleError, match=message) as err:
        build(zoo.get_model("inception"), "llvm", **options)
    assert "\n" not in str(err.value)


def test_options_are_frozen_and_replace_keeps_them_checked():
    opts = BuildOptions.create("llvm", max_streams=2)
    with pytest.raises(Exception):
        opts.max_streams = 3
    assert opts.replace(max_streams=None).max_streams is None and opts.max_streams == 2
    with pytest.raises(NimbleError, match="max_streams must be"):
        opts.replace(max_streams=-1)


def test_the_command_line_reports_a_bad_option_in_one_line(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(zoo.get_model("inception", blocks=1, hw=8).SerializeToString())
    from cli_runner import run_cli

    r = run_cli("explain", str(path), "--providers", "cutlass")
    assert r.returncode == 1
    from tvm_nimble.relay_passes import providers

    known = tuple(n for n in providers.names() if n != providers.TVM)
    assert "cublaslt" in known and "cudnn" in known
    assert r.stderr.strip().splitlines() == [f"tvm-nimble: error: providers must be names among {known}, got 'cutlass'"]


def test_plus_a_name_adds_a_provider_to_the_default_ones():
    from tvm_nimble.relay_passes import providers

    defaults = tuple(p.name for p in providers.offloading("cuda"))
    assert "tf32x3" not in defaults and "cublaslt" in defaults
    cuda = {"kind": "cuda", "arch": "sm_90"}
    assert BuildOptions(target=cuda, providers=("+tf32x3",)).providers == defaults + ("tf32x3",)
    assert BuildOptions(target=cuda, providers="+tf32x3").providers == defaults + ("tf32x3",)
    with pytest.raises(NimbleError, match="not both"):
        BuildOptions(target=cuda, providers=("cublaslt", "+tf32x3"))
    with pytest.raises(NimbleError, match="got 'cutlass'"):
        BuildOptions(target=cuda, providers=("+cutlass",))


def test_float16_as_a_build_option_matches_the_reference_to_fp16_precision():
    model = zoo.get_model("inception")
    inputs = zoo.random_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, inputs)[0]
    other = ReferenceEvaluator(model).run(None, zoo.random_inputs(model, seed=1))[0]
    result = build(model, "llvm", precision="float16", max_streams=None)
    assert result.report.options.precision == "fp16"
    assert any(t.dtype == "float16" for t in result.plan.tensors)
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    assert out.dtype == np.float32  # inputs and outputs stay float32
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < 1e-2 and np.linalg.norm(other - ref) / np.linalg.norm(ref) > 20 * err
