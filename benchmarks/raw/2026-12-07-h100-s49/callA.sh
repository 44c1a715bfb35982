# ran as: BUDGET=500 bash benchmarks/raw/2026-12-07-h100-s49/callA.sh (after staging.sh; carrying .device and .device-extra)
# session 49, device call A (the one call this session's device time left room for after failed starts): the vendor
# extension; the GPU tests of the code no GPU has run yet (the vectorized element-wise schedule, gathers fused with
# their neighbours, the bucketed executor's queued copies, tf32x3 on the tiny decoders; the tiny decoders with kernels
# best and their generated tokens); then, with what is left, the 0.5B decoder at 512 tokens in fp16 against the
# PyTorch peers (#52's short row; ONNX Runtime not staged: it was 1.5x behind torch.compile on this row in session 48)
. .device/setup.sh >/dev/null 2>&1
START=$(date +%s)
DEADLINE=120 OUT=$OUT bash scripts/gpu_session.sh "vendor 110"
mv $OUT/session.log $OUT/session1.log
timeout 170 python3 -m pytest -q -m gpu tests/gpu/test_gpu_schedules.py tests/gpu/test_gpu_buckets.py \
  tests/gpu/test_gpu_decoders.py tests/gpu/test_gpu_generate.py -p no:cacheprovider \
  -k "vectorized or bucket or three_tf32 or best or generated_tokens" > $OUT/gputests.log 2>&1
echo "gputests rc=$? after $(( $(date +%s) - START )) s"
LEFT=$(( ${BUDGET:-560} - ($(date +%s) - START) ))
echo "bench gets $LEFT s"
[ $LEFT -gt 150 ] && DEADLINE=$LEFT OUT=$OUT bash scripts/gpu_session.sh \
  "bench $(( LEFT - 10 )) --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "vendor ext|rc=" $OUT/session1.log | cut -c1-200 | tail -5
grep -E "passed|failed|FAILED|Error" $OUT/gputests.log | cut -c1-300 | tail -12
grep -E "hf-llama|nimble-auto|torch-compile|torch-cudagraph|rc=|rror" $OUT/session.log 2>/dev/null | cut -c1-250 | tail -20
