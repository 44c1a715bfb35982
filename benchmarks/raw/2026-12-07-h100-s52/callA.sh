# ran as: bash benchmarks/raw/2026-12-07-h100-s52/callA.sh (after staging.sh on the same machine; carrying .device and .device-extra, .device/wheels without its xgboost wheel: the carry limit)
# session 52, device call A: the whole vendor extension's compile on a fresh machine; the kernels moved into units of
# their own in session 51 (depthwise / pool per dtype, split-key attention per dtype, the attention dispatch helper)
# against float64 PyTorch; the warp-per-row normalization schedule's GPU tests (and the vectorized ones beside them);
# then #52's 0.5B decoder at 512 tokens in fp16 against the PyTorch peers with it
. .device/setup.sh >/dev/null 2>&1
DEADLINE=575 OUT=$OUT bash scripts/gpu_session.sh "vendor 110" \
  "experiment depthwise_check 60" "experiment attention_check 60" "experiment append_check 45" \
  "gputests 80 -k gpu_schedules" \
  "bench 200 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "^== rc|wall|passed|failed|FAIL|Error|rror:" $OUT/session.log | cut -c1-200 | head -30
grep -iE "worst|all ok|mismatch|not ok| ok$" $OUT/session.log | cut -c1-160 | tail -12
grep -E "hf-llama|nimble-auto|torch-compile|torch-cudagraph|build seconds|kernel choice" $OUT/session.log | cut -c1-220 | tail -10
