# session 47, device call A (after staging TVM and the cuDNN frontend, no ONNX Runtime): the vendor extension; prompts
# of 8..512 tokens, 2,000 requests at batch 1 (#52): GPT-2 fp16, one bucketed artifact against PyTorch with a CUDA graph
# per bucket and torch.compile with dynamic shapes, every request's time kept (where the 512 bucket's tail comes from);
# the 0.5B decoder at 512 tokens, fp16, merged, kernel by kernel (where the 2.29 ms go)
. .device/setup.sh >/dev/null 2>&1
DEADLINE=585 OUT=$OUT bash scripts/gpu_session.sh "vendor 110" \
  "experiment length_distribution 240 --models hf:gpt2 --precision fp16" \
  "experiment kernel_profile 220 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge on"
tail -45 $OUT/session.log
