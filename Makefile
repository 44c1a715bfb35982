# The README's two commands. Each sets itself up on a fresh machine (only Python needed).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
EXTRAS := $(if $(HAS_GPU),cuda,)

.PHONY: run test install clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(QUIET_EDITABLE) $(PY) -m pip install -q -e ".[bench$(if $(EXTRAS),$(comma)$(EXTRAS),)]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(QUIET_EDITABLE) $(PY) -m pip install -q -e ".[test]"
	@# PyTorch as the training tests' reference, unless one is installed already
	$(PY) -c "import torch" 2>/dev/null || $(QUIET_EDITABLE) $(PY) -m pip install -q -e ".[reference]"
	@# Graphviz's `dot` checks that `tvm-nimble explain` writes DOT it can parse (best effort:
	@# without root/apt the DOT-parsing assertions are skipped, and say so).
	@command -v dot >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && apt-get install -y -qq graphviz) >/dev/null 2>&1; } || \
	  echo "graphviz not installed: DOT parse checks will be skipped"
	touch $@ $(VENV)/.installed

comma := ,
# setuptools' notice on every editable install of a package whose folders are mapped (relay_passes/ and codegen/
# install as tvm_nimble.*), about folders that might shadow it: nothing to act on, ten lines per install
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

# on a machine with a GPU, also what every CUDA build reuses: the vendor extension and TVM's tensor intrinsics
install: $(VENV)/.installed
	$(if $(HAS_GPU),$(PY) -m tvm_nimble.cli prepare,@true)

# Build the built-in Inception-style model with Nimble, run it, check it against stock TVM,
# print Nimble vs stock TVM VM. CUDA when a GPU is present, CPU (llvm) otherwise.
run: $(VENV)/.installed
	$(PY) -m tvm_nimble.cli demo $(DEMO_ARGS)

# The suite on every core (pytest-xdist; TEST_WORKERS=0 runs it in one process), each test file on one worker
# (its module fixtures built once). The run's caches live in a temporary folder of its own (tests/conftest.py):
# nothing from an earlier run is reused, and nothing is written under $HOME.
TEST_WORKERS ?= auto
test: $(VENV)/.installed-test
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis

# Wheels the GPU machine's image lacks, carried along with the `device` tool (scripts/gpu_session.sh
# installs them): tornado, which TVM's RPC tracker needs (`gpu_session.sh "experiment rpc_tune ..."`), and
# onnxconverter-common, with which `bench --precision fp16` converts the ONNX file for ONNX Runtime's fp16 rows.
# ONNX Runtime's CUDA build (the bench's peer on the same ONNX file), in 8 parts of ~31 MB: the shared
# pack_ort.sh's 5 parts of 49 MB no longer fit beside the working tree in one run's 64 MiB. On the GPU machine,
# one run per part, back to back, each carrying its folder: bash .device-ort/pK/stage_ort.sh .device-ort/pK
ORT_VERSION = 1.31.1
ORT_WHEEL = onnxruntime_gpu-$(ORT_VERSION)-cp312-cp312-manylinux_2_28_x86_64.whl
ORT_PARTS = 8
.device-ort: | $(VENV)/bin/python
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 -d $@.tmp "onnxruntime-gpu==$(ORT_VERSION)"
	cd $@.tmp && split -n $(ORT_PARTS) -d $(ORT_WHEEL) part && sum=$$(sha256sum $(ORT_WHEEL) | cut -d' ' -f1) && \
		for i in $$(seq 0 $$(($(ORT_PARTS) - 1))); do d=../$@/p$$((i + 1)); mkdir -p $$d; mv part0$$i $$d/; \
		echo "$$sum $(ORT_WHEEL) $(ORT_PARTS)" > $$d/wheel.info; cp ../../shared/device/stage_ort.sh $$d/; done
	rm -rf $@.tmp

.device-extra: | $(VENV)/bin/python
	$(PY) -m pip download -q --no-deps --only-binary :all: --python-version 3.12 -d $@ "tornado>=6" \
		"onnxconverter-common>=1.14"

# Ray Serve for the serving experiment (scripts/experiments/serve_load.py, #56): ray[serve] and its dependencies
# as cp312 wheels (the GPU image's numpy kept), in one tar split into 4 parts of ~30 MB. On the GPU machine, one
# run per part, back to back, each carrying its folder: bash scripts/stage_wheels.sh .device-ray/pK
RAY_VERSION = 2.60.0
RAY_PARTS = 4
.device-ray: | $(VENV)/bin/python
	rm -rf $@.tmp && $(PY) -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
		-d $@.tmp/wheels "ray[serve]==$(RAY_VERSION)"
	rm -f $@.tmp/wheels/numpy-*
	cd $@.tmp && tar -cf ray-wheels.tar wheels && split -n $(RAY_PARTS) -d ray-wheels.tar part && \
		sum=$$(sha256sum ray-wheels.tar | cut -d' ' -f1) && for i in $$(seq 0 $$(($(RAY_PARTS) - 1))); do \
		d=../$@/p$$((i + 1)); mkdir -p $$d; mv part0$$i $$d/; \
		echo "$$sum ray-wheels.tar $(RAY_PARTS) ray[serve]==$(RAY_VERSION)" > $$d/wheels.info; done
	rm -rf $@.tmp
