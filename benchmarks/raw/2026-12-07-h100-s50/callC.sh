# ran as: bash benchmarks/raw/2026-12-07-h100-s50/callC.sh (after staging.sh on a fresh machine; carrying .device and .device-extra)
# session 50, device call C (the device time left after calls A and B): the tiny decoders in float32 on tf32x3 with
# the split's product rounded before its subtractions (call B measured one TF32 product's error, 2.6e-4)
. .device/setup.sh >/dev/null 2>&1
START=$(date +%s)
DEADLINE=80 OUT=$OUT bash scripts/gpu_session.sh "vendor 75"
grep -E "vendor ext|rc=" $OUT/session.log | cut -c1-160 | tail -2
timeout $(( ${BUDGET:-200} - ($(date +%s) - START) )) python3 -m pytest -v -m gpu tests/gpu/test_gpu_decoders.py \
  -p no:cacheprovider -k "three_tf32" > $OUT/gputests.log 2>&1
echo "gputests rc=$? after $(( $(date +%s) - START )) s"
grep -E "PASS|FAIL|^E  .*assert" $OUT/gputests.log | cut -c1-160 | tail -6
