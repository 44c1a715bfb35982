# ran as: DEADLINE=395 bash benchmarks/raw/2026-12-07-h100-s48/callD2.sh
# session 48, device call D2 (the same machine, warm): the 0.5B decoder in fp32 at 512 tokens (its float32 export is
# over 2 GB), every peer side by side (#52's fp32 rows, never measured)
. .device/setup.sh >/dev/null 2>&1
DEADLINE=${DEADLINE:-400} OUT=$OUT bash scripts/gpu_session.sh \
  "bench 370 --models hf:llama-0.5b@512 --precision fp32 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,tensorrt"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "hf-llama|nimble-auto|torch-compile|torch-cudagraph|ort-cuda-graph|rc=|rror" $OUT/session.log | cut -c1-250 | tail -30
