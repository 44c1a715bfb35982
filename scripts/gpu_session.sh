#!/usr/bin/env bash
# One GPU-machine call of measurements, each step time-boxed, everything packed into $OUT at the end.
#
#   . .device/setup.sh && bash scripts/gpu_session.sh "validate" "tune zoo:incept6 500" ...
#
# Steps (run in order; a failing or overrunning step is logged and the next one runs):
#   validate                      scripts/gpu_validate.py on the runtime-only artifacts in out/gpu
#   vendorcheck                   scripts/gpu_vendor_check.py: the cuDNN/cuBLASLt extension against PyTorch
#   profile SECONDS ARGS...       scripts/gpu_kernel_profile.py ARGS --out $WORK/profile (per-kernel profile)
#   gputests SECONDS              pytest -m gpu tests/gpu (every executor mode on the zoo nets, on this GPU)
#   pool SECONDS ARGS...          scripts/gpu_pool_bench.py ARGS --out $WORK/pool (replicas x threads, bit-identity)
#   explainprofile SECONDS ARGS...  scripts/gpu_explain_profile.py ARGS --out $WORK/explain (timeline PNGs)
#   streamchoice SECONDS ARGS...  scripts/gpu_stream_choice.py ARGS --out $WORK/streams (caps and priorities
#                                 measured: auto against widest and one-stream)
#   concat SECONDS ARGS...        scripts/gpu_concat_in_place.py ARGS --out $WORK/concat (concats built in place
#                                 against concat kernels, multi- and one-stream, outputs checked first)
#   rpctune SECONDS ARGS...       scripts/gpu_rpc_tune.py ARGS --out $WORK/rpc (trials/min: local, 1 and 2 RPC
#                                 servers on the loopback; needs tornado: carry .device-extra, see below)
#   remotebest SECONDS ARGS...   scripts/gpu_remote_best.py ARGS --out $WORK/remotebest (kernels='best' and
#                                 max_streams='auto' timed through a loopback RPC tracker against timed here)
#   maxconn SECONDS ARGS...       scripts/gpu_max_connections.py ARGS --out $WORK/maxconn (the widest schedule and
#                                 one stream timed in fresh processes per CUDA_DEVICE_MAX_CONNECTIONS setting)
#   artifact DIR                  run the runtime-only artifact DIR/*.nimble on DIR/x.npy against DIR/ref.npy
#   tune MODEL SECONDS            tvm-nimble tune (zoo:NAME | tv:NAME | file.onnx) into $WORK/tuning/NAME,
#                                 resuming the committed tuning/sm_90/NAME or what an earlier call left there
#   bench SECONDS ARGS...         tvm-nimble bench ARGS --out $WORK/bench (--tuning-db @NAME means
#                                 $WORK/tuning/NAME)
# State lives in $WORK (default /tmp/nimble-work), so a later call on the same machine continues it.
# $OUT gets session.tgz (tuning databases, bench CSV, validate JSON and PNGs) and session.log.
# PYTHON (default python3) runs the steps. DEADLINE (seconds, default 570) bounds the whole call: steps are cut to what is left of it.
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
# wheels the GPU image lacks (tornado, for TVM's RPC tracker): `make .device-extra` here, carry it along
if compgen -G ".device-extra/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/nimble-device/site .device-extra/*.whl 2>>"$LOG"
fi
export PYTHONUNBUFFERED=1

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
        vendorcheck)
            step 150 "$PYTHON" scripts/gpu_vendor_check.py --out "$WORK/vendor" ;;
        profile)
            step "${a[1]}" "$PYTHON" scripts/gpu_kernel_profile.py "${a[@]:2}" --out "$WORK/profile" ;;
        explainprofile)
            step "${a[1]}" "$PYTHON" scripts/gpu_explain_profile.py "${a[@]:2}" --out "$WORK/explain" ;;
        streamchoice)
            step "${a[1]}" "$PYTHON" scripts/gpu_stream_choice.py "${a[@]:2}" --out "$WORK/streams" ;;
        concat)
            step "${a[1]}" "$PYTHON" scripts/gpu_concat_in_place.py "${a[@]:2}" --out "$WORK/concat" ;;
        rpctune)
            step "${a[1]}" "$PYTHON" scripts/gpu_rpc_tune.py "${a[@]:2}" --out "$WORK/rpc" ;;
        maxconn)
            step "${a[1]}" "$PYTHON" scripts/gpu_max_connections.py "${a[@]:2}" --out "$WORK/maxconn" ;;
        remotebest)
            step "${a[1]}" "$PYTHON" scripts/gpu_remote_best.py "${a[@]:2}" --out "$WORK/remotebest" ;;
        pool)
            step "${a[1]}" "$PYTHON" scripts/gpu_pool_bench.py "${a[@]:2}" --out "$WORK/pool" ;;
        gputests)
            step "${a[1]}" "$PYTHON" -m pytest -q -m gpu tests/gpu -p no:cacheprovider ;;
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
        *) echo "unknown step: $spec" | tee -a "$LOG" ;;
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
tar czf "$OUT/session.tgz" -C "$WORK" --exclude='*/logs' --exclude='*.so' --exclude='*.tar' . 2>>"$LOG"
ls -la "$OUT" | tee -a "$LOG"
grep -E "^concat |^streams |^\[train\]|^rpctune |^profile on|^critical-path bound|^planned |^pool |^\[bench\] .*: |tasks tuned|^== |FAIL|Error|^vendor|^artifact|passed|failed|^  |batch .* kernels" "$LOG" | tail -80
