# session 45, device call 3 (same machine, warm; the vendor extension built by call A): googlenet fp16, kernels best,
# a cold build (an empty cache but the extension) and a warm one, each a fresh process, with the schedule pool and
# without it (NIMBLE_SCHEDULE_POOL=0), in that order
. .device/setup.sh >/dev/null 2>&1; for p in 1 0; do NIMBLE_SCHEDULE_POOL=$p timeout -s INT 88 python3 scripts/experiments/build_times.py --models tv:googlenet --kernels best --precision fp16 --batch 1 --out $OUT/bt$p > $OUT/bt$p.log 2>&1; echo "pool=$p rc=$?"; grep -h "^cold\|^warm\|^model\|googlenet" $OUT/bt$p.log | cut -c1-200 | head -6; done
