# Everything runs in .venv, created on first use. torch is installed as $(TORCH_SPEC) unless the python used to
# create the venv already has torch (a GPU machine's CUDA build, say), which the venv then reuses.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pytransformer-deps

.PHONY: run demo test build bench cuda-check cuda-emulate clean

run: demo

demo: build
	$(PY) -m pytransformer demo

test: build
	$(PY) -m pytest -q tests

bench: build
	$(PY) -m pytransformer bench

build: $(STAMP)
	MAX_JOBS=$${MAX_JOBS:-$$(nproc)} $(PY) -m pip install -q --no-build-isolation --no-deps -e .

$(STAMP):
	if $(PYTHON) -c "import torch" 2>/dev/null; then $(PYTHON) -m venv --system-site-packages $(VENV); \
	else $(PYTHON) -m venv $(VENV) && $(VENV)/bin/pip install -q "$(TORCH_SPEC)"; fi
	$(VENV)/bin/pip install -q numpy tqdm matplotlib pytest expecttest ninja "setuptools>=64" wheel
	touch $(STAMP)

cuda-check: $(STAMP)
	PYTHON=$(PY) bash .ci/check_cuda.sh

cuda-emulate: $(STAMP)  # after make build: the emulator imports the built CPU extension
	PYTHONPATH=. $(PY) .ci/cuda_emulator/run.py

clean:
	rm -rf build pytransformer/_C*.so *.egg-info
