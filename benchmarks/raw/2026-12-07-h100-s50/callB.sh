# ran as: bash benchmarks/raw/2026-12-07-h100-s50/callB.sh (the machine of call A, still warm)
# session 50, device call B: tf32x3's accuracy (gemm_3xtf32 at 512 rows, both orders; the tiny decoders' three_tf32
# test), never run on a GPU; the bucketed executor's queued copies; the 0.5B decoder at 512 tokens in fp16 again (call
# A's torch.compile ran 3.13 ms where sessions 48-49 had 2.49-2.58), then in bf16 with what is left (merge auto)
. .device/setup.sh >/dev/null 2>&1
START=$(date +%s)
DEADLINE=110 OUT=$OUT bash scripts/gpu_session.sh "experiment gemm_3xtf32 100 gpt2_512,llama_512"
mv $OUT/session.log $OUT/session1.log
timeout 120 python3 -m pytest -v -m gpu tests/gpu/test_gpu_decoders.py tests/gpu/test_gpu_buckets.py \
  -p no:cacheprovider -k "three_tf32 or bucket" > $OUT/gputests.log 2>&1
echo "gputests rc=$? after $(( $(date +%s) - START )) s"
LEFT=$(( 570 - ($(date +%s) - START) ))
DEADLINE=$LEFT OUT=$OUT bash scripts/gpu_session.sh \
  "bench 150 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt" \
  "bench 230 --models hf:llama-0.5b@512 --precision bf16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "err|x |rc=" $OUT/session1.log | cut -c1-220 | tail -16
grep -E "PASS|FAIL|Error|passed|failed" $OUT/gputests.log | cut -c1-200 | tail -14
grep -E "hf-llama|nimble-auto|torch-compile|torch-cudagraph|rc=|rror" $OUT/session.log 2>/dev/null | cut -c1-250 | tail -20
