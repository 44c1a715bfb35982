# session 45, device call B: prompts of varying length with the per-bucket PyTorch CUDA-graph peer (#52)
. .device/setup.sh >/dev/null 2>&1
DEADLINE=${DEADLINE:-570} OUT=$OUT bash scripts/gpu_session.sh \
  "experiment length_distribution 540 --models hf:gpt2 --precision fp16"
cp /tmp/nimble-work/length_distribution/length_distribution.json $OUT/ 2>/dev/null
tail -5 $OUT/session.log
