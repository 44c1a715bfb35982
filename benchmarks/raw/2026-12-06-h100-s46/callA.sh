# session 46, device call A: the vendor extension; prompts of 8..512 tokens, 2,000 requests at batch 1 (#52): GPT-2
# fp16, one bucketed artifact against PyTorch with a CUDA graph per bucket, torch.compile with dynamic shapes and ONNX
# Runtime on the dynamic-shape export; the 0.5B decoder at 512 tokens, fp16, kernel by kernel with Q/K/V and gate/up
# merged and the logits written float32 by the head's GEMM
. .device/setup.sh >/dev/null 2>&1
DEADLINE=585 OUT=$OUT bash scripts/gpu_session.sh "vendor 110" \
  "experiment length_distribution 260 --models hf:gpt2 --precision fp16" \
  "experiment kernel_profile 190 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge on"
tail -45 $OUT/session.log
