#!/usr/bin/env bash
# GPU machine, after `. .device/setup.sh`, from the project root: googlenet's cold builds (fp32, fp16, kernels
# best) by the current tree and by ad7d3d7 (.device-old), each with its own empty cache but its vendor extension
# built first, under cProfile; wall times and profiles to $OUT.
set -u
R=/tmp/ab-out; mkdir -p $R
NEW_CACHE=/tmp/ab-new; OLD_XDG=/tmp/ab-old
rm -rf $NEW_CACHE $OLD_XDG; mkdir -p $NEW_CACHE $OLD_XDG /tmp/ab-onnx
python3 -c "
import onnx
from tvm_nimble.cli.models import load_model
onnx.save(load_model('tv:googlenet')[1], '/tmp/ab-onnx/googlenet.onnx')" || exit 1
t0=$(date +%s)
TVM_NIMBLE_CACHE_DIR=$NEW_CACHE python3 -c "from tvm_nimble.codegen.vendor_build import build_vendor_library as b; print(b('sm_90'))" > $R/vendor-new.log 2>&1 &
XDG_CACHE_HOME=$OLD_XDG PYTHONPATH=$PWD/.device-old:$PYTHONPATH python3 -c "from tvm_nimble.codegen.vendor_build import build_vendor_library as b; print(b('sm_90'))" > $R/vendor-old.log 2>&1 &
wait
echo "vendor builds (both, side by side): $(( $(date +%s) - t0 )) s"; tail -1 $R/vendor-new.log $R/vendor-old.log
for prec in fp32 fp16; do
  for side in old new; do
    if [[ $side == new ]]; then envs="TVM_NIMBLE_CACHE_DIR=$NEW_CACHE"; pp=$PYTHONPATH; else envs="XDG_CACHE_HOME=$OLD_XDG"; pp=$PWD/.device-old:$PYTHONPATH; fi
    s=$(date +%s.%N)
    env $envs PYTHONPATH=$pp python3 -m cProfile -o $R/$side-$prec.prof -m tvm_nimble.cli compile /tmp/ab-onnx/googlenet.onnx \
      -o /tmp/ab-art-$side-$prec --force --target cuda --arch sm_90 --kernels best --precision $prec > $R/compile-$side-$prec.log 2>&1
    rc=$?
    echo "build googlenet $prec $side: rc=$rc $(python3 -c "import time; print(f'{time.time()-$s:.1f}')") s"
  done
done
tar czf $OUT/ab.tgz -C $R .
