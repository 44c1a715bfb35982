# ran as: this command, carrying .device-stage1 and .device-frontend (the fourth start asked for this session: the first
# failed (91 s), two later calls were refused while none was lent)
bash .device-stage1/stage1.sh && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nimble-device/site .device-frontend/*.whl && echo STAGED; nvidia-smi --query-gpu=name --format=csv,noheader
# output: stage 1 done ... STAGED / NVIDIA H100 80GB HBM3
