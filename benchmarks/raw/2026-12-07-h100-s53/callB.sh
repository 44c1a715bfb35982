# ran as: bash benchmarks/raw/2026-12-07-h100-s53/callB.sh (the staging call's machine, still warm; carrying .device and .device-extra; 455 s, its first bench step cut by its step limit)
# session 53, device call B (#52): the 0.5B decoder's RMSNorm kernel under each row schedule alone, its GEMMs'
# heuristic cuBLASLt candidates against the whole configuration space, then the model at 512 tokens fp16 as built (programmatic edges kept now) and
# with the fastest row schedule (NIMBLE_ROW_THREADS), each against torch.compile in the same process; the tiny
# decoders' generated tokens against PyTorch (the decode step's head now writes the float32 logits itself)
. .device/setup.sh >/dev/null 2>&1
T0=$(date +%s)
SKIP=tvm-vm,tvm-vm-cudagraph,torch-eager,torch-cudagraph,ort-cuda,ort-cuda-graph,tensorrt
DEADLINE=420 OUT=$OUT bash scripts/gpu_session.sh \
  "experiment row_norm_schedules 60 --cases llama_rms_512,llama_rms_128,gpt2_ln_512" \
  "gputests 80 -k generated_tokens_match" \
  "experiment cublaslt_search 90 --dtypes f16" \
  "bench 175 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip $SKIP"
T=$(python3 - <<'PY'
import json
rows = [r for r in json.load(open("/tmp/nimble-work/row_norm_schedules/row_norm_schedules.json"))
        if r["case"] == "llama_rms_512" and "us" in r and r["schedule"] != "build (DLight)"
        and (r["schedule"].startswith("block of") or r["schedule"] == "warp a row, 2 a block")]
best = min(rows, key=lambda r: r["us"])
print(32 if best["schedule"].startswith("warp") else best["schedule"].split()[2])
PY
)
echo "${T:-256}" > /tmp/nimble-work/row_threads  # for call C
echo "row threads for the second bench: ${T:-256}" | tee -a $OUT/session.log
cp /tmp/nimble-work/bench/results.csv $OUT/results-default.csv 2>/dev/null
NIMBLE_ROW_THREADS=${T:-256} DEADLINE=$(( 565 - ($(date +%s) - T0) )) OUT=$OUT bash scripts/gpu_session.sh \
  "bench 180 --models hf:llama-0.5b@512 --precision fp16 --kernels best --merge auto --skip $SKIP"
cp /tmp/nimble-work/bench/results.csv $OUT/results.csv 2>/dev/null
cp /tmp/nimble-work/row_norm_schedules/row_norm_schedules.json /tmp/nimble-work/cublaslt_search/cublaslt_search.json $OUT/ 2>/dev/null
grep -E "^== rc|row threads|passed|failed" $OUT/session.log | cut -c1-200
grep -E "rel L2|^[a-z_0-9]+ +(build|block|warp)" $OUT/session.log | grep -E "llama_rms|gpt2_ln" | cut -c1-120
grep -E "^(qkv|o_proj|gate_up|down|lm_head) |heuristic first|heuristic best|search best" $OUT/session.log | cut -c1-150
grep -E "stream cap|build seconds|batch 1: nimble" $OUT/session.log | cut -c1-330 | tail -8
