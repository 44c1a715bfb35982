# ran as: this command (call A's machine, warm; 164 s of device time left): the vectorized SiLU-multiply's GPU test
# alone, its -k naming the decoders' precisions wrongly (fp16, not float16: none of them ran)
. .device/setup.sh >/dev/null 2>&1; timeout 130 python3 -m pytest -v -m gpu tests/gpu/test_gpu_schedules.py tests/gpu/test_gpu_decoders.py -p no:cacheprovider -k "vectorized or (best and gpt2 and float16) or (best and llama and bfloat16)" 2>&1 | grep -E "PASS|FAIL|ERROR|passed|failed|Error" | cut -c1-250 | tail -20
# output:
# tests/gpu/test_gpu_schedules.py::test_a_vectorized_silu_multiply_matches_numpy[float32] PASSED [ 33%]
# tests/gpu/test_gpu_schedules.py::test_a_vectorized_silu_multiply_matches_numpy[float16] PASSED [ 66%]
# tests/gpu/test_gpu_schedules.py::test_a_vectorized_silu_multiply_matches_numpy[bfloat16] PASSED [100%]
# ================ 3 passed, 26 deselected, 6 warnings in 13.20s =================
