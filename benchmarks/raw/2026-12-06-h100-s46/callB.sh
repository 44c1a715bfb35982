# session 46, device call B (call A's machine, warm): the 0.5B decoder at 512 tokens in fp16 and bf16 with
# merge=auto (Q/K/V and gate/up merged where measured faster) and the logits written float32 by the head's GEMM,
# every peer side by side (#52)
. .device/setup.sh >/dev/null 2>&1
DEADLINE=${DEADLINE:-585} OUT=$OUT bash scripts/gpu_session.sh \
  "bench 300 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,tensorrt" \
  "bench 250 --models hf:llama-0.5b@512 --precision bf16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
tail -30 $OUT/session.log
# ran as: DEADLINE=470 bash benchmarks/raw/2026-12-06-s46/callB.sh
