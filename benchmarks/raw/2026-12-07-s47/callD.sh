# session 47, device call D (call A's machine, warm; after call C's attention_check): the decoder's mask as one row of
# keys with cuDNN's causal mask (provider cudnn_key_mask) against the whole plane, GPT-2 fp16 at 512 tokens and the
# 0.5B decoder fp16 at 512 (merged), Nimble's systems only, each build twice in one process per model: without, with
P=cudnn,cudnn_graph,depthwise,cudnn_sdpa,cudnn_bias_sdpa,attention,attention_split,attention_tile,attention_cluster,attention_append,attention_rope,gemv_glu,gemv_norm,gemv,cublaslt,simt_gemm
SKIP=tvm-vm,tvm-vm-cudagraph,torch-eager,torch-cudagraph,torch-compile,ort-cuda,ort-cuda-graph,tensorrt,nimble-multi-stream-nograph
. .device/setup.sh >/dev/null 2>&1
DEADLINE=${DEADLINE:-585} OUT=$OUT bash scripts/gpu_session.sh \
  "bench 120 --models hf:gpt2@512 --precision fp16 --kernels best --skip $SKIP" \
  "bench 90 --models hf:gpt2@512 --precision fp16 --kernels best --skip $SKIP --providers $P,cudnn_key_mask" \
  "bench 150 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip $SKIP" \
  "bench 120 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip $SKIP --providers $P,cudnn_key_mask"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
grep -E "nimble-auto|nimble-single|stream cap|build seconds" $OUT/session.log | cut -c1-300 | tail -30
