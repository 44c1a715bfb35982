"""The decoders on the GPU (issue #52): tiny GPT-2 and Llama-style models, as the bench exports them, built with the
vendor kernels and with the measured choice in every precision, against PyTorch's float32 output of the same
weights; the attention runs fused (causal mask, grouped-query K/V read per KV head); a fully masked row (left
padding) gives no NaN."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

BOUND = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 1e-1}  # relative L2 against PyTorch fp32
_models = {}


def _model(spec):
    if spec not in _models:
        import torch

        from tvm_nimble.bench.hf_models import hf_builders

        _, onnx_builder, torch_builder = hf_builders(spec)
        module = torch_builder(1)
        _models[spec] = (onnx_builder(1), module, torch)
    return _models[spec]


def _rel(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("kernels", ["vendor", "best", "cudnn-mask", "cudnn-key-mask"])
@pytest.mark.parametrize("precision", list(BOUND))
@pytest.mark.parametrize("spec", ["hf:gpt2-tiny@40", "hf:llama-tiny@40"])
def test_decoders_match_pytorch_with_their_attention_fused(gpu_arch, spec, precision, kernels):
    """``cudnn-mask``: every attention on cuDNN's SDPA with the mask (provider cudnn_bias_sdpa, which kernels="best"
    measures against ours), the GEMMs on cuBLASLt; ``cudnn-key-mask``: the same with the padding as one row of keys and
    cuDNN's causal mask part of the call (provider cudnn_key_mask), left padding included."""
    from tvm_nimble import NimbleExecutor, build, zoo
    from tvm_nimble.contract import vendor_abi

    if kernels.startswith("cudnn") and precision == "fp32":
        pytest.skip("cuDNN's SDPA is fp16/bf16")
    model, module, torch = _model(spec)
    feeds = zoo.random_inputs(model, seed=0)
    with torch.no_grad():
        expected = module(*[torch.from_numpy(v) for v in feeds.values()]).numpy().astype(np.float64)
    target = {"kind": "cuda", "arch": gpu_arch}
    if kernels.startswith("cudnn"):
        keys = kernels == "cudnn-key-mask"
        result = build(model, target, kernels="vendor", precision=precision,
                       providers=("cudnn_bias_sdpa", "cublaslt") + (("cudnn_key_mask",) if keys else ()))
        attention = [l.kernel for l in result.plan.launches if l.kernel.startswith(vendor_abi.ATTENTION.prefix)]
        # the exports' mask is causal whatever the inputs: the variant with cuDNN's causal mask on top, or (keys) with
        # cuDNN's causal mask and the padding alone
        assert attention and set(attention) == {vendor_abi.ATTENTION_CUDNN_KEY_CAUSAL_SDPA if keys
                                                else vendor_abi.ATTENTION_CUDNN_BIAS_CAUSAL_SDPA}, attention
    else:
        result = build(model, target, kernels=kernels, precision=precision)
    if kernels == "vendor":
        assert any(l.kernel.startswith("nimble.attention") for l in result.plan.launches), "attention not fused"
    left_padded = dict(feeds, attention_mask=np.concatenate([np.zeros((1, 4), np.int64),
                                                             np.ones((1, feeds["attention_mask"].shape[1] - 4),
                                                                     np.int64)], axis=1))
    with NimbleExecutor(result) as ex:
        got = ex(*feeds.values())[0].numpy()
        assert _rel(got, expected) < BOUND[precision]
        padded = ex(*left_padded.values())[0].numpy()
    assert np.isfinite(padded).all(), "a fully masked row gave NaN or infinity"
    with torch.no_grad():
        ref_padded = module(*[torch.from_numpy(v) for v in left_padded.values()]).numpy().astype(np.float64)
    assert _rel(padded[:, 4:], ref_padded[:, 4:]) < BOUND[precision]  # the real positions


@pytest.mark.parametrize("spec", ["hf:gpt2-tiny@40", "hf:llama-tiny@40"])
def test_float32_decoders_on_three_tf32_products_keep_float32_accuracy(gpu_arch, spec):
    """Provider tf32x3 (every Linear of 16 rows or more as three TF32 products in one cuBLASLt call) against PyTorch's
    float32: within 1e-5 (one TF32 product is ~1e-3 off); the calls are in the plan."""
    from tvm_nimble import NimbleExecutor, build, zoo
    from tvm_nimble.relay_passes.providers import tf32x3

    model, module, torch = _model(spec)
    feeds = zoo.random_inputs(model, seed=0)
    with torch.no_grad():
        expected = module(*[torch.from_numpy(v) for v in feeds.values()]).numpy().astype(np.float64)
    result = build(model, {"kind": "cuda", "arch": gpu_arch}, kernels="vendor", precision="fp32",
                   providers=("tf32x3",))
    assert sum(l.kernel.startswith(tf32x3.PROVIDER.kernel_prefix) for l in result.plan.launches) >= 5
    with NimbleExecutor(result) as ex:
        assert _rel(ex(*feeds.values())[0].numpy(), expected) < 1e-5
