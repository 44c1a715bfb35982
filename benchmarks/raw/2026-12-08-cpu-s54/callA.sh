# prepared in session 54 (no device machine was lent), not run: the next session's first call after the staging
# (carrying .device and .device-extra), on the fresh machine:
#   1. the whole vendor extension compiled on the fresh machine's cores (the units split in session 54: before,
#      29.7 s in session 52's call, 60.2 s in session 50's), then the kernels whose units moved checked against
#      float64 (the tile attention and the GEMV per dtype, the fp32 GEMM's two kernel kinds);
#   2. #53: the tiny decoders' generated tokens in 16 bits (the decode step's head writes the float32 logits itself);
#   3. #52: the 0.5B decoder at 512 tokens fp16 with the bias-free cuBLASLt GEMMs (b0f25a8), against torch.compile.
. .device/setup.sh >/dev/null 2>&1
SKIP=tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt
DEADLINE=570 OUT=$OUT bash scripts/gpu_session.sh \
  "vendor 90" \
  "experiment attention_check 60" \
  "experiment gemv_check 50" \
  "experiment gemm_simt_check 60" \
  "gputests 60 -k generated_tokens_match" \
  "bench 210 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip $SKIP"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "^== rc|whole vendor|passed|failed" $OUT/session.log | cut -c1-200
grep -E "worst|FAIL|max rel" $OUT/session.log | cut -c1-160 | tail -12
grep -E "stream cap|build seconds|batch 1: nimble" $OUT/session.log | cut -c1-330 | tail -4
