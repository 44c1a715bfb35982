# ran as: bash benchmarks/raw/2026-12-07-h100-s50/callA.sh (its bench rows are in callB-results.csv, the same machine's bench folder) (after staging.sh on the same machine; carrying .device and .device-extra)
# session 50, device call A: the vendor extension; the GPU tests of the vectorized element-wise schedule (the
# SiLU-multiply as a model at batch 1 has it, the rotary embedding's branch); the 0.5B decoder at 512 tokens fp16
# (merge auto) against the PyTorch peers, now that its SiLU-multiply and rotary embedding are vectorized (session 49's
# build kept DLight's Fallback for both: the unit batch axis failed the check); then kernel by kernel
. .device/setup.sh >/dev/null 2>&1
START=$(date +%s)
DEADLINE=120 OUT=$OUT bash scripts/gpu_session.sh "vendor 110"
mv $OUT/session.log $OUT/session1.log
timeout 90 python3 -m pytest -v -m gpu tests/gpu/test_gpu_schedules.py -p no:cacheprovider > $OUT/gputests.log 2>&1
echo "gputests rc=$? after $(( $(date +%s) - START )) s"
LEFT=$(( 570 - ($(date +%s) - START) ))
DEADLINE=$LEFT OUT=$OUT bash scripts/gpu_session.sh \
  "bench 230 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt" \
  "experiment kernel_profile 150 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge on"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
for f in /tmp/nimble-work/kernel_profile/*.json; do python3 -c "import lzma,shutil,sys; shutil.copyfileobj(open(sys.argv[1],'rb'), lzma.open(sys.argv[2],'wb'))" $f $OUT/$(basename $f).xz; done
grep -E "vendor ext|rc=" $OUT/session1.log | cut -c1-200 | tail -3
grep -E "PASS|FAIL|Error|passed|failed" $OUT/gputests.log | cut -c1-200 | tail -10
grep -E "hf-llama|nimble-auto|torch-compile|torch-cudagraph|rc=|rror" $OUT/session.log | cut -c1-250 | tail -24
