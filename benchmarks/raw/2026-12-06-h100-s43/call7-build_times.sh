#!/usr/bin/env bash
# GPU machine, after `. .device/setup.sh`, from the project root (#55): the vendor extension built once on a fresh
# machine (timed), then `build_times` (each build in a fresh process, an empty cache but for the extension, cold
# then warm) of fp16 builds at batch 1 and 32, kernels best, code f3cb956 (fp16 PTX merging, numpy constant
# folding, the accuracy reference compiled by a child process). BUDGET: seconds for the whole script.
set -u
T0=$(date +%s)
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - T0) )); }
pack() {
  mkdir -p /tmp/btout; cp /tmp/bt1.log /tmp/bt32.log /tmp/btout/ 2>/dev/null
  cp /tmp/bt1/build_times.json /tmp/btout/bt1.json 2>/dev/null; cp /tmp/bt32/build_times.json /tmp/btout/bt32.json 2>/dev/null
  tar czf $OUT/bt.tgz -C /tmp/btout .
}
python3 -c "import time
from tvm_nimble.codegen.vendor_build import build_vendor_library
t = time.perf_counter(); p = build_vendor_library('sm_90'); print(f'vendor extension: {time.perf_counter() - t:.1f} s wall')"
timeout -s INT $(( $(left) - 10 )) python3 scripts/experiments/build_times.py \
  --models tv:googlenet,tv:inception_v3,tv:resnet50,timm:vit_small_patch16_224 \
  --kernels best --precision fp16 --batch 1 --out /tmp/bt1 > /tmp/bt1.log 2>&1
pack; echo "batch 1 rc=$? done at $(( $(date +%s) - T0 )) s"; grep -h "^cold\|^warm" /tmp/bt1.log | cut -c1-330; grep -A5 "^model" /tmp/bt1.log | head -5
if (( $(left) > 90 )); then
  timeout -s INT $(( $(left) - 10 )) python3 scripts/experiments/build_times.py --models tv:resnet50 \
    --kernels best --precision fp16 --batch 32 --out /tmp/bt32 > /tmp/bt32.log 2>&1
  pack; echo "batch 32 rc=$? at $(( $(date +%s) - T0 )) s"; grep -h "^cold\|^warm" /tmp/bt32.log | cut -c1-330
fi
