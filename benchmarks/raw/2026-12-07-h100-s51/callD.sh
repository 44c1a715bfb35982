# ran as: this command (the machine of calls A-C, still warm; carrying .device and .device-extra), with the device time left
# session 51, device call D: #55's first build on a fresh machine's cache (--first-build: the vendor extension compiled
# in the build) of inception_v3 fp16 and resnet50 at batch 32 fp16
. .device/setup.sh >/dev/null 2>&1; DEADLINE=300 OUT=$OUT bash scripts/gpu_session.sh "experiment build_times 140 --models tv:inception_v3 --kernels best --precision fp16 --first-build" "experiment build_times 150 --models tv:resnet50 --batch 32 --kernels best --precision fp16 --first-build" >/dev/null 2>&1; cp /tmp/nimble-work/build_times/build_times.json $OUT/; grep -E "^cold|^warm|rc=" $OUT/session.log | cut -c1-400
