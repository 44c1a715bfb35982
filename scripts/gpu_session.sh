#!/usr/bin/env bash
# The GPU session runner: one GPU-machine call of time-boxed steps, everything packed into $OUT at the end.
#
#   . .device/setup.sh && bash scripts/gpu_session.sh "validate" "tune zoo:incept6 500" \
#       "experiment stream_choice 300 --models tv:googlenet --batch 1,8"
#
# Steps (run in order; a failing or overrunning step is logged and the next one runs):
#   validate                         scripts/gpu_validate.py on the runtime-only artifacts in out/gpu
#   gputests SECONDS [ARGS...]       pytest -m gpu tests/gpu ARGS (every executor mode on the zoo nets, the decoders,
#                                    on this GPU; e.g. -k decoders)
#   artifact DIR                     run the runtime-only artifact DIR/*.nimble on DIR/x.npy against DIR/ref.npy
#   tune MODEL SECONDS               tvm-nimble tune (zoo:NAME | tv:NAME | file.onnx) into $WORK/tuning/NAME,
#                                    resuming the committed tuning/sm_90/NAME or what an earlier call left there
#   bench SECONDS ARGS...            tvm-nimble bench ARGS --out $WORK/bench (--tuning-db @NAME: $WORK/tuning/NAME)
#   experiment NAME SECONDS ARGS...  scripts/experiments/NAME.py ARGS --out $WORK/NAME (the experiments and
#                                    their arguments: scripts/experiments/README.md)
#   vendor SECONDS                   build the whole vendor extension for sm_90 and print its wall time (a fresh
#                                    machine's first build waits this long; nothing to do when it is cached)
#   generate SECONDS ARGS...         tvm-nimble bench --generate ARGS --out $WORK/generate (time to first token and
#                                    ms per token against HF eager, HF static cache + torch.compile, ORT GenAI)
# With no steps (or --list) it prints this and exits.
# State lives in $WORK (default /tmp/nimble-work), so a later call on the same machine continues it.
# $OUT gets session.tgz (all of $WORK but tuning logs and libraries) and session.log.
# PYTHON (default python3) runs the steps; TARGET=llvm makes tune and bench a CPU dry run.
# DEADLINE (seconds, default 570) bounds the whole call: steps are cut to what is left of it.
# Wheels the GPU image lacks (tornado, for TVM's RPC tracker): `make .device-extra` here, carry it along.
# The vendor extension built there (~100 s of a fresh machine) comes back as $OUT/vendor-KEY.so; put it in
# .device-vendor/KEY/libnimble_vendor.so here and carry .device-vendor: a later machine with the same sources,
# nvcc and cuDNN/cuBLAS headers (KEY says which) then loads it instead of building it again.
if (( $# == 0 )) || [[ $1 == --list || $1 == -h || $1 == --help ]]; then
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
    (( $# == 0 )) && exit 2
    exit 0
fi
set -u
WORK=${WORK:-/tmp/nimble-work}
DEADLINE=${DEADLINE:-570}
OUT=${OUT:-out/session}
TARGET=${TARGET:-cuda}  # llvm: a CPU dry run of the same steps
START=$(date +%s)
mkdir -p "$WORK/tuning" "$WORK/bench" "$OUT"
LOG="$OUT/session.log"
# tuning continues from the committed databases (tuning/sm_90/NAME) unless this machine already has newer ones
for d in tuning/sm_90/*/; do
    [[ -d $d && ! -e $WORK/tuning/$(basename "$d") ]] && cp -r "$d" "$WORK/tuning/"
done
PYTHON=${PYTHON:-python3}
if compgen -G ".device-extra/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/nimble-device/site .device-extra/*.whl 2>>"$LOG"
fi
export PYTHONUNBUFFERED=1
VENDOR_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tvm-nimble/vendor"
if [[ -d .device-vendor ]]; then  # extensions built on an earlier machine (see the header)
    mkdir -p "$VENDOR_CACHE" && cp -rnp .device-vendor/. "$VENDOR_CACHE/"
fi
touch "$WORK/.session-start"

left() { echo $(( DEADLINE - ($(date +%s) - START) - 15 )); }

step() {  # step SECONDS command...: run with a timeout cut to the time left
    local want=$1; shift
    local t; t=$(left)
    (( want < t )) && t=$want
    if (( t < 20 )); then echo "== skipped (no time left): $*" | tee -a "$LOG"; return; fi
    echo "== $(date -u +%H:%M:%S) [${t}s] $*" | tee -a "$LOG"
    local s0; s0=$(date +%s)
    timeout --signal=INT --kill-after=10 "$t" "$@" >>"$LOG" 2>&1
    echo "== rc=$? after $(( $(date +%s) - s0 ))s" | tee -a "$LOG"
}

for spec in "$@"; do
    read -r -a a <<<"$spec"
    case ${a[0]} in
        validate)
            step 90 "$PYTHON" scripts/gpu_validate.py --art out/gpu --out "$WORK/validate" ;;
        gputests)
            step "${a[1]}" "$PYTHON" -m pytest -q -m gpu tests/gpu -p no:cacheprovider "${a[@]:2}" ;;
        artifact)
            step 60 "$PYTHON" -c "import glob, sys, numpy as np, tvm_nimble
d = sys.argv[1]
for art in sorted(glob.glob(d + '/*.nimble')):
    y = tvm_nimble.NimbleExecutor(art)(np.load(d + '/x.npy'))[0].numpy()
    ref = np.load(d + '/ref.npy')
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    print(f'artifact {art}: rel L2 vs ONNX reference {err:.2e}', 'ok' if err < 1e-4 else 'FAIL')
    assert err < 1e-4" "${a[1]}" ;;
        tune)
            name=${a[1]#*:}; name=$(basename "${name%.onnx}")
            t=$(left); (( a[2] < t )) && t=${a[2]}
            # the tuner's own budget ends it cleanly (its watchdog exits 3 if a round hangs 20 s past it);
            # the step's timeout is only the last backstop
            step "$t" "$PYTHON" -m tvm_nimble.cli tune "${a[1]}" --target "$TARGET" --arch sm_90 \
                --time-budget $(( t - 30 )) --work-dir "$WORK/tuning/$name" ;;
        bench)
            args=("${a[@]:2}")
            for i in "${!args[@]}"; do [[ ${args[$i]} == @* ]] && args[$i]="$WORK/tuning/${args[$i]#@}"; done
            step "${a[1]}" "$PYTHON" -m tvm_nimble.cli bench --target "$TARGET" "${args[@]}" --out "$WORK/bench" ;;
        experiment)
            name=${a[1]:-}
            if [[ -z $name || $name == gpu_args || ! -f scripts/experiments/$name.py ]]; then
                echo "unknown experiment: '$name' (scripts/experiments/README.md lists them)" | tee -a "$LOG"
            elif [[ ! ${a[2]:-} =~ ^[0-9]+$ ]]; then
                echo "experiment $name: SECONDS missing (experiment NAME SECONDS ARGS...)" | tee -a "$LOG"
            else
                step "${a[2]}" "$PYTHON" "scripts/experiments/$name.py" "${a[@]:3}" --out "$WORK/$name"
            fi ;;
        vendor)
            step "${a[1]}" "$PYTHON" -c "import time
from tvm_nimble import env
from tvm_nimble.codegen.compile_cache import records
from tvm_nimble.codegen.vendor_build import build_vendor_library
t, start = time.perf_counter(), time.time()
path = build_vendor_library('sm_90')
print(f'vendor extension: {time.perf_counter() - t:.1f} s wall ({path})')
units = sorted((r for r in records(env.cache_dir('vendor')) if r.started >= start), key=lambda r: -r.seconds)
print('slowest units:', ', '.join(f'{r.what.split()[-1]} {r.seconds:.1f} s' for r in units[:8]))" ;;
        generate)
            step "${a[1]}" "$PYTHON" -m tvm_nimble.cli bench --generate --target "$TARGET" "${a[@]:2}" \
                --out "$WORK/generate" ;;
        *) echo "unknown step: $spec (bash scripts/gpu_session.sh --list)" | tee -a "$LOG" ;;
    esac
done
# MetaSchedule's per-task logs are large and nest too deep to come back; the tails of the scheduler's
# log and of the task tuned last do (diag/), so that a stuck or slow round can be diagnosed afterwards
mkdir -p "$WORK/diag"
for logs in "$WORK"/tuning/*/logs; do
    name=$(basename "$(dirname "$logs")")
    for f in "$logs"/*task_scheduler*.log; do [[ -f $f ]] && tail -n 300 "$f" >"$WORK/diag/$name-task_scheduler.log"; done
    last=$(ls -t "$logs"/*task_[0-9]*.log 2>/dev/null | head -1)
    [[ -n $last ]] && tail -n 300 "$last" >"$WORK/diag/$name-last_task.log"
done
# the extensions this call built, for the next machine (see the header)
find "$VENDOR_CACHE" -name libnimble_vendor.so -newer "$WORK/.session-start" 2>/dev/null | while read -r lib; do
    cp "$lib" "$OUT/vendor-$(basename "$(dirname "$lib")").so"
done
tar czf "$OUT/session.tgz" -C "$WORK" --exclude='*/logs' --exclude='*.so' --exclude='*.tar' . 2>>"$LOG"
ls -la "$OUT" | tee -a "$LOG"
grep -E "^vendor extension|^model  |^hf|^    .* us |^  hf:.*device time|^concat |^streams |^remote-best |^diag |queues |^\[train\]|^rpctune |^profile on|^critical-path bound|^planned |^pool |^\[bench\] .*: |tasks tuned|^== |FAIL|Error|^vendor|^artifact|passed|failed|^  |batch .* kernels" "$LOG" | tail -80
