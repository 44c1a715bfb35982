# ran as: DEADLINE=580 bash benchmarks/raw/2026-12-07-h100-s48/callA.sh (after the staging calls: stage 1, the cuDNN frontend, ONNX Runtime in 8 parts)
# session 48, device call A (after staging TVM, the cuDNN frontend and ONNX Runtime): the vendor extension; the 0.5B
# decoder at 512 tokens in fp16 with merge=auto, now with the decoder's mask as one row of keys (cudnn_key_mask) and
# q/k rotated as one tensor (merge_heads), every peer side by side (#52); then its merged build kernel by kernel
. .device/setup.sh >/dev/null 2>&1
DEADLINE=${DEADLINE:-585} OUT=$OUT bash scripts/gpu_session.sh "vendor 110" \
  "bench 290 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,tensorrt" \
  "experiment kernel_profile 150 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge on"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "hf-llama|nimble-auto|torch-compile|ort-cuda-graph|torch-cudagraph|rc=|vendor ext" $OUT/session.log | cut -c1-250 | tail -30
