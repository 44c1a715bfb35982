# ran as: bash benchmarks/raw/2026-12-07-h100-s51/callB.sh (the machine of call A, still warm; carrying .device and .device-extra)
# session 51, device call B: #52's 0.5B decoder at 512 tokens in bf16 against the PyTorch peers again, then in fp32 on
# tf32x3 (--providers +tf32x3: three TF32 products where they measure faster than SGEMM), its error against PyTorch's
# fp32 and the peers' (never measured in a bench row)
. .device/setup.sh >/dev/null 2>&1
DEADLINE=570 OUT=$OUT bash scripts/gpu_session.sh \
  "bench 250 --models hf:llama-0.5b@512 --precision bf16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt" \
  "bench 300 --models hf:llama-0.5b@512 --precision fp32 --kernels best --merge auto --providers +tf32x3 --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "hf-llama|nimble-auto|torch-compile|torch-cudagraph|build seconds|kernel choice|rc=|rror" $OUT/session.log | cut -c1-250 | tail -24
