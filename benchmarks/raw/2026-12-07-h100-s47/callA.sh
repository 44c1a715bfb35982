# ran as: DEADLINE=500 bash benchmarks/raw/2026-12-07-h100-s47/callA.sh (585 s of device time left after eleven failed starts)
# session 47, device call A (after staging TVM and the cuDNN frontend, no ONNX Runtime): the vendor extension; prompts
# of 8..512 tokens, 2,000 requests at batch 1 (#52): GPT-2 fp16, one bucketed artifact against PyTorch with a CUDA graph
# per bucket and torch.compile with dynamic shapes, every request's time kept (where the 512 bucket's tail comes from);
# the fused attention kernels checked and timed, with the new cudnn_key_causal_sdpa (a decoder's padding mask as one
# row of keys, cuDNN's causal mask part of the call) against cudnn_bias_causal_sdpa (the whole plane) and PyTorch's
# is_causal
. .device/setup.sh >/dev/null 2>&1
DEADLINE=${DEADLINE:-585} OUT=$OUT bash scripts/gpu_session.sh "vendor 110" \
  "experiment attention_check 80 --cases bert_base,gpt2_128,gpt2_512,qwen_gqa_128,qwen_gqa_512 --dtypes float16,bfloat16" \
  "experiment length_distribution 240 --models hf:gpt2 --precision fp16"
grep -E "^(gpt2_|qwen_)|cudnn_key_causal|is_causal|cudnn_bias_causal" $OUT/session.log | cut -c1-300 | tail -40
tail -25 $OUT/session.log | cut -c1-300
