# ran as: this command, carrying .device-stage1 and .device-frontend
bash .device-stage1/stage1.sh && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nimble-device/site .device-frontend/*.whl && echo STAGED; nvidia-smi --query-gpu=name --format=csv,noheader
