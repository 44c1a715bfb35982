# ran as: bash benchmarks/raw/2026-12-07-h100-s51/callA.sh (after staging.sh on the same machine; carrying .device and .device-extra)
# session 51, device call A (attention.cu split in two units: append_check after the first build): #55's first build on a fresh machine (googlenet fp16, kernels best, nothing cached, the
# vendor extension's units compiling beside the kernel choice), cold then warm, under cProfile, with every measured
# chain's provider and TVM times; then #52's 0.5B decoder at 512 tokens in fp16 against the PyTorch peers again (on
# this machine, to confirm session 50's 1.48x-1.54x against a torch.compile that ran slower than before)
. .device/setup.sh >/dev/null 2>&1
START=$(date +%s)
BUILD_PROFILE=1 DEADLINE=235 OUT=$OUT bash scripts/gpu_session.sh \
  "experiment build_times 220 --models tv:googlenet --kernels best --precision fp16 --first-build"
mv $OUT/session.log $OUT/session1.log
cp /tmp/nimble-work/build_times/build_times.json $OUT/build_times.json 2>/dev/null
cp /tmp/nimble-work/build_times/profile-cold-googlenet.txt $OUT/ 2>/dev/null
LEFT=$(( 570 - ($(date +%s) - START) ))
DEADLINE=$LEFT OUT=$OUT bash scripts/gpu_session.sh "experiment append_check 80" \
  "bench 300 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "rc=|^cold|^warm|^googlenet" $OUT/session1.log | cut -c1-300 | tail -8
grep -E "FAIL|fail|ok|rc=" $OUT/session.log | grep -v bench | cut -c1-200 | head -8
grep -E "hf-llama|nimble-auto|torch-compile|torch-cudagraph|build seconds|rc=|rror" $OUT/session.log | cut -c1-250 | tail -16
