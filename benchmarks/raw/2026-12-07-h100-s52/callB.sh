# ran as: bash benchmarks/raw/2026-12-07-h100-s52/callB.sh (the machine of call A, still warm; carrying .device and .device-extra)
# session 52, device call B: #52's 0.5B decoder at 512 tokens kernel by kernel in fp16 (what is left to 1.3x, with the
# warp-per-row RMSNorm), and in bf16 against the PyTorch peers
. .device/setup.sh >/dev/null 2>&1
DEADLINE=575 OUT=$OUT bash scripts/gpu_session.sh \
  "experiment kernel_profile 200 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge on" \
  "bench 200 --models hf:llama-0.5b@512 --precision bf16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt" \
  "experiment build_times 150 --models timm:vit_small_patch16_224,hf:bert-base --kernels best --precision fp16 --first-build"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
cp /tmp/nimble-work/build_times/build_times.json $OUT/build_times.json 2>/dev/null
grep -E "^== rc" $OUT/session.log | cut -c1-200
grep -A40 "batch 1 (best kernels)" $OUT/session.log | cut -c1-200 | head -42
grep -E "hf-llama|nimble-auto|torch-compile|torch-cudagraph|build seconds" $OUT/session.log | cut -c1-220 | tail -8
grep -E "^cold|^warm" $OUT/session.log | cut -c1-250 | tail -6
