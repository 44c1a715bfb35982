# session 45, device call A: the vendor extension (comes back as vendor-KEY.so); DLight's schedules in the process
# against the schedule pool (#55); the 0.5B decoder at 512 tokens in fp16 and bf16 against every peer (#52)
. .device/setup.sh >/dev/null 2>&1
DEADLINE=585 OUT=$OUT bash scripts/gpu_session.sh "vendor 110" \
  "experiment schedule_pool 60 --models zoo:densenet121,tv:googlenet" \
  "bench 260 --models hf:llama-0.5b@512 --precision fp16 --kernels best --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,tensorrt" \
  "bench 230 --models hf:llama-0.5b@512 --precision bf16 --kernels best --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
tail -5 $OUT/session.log
