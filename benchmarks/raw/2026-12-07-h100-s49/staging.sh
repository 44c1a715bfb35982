# ran as: this command, carrying .device-stage1 and .device-frontend (the tenth start asked for this session: the
# nine before it failed or were refused while none was lent, ~1,020 s of device time)
bash .device-stage1/stage1.sh && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nimble-device/site .device-frontend/*.whl && echo STAGED; nvidia-smi --query-gpu=name --format=csv,noheader
# output: stage 1 done ... STAGED / NVIDIA H100 80GB HBM3
