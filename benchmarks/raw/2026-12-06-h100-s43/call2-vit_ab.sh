#!/usr/bin/env bash
# GPU machine, after `. .device/setup.sh`, from the project root (#51's vit_small fp16 regression): the vendor
# extension of the current tree and of c87876a (.device-old, session 31's good row) built side by side, then
# vit_small fp16 (kernels best, batch 1, checked against PyTorch fp32, PyTorch's CUDA graph beside it) benched by
# c87876a, the current tree, and the current tree with NIMBLE_PDL=0, each with its own cache: one cold round, one
# warm round; last, googlenet fp16's cold build under cProfile (#55) if time is left. Logs to $OUT/ab.tgz.
set -u
T0=$(date +%s); BUDGET=${BUDGET:-570}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
R=/tmp/ab-out; mkdir -p $R
rm -rf /tmp/ab-new /tmp/ab-old /tmp/ab-nopdl
mkdir -p /tmp/ab-new /tmp/ab-old
OLDPP=$PWD/.device-old:$PYTHONPATH
TVM_NIMBLE_CACHE_DIR=/tmp/ab-new python3 -c "from tvm_nimble.codegen.vendor_build import build_vendor_library as b; print(b('sm_90'))" > $R/vendor-new.log 2>&1 &
TVM_NIMBLE_CACHE_DIR=/tmp/ab-old PYTHONPATH=$OLDPP python3 -c "from tvm_nimble.codegen.vendor_build import build_vendor_library as b; print(b('sm_90'))" > $R/vendor-old.log 2>&1 &
wait
echo "vendor builds (both, side by side): $(( $(date +%s) - T0 )) s"; tail -n1 $R/vendor-new.log $R/vendor-old.log
cp -r /tmp/ab-new /tmp/ab-nopdl
SKIP=tvm-vm,tvm-vm-cudagraph,torch-eager,torch-compile,ort-cuda,ort-cuda-graph,tensorrt
run() {  # run ROUND SIDE
  local round=$1 side=$2 pp=$PYTHONPATH cache=/tmp/ab-new pdl=1
  [[ $side == old ]] && { pp=$OLDPP; cache=/tmp/ab-old; }
  [[ $side == nopdl ]] && { cache=/tmp/ab-nopdl; pdl=0; }
  local t; t=$(left); (( t > 200 )) && t=200
  if (( t < 40 )); then echo "skipped $round $side (no time)"; return; fi
  local s; s=$(date +%s)
  NIMBLE_PDL=$pdl TVM_NIMBLE_CACHE_DIR=$cache PYTHONPATH=$pp timeout -s INT -k 10 $t python3 -m tvm_nimble.cli bench \
    --target cuda --models timm:vit_small_patch16_224 --precision fp16 --kernels best --batch 1 --skip $SKIP \
    --out $R/bench-$round-$side > $R/bench-$round-$side.log 2>&1
  echo "bench $round $side: rc=$? $(( $(date +%s) - s )) s"
  grep -E "^  *nimble|torch-cudagraph|^streams|stream choice|edges" $R/bench-$round-$side.log | head -12
}
for round in cold warm; do for side in old new nopdl; do run $round $side; done; done
if (( $(left) > 150 )); then
  s=$(date +%s)
  BUILD_PROFILE=1 TVM_NIMBLE_CACHE_DIR=/tmp/ab-new timeout -s INT -k 10 $(( $(left) - 10 )) python3 scripts/experiments/build_times.py \
    --models tv:googlenet --kernels best --precision fp16 --out $R/build_times > $R/build_times.log 2>&1
  echo "build_times googlenet fp16: rc=$? $(( $(date +%s) - s )) s"; tail -n 25 $R/build_times.log | grep -v "^ *[0-9]* *[0-9.]* *[0-9.]* *[0-9.]* *[0-9.]* " | tail -8
fi
tar czf $OUT/ab.tgz -C $R .
