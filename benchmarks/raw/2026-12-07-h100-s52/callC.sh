# ran as: this command (the machine of calls A and B, still warm; carrying .device and .device-extra), with the device time left (cut at 260 s: gpt2's warm build did not finish)
# session 52, device call C: #55's first builds (--first-build) of hf:bert-base and hf:gpt2 in fp16
. .device/setup.sh >/dev/null 2>&1; DEADLINE=245 OUT=$OUT bash scripts/gpu_session.sh "experiment build_times 230 --models hf:bert-base,hf:gpt2 --kernels best --precision fp16 --first-build" >/dev/null 2>&1; cp /tmp/nimble-work/build_times/build_times.json $OUT/; grep -E "^cold|^warm|rc=" $OUT/session.log | cut -c1-330
