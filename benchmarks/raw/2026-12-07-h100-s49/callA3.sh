# ran as: this command (the same machine, warm; cut off by its own 110-s timeout, 48 s of device time left after it)
. .device/setup.sh >/dev/null 2>&1; timeout 110 python3 -m pytest -v -m gpu tests/gpu/test_gpu_decoders.py tests/gpu/test_gpu_generate.py tests/gpu/test_gpu_buckets.py -p no:cacheprovider -k "(best and fp16) or (generated_tokens and gpt2) or bucket" 2>&1 | grep -E "PASS|FAIL|ERROR|passed|failed|Error" | cut -c1-250 | tail -20
# output (before the timeout):
# tests/gpu/test_gpu_decoders.py::test_decoders_match_pytorch_with_their_attention_fused[hf:gpt2-tiny@40-fp16-best] PASSED [ 16%]
# tests/gpu/test_gpu_decoders.py::test_decoders_match_pytorch_with_their_attention_fused[hf:llama-tiny@40-fp16-best] PASSED [ 33%]
# tests/gpu/test_gpu_generate.py::test_generated_tokens_match_pytorch[hf:gpt2-tiny-fp32] PASSED [ 50%]
