# session 47, device call B (call A's machine, ONNX Runtime staged after it): the 0.5B decoder's fp32 rows at 128 and
# 512 tokens, every peer side by side (#52's last unmeasured precision)
. .device/setup.sh >/dev/null 2>&1
DEADLINE=${DEADLINE:-585} OUT=$OUT bash scripts/gpu_session.sh \
  "bench 300 --models hf:llama-0.5b@512 --precision fp32 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,tensorrt" \
  "bench 260 --models hf:llama-0.5b --precision fp32 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,tensorrt"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
tail -30 $OUT/session.log
