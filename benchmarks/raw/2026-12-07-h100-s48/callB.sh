# ran as: DEADLINE=575 bash benchmarks/raw/2026-12-07-h100-s48/callB.sh
# session 48, device call B (call A's machine, warm): the 0.5B decoder at 512 tokens in bf16 (PyTorch peers); prompts
# of 8..512 tokens at batch 1 (#52): GPT-2 fp16, one bucketed artifact against PyTorch with a CUDA graph per bucket,
# torch.compile with dynamic shapes and ONNX Runtime on the dynamic-shape export, the timed loop cut at 150 s
. .device/setup.sh >/dev/null 2>&1
DEADLINE=${DEADLINE:-585} OUT=$OUT bash scripts/gpu_session.sh \
  "bench 220 --models hf:llama-0.5b@512 --precision bf16 --kernels best --merge auto --skip tvm-vm,tvm-vm-cudagraph,torch-eager,ort-cuda,ort-cuda-graph,tensorrt" \
  "experiment length_distribution 340 --models hf:gpt2 --precision fp16 --max-seconds 150"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "hf-llama|nimble-auto|torch-compile|torch-cudagraph|rc=|p50|p99" $OUT/session.log | cut -c1-250 | tail -40
