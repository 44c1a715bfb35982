# ran as: bash benchmarks/raw/2026-12-07-h100-s48/callC.sh
# session 48, device call C (the same machine, warm): the decoders' GPU tests with the default providers and with the
# decoder's mask as one row of keys (cudnn-key-mask), every precision, both tiny decoders
. .device/setup.sh >/dev/null 2>&1
timeout 280 python3 -m pytest -q -m gpu tests/gpu/test_gpu_decoders.py -p no:cacheprovider -k "best or key" \
  > $OUT/gputests.log 2>&1; echo "rc=$?"
tail -15 $OUT/gputests.log | cut -c1-300
