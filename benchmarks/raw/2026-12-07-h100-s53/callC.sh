# to run as (not run in session 53: no device time left): bash benchmarks/raw/2026-12-07-h100-s53/callC.sh (call B's machine, still warm; carrying .device and .device-extra)
# session 53, device call C: #52's 0.5B decoder at 512 tokens in bf16 as built and with call B's fastest row schedule
# (NIMBLE_ROW_THREADS), each against the PyTorch peers in the same process; #55's cold builds of a Swin- and a
# ConvNeXt-class timm model in fp16 (the vendor extension already built on this machine)
. .device/setup.sh >/dev/null 2>&1
T0=$(date +%s)
SKIP=tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt
T=$(cat /tmp/nimble-work/row_threads 2>/dev/null)  # call B's fastest row schedule
echo "row threads: ${T:-256}" | tee -a $OUT/session.log
DEADLINE=190 OUT=$OUT bash scripts/gpu_session.sh \
  "bench 175 --models hf:llama-0.5b@512 --precision bf16 --kernels best --merge auto --skip $SKIP"
cp /tmp/nimble-work/bench/results.csv $OUT/results-default.csv 2>/dev/null
NIMBLE_ROW_THREADS=${T:-256} DEADLINE=190 OUT=$OUT bash scripts/gpu_session.sh \
  "bench 175 --models hf:llama-0.5b@512 --precision bf16 --kernels best --merge auto --skip $SKIP"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
DEADLINE=$(( 570 - ($(date +%s) - T0) )) OUT=$OUT bash scripts/gpu_session.sh \
  "experiment build_times 200 --models timm:swin_tiny_patch4_window7_224,timm:convnext_tiny --kernels best --precision fp16"
cp /tmp/nimble-work/build_times/build_times.json $OUT/ 2>/dev/null
grep -E "^== rc|row threads" $OUT/session.log | cut -c1-200
grep -E "stream cap|build seconds|batch 1: nimble" $OUT/session.log | cut -c1-330 | tail -6
grep -E "^cold|^warm" $OUT/session.log | cut -c1-250 | tail -6
