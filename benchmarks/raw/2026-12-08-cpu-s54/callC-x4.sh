# prepared in session 54 (no device machine was lent), not run: #55's whole list on a machine of four GPUs
# (nvidia-h100-x4: 64 cores, so each of the four builds at once has 16 compiler jobs, as the one-GPU machine's
# 16 cores), every first build from an empty cache with the vendor extension compiled within it, then a warm rebuild.
# Staging as for one GPU, then this call twice: PRECISION=fp16, then PRECISION=fp32 (each ~18 builds in ~5 rounds).
. .device/setup.sh >/dev/null 2>&1
T0=$(date +%s)
P=${PRECISION:-fp16}
DEADLINE=280 OUT=$OUT bash scripts/gpu_session.sh \
  "experiment build_times 270 --models tv:googlenet,tv:inception_v3,tv:resnet50,hf:bert-base,hf:gpt2 --kernels best --precision $P --batch 1,32 --first-build --gpus 4"
cp /tmp/nimble-work/build_times/build_times.json $OUT/build_times-$P-a.json 2>/dev/null
DEADLINE=$(( 570 - ($(date +%s) - T0) )) OUT=$OUT bash scripts/gpu_session.sh \
  "experiment build_times 290 --models timm:nasnetalarge,timm:vit_small_patch16_224,timm:swin_tiny_patch4_window7_224,timm:convnext_tiny --kernels best --precision $P --batch 1,32 --first-build --gpus 4"
cp /tmp/nimble-work/build_times/build_times.json $OUT/build_times-$P-b.json 2>/dev/null
grep -E "^== rc" $OUT/session.log | cut -c1-200
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/build_times-*.json")):
    for r in json.load(open(f)):
        c, w = r["cold"], r["warm"]
        print(f"{r['model']:34s} {r['precision']} first {c.get('seconds', float('nan')):6.1f} s (extension wait "
              f"{c.get('extension_wait_s', float('nan')):5.1f}) warm {w.get('seconds', float('nan')):5.1f} s same plan {r['same_plan']}")
PY
