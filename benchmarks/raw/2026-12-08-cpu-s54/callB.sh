# prepared in session 54 (no device machine was lent), not run: #55's first builds not yet measured, each from an
# empty cache in a fresh process, the vendor extension's units compiled within the build (`--first-build`), then a
# warm rebuild; fp16 at batch 1 (nasnetalarge, Swin- and ConvNeXt-class), then fp32 (googlenet, vit_small).
. .device/setup.sh >/dev/null 2>&1
T0=$(date +%s)
DEADLINE=330 OUT=$OUT bash scripts/gpu_session.sh \
  "experiment build_times 320 --models timm:nasnetalarge,timm:swin_tiny_patch4_window7_224,timm:convnext_tiny --kernels best --precision fp16 --batch 1 --first-build"
cp /tmp/nimble-work/build_times/build_times.json $OUT/build_times-fp16.json 2>/dev/null
DEADLINE=$(( 570 - ($(date +%s) - T0) )) OUT=$OUT bash scripts/gpu_session.sh \
  "experiment build_times 230 --models tv:googlenet,timm:vit_small_patch16_224 --kernels best --precision fp32 --batch 1 --first-build"
cp /tmp/nimble-work/build_times/build_times.json $OUT/build_times-fp32.json 2>/dev/null
grep -E "^== rc" $OUT/session.log | cut -c1-200
grep -E "^cold|^warm|first build" $OUT/session.log | cut -c1-250 | tail -12
