# session 45, device call 2 (same machine as call A, warm): DLight's schedules of densenet121's fp16 kernels in the
# process against the schedule pool's 15 workers (callA's schedule_pool step ran out of time importing torch for
# tv:googlenet after densenet121's row)
. .device/setup.sh >/dev/null 2>&1; timeout 100 python3 scripts/experiments/schedule_pool.py --models zoo:densenet121 --out $OUT/sp 2>&1 | tail -5; nproc
