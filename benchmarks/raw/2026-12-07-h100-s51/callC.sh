# ran as: BUDGET=370 bash benchmarks/raw/2026-12-07-h100-s51/callC.sh (the machine of calls A and B, still warm; carrying .device and .device-extra)
# session 51, device call C (what is left): #53's GPT-2 small decoding in fp16 (a 128-token prompt, 256 new tokens)
# against HF eager and HF static cache + torch.compile, with the decode step's prologue fused (71 -> 65 launches a
# step, never timed)
. .device/setup.sh >/dev/null 2>&1
DEADLINE=${BUDGET:-400} OUT=$OUT bash scripts/gpu_session.sh \
  "generate 380 --models hf:gpt2 --precision fp16 --kernels best --prompt 128 --new-tokens 256 --repeats 2 --skip ort-genai"
cp /tmp/nimble-work/generate/generation.csv $OUT/results.csv 2>/dev/null
grep -E "gpt2|ms/token|ms per token|tokens|rc=|rror" $OUT/session.log | cut -c1-250 | tail -20
