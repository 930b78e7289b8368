# Everything runs in .venv, created on first use. torch is installed as $(TORCH_SPEC) unless the python used to
# create the venv already has torch (a GPU machine's CUDA build, say), which the venv then reuses.
# `make build` compiles the extension in place (build/ keeps the objects: only what changed is recompiled) and the
# venv finds the package through a .pth file pointing at this checkout.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pytransformer-deps

.PHONY: run demo test build bench cuda-check cuda-emulate sdist install-check clean

run: demo

demo: build
	$(PY) -m pytransformer demo

test: build
	$(PY) -m pytest -q tests

bench: build
	$(PY) -m pytransformer bench

build: $(STAMP)
	MAX_JOBS=$${MAX_JOBS:-$$(nproc)} $(PY) setup.py -q build_ext --inplace

$(STAMP):
	if $(PYTHON) -c "import torch" 2>/dev/null; then $(PYTHON) -m venv --system-site-packages $(VENV); \
	else $(PYTHON) -m venv $(VENV) && $(VENV)/bin/pip install -q "$(TORCH_SPEC)"; fi
	$(VENV)/bin/pip install -q numpy tqdm matplotlib pytest expecttest ninja "setuptools>=64" wheel build \
		"transformers>=5.24,<5.25" safetensors tokenizers  # the transformers range tests/integrations was run on
	$(PY) -c "import site; open(site.getsitepackages()[0] + '/pytransformer-dev.pth', 'w').write('$(CURDIR)\n')"
	touch $(STAMP)

cuda-check: $(STAMP)
	PYTHON=$(PY) bash tools/check_cuda.sh

# The CUDA kernel cases of tests/ops through tools/cuda_emulator (no GPU needed): the emulator is compiled first, then
# three runs of about equal length go side by side, so that none runs on alone while a core waits (attention's
# test_cuda_kernels*, its other cases, the other ops' cases), one OpenMP thread each (the references' small torch ops
# gain nothing from more, which spin in libgomp), each writing the kernels it launched to a file of its own, which
# coverage.py then reads together with the line counts the runs leave (gcov): every kernel instantiation and every
# line of csrc/cuda with code must be reached.
EMU := build/cuda_emulator
EMU_PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -m cuda --cuda-emulator
cuda-emulate: build
	$(PY) -c "from tools.cuda_emulator import build; build.load()"
	rm -f $(EMU)/reached-*.json $(EMU)/obj/*.gcda
	$(EMU_PYTEST) tests/ops/test_attention.py -k test_cuda_kernels --cuda-reached $(EMU)/reached-attention-kernels.json \
		>$(EMU)/attention-kernels.log 2>&1 & kernels=$$!; \
	$(EMU_PYTEST) tests/ops/test_attention.py -k "not test_cuda_kernels" --cuda-reached $(EMU)/reached-attention.json \
		>$(EMU)/attention.log 2>&1 & attention=$$!; \
	$(EMU_PYTEST) tests/ops tests/models --ignore=tests/ops/test_attention.py --cuda-reached $(EMU)/reached-others.json; \
	failed=$$?; for pid in $$kernels $$attention; do wait $$pid || failed=1; done; \
	cat $(EMU)/attention-kernels.log $(EMU)/attention.log; [ $$failed = 0 ]
	$(PY) tools/cuda_emulator/coverage.py --check $(EMU)/reached-*.json  # fails on an instantiation or line no case reached

sdist: $(STAMP)  # dist/pytransformer-<version>.tar.gz; install it with pip install --no-build-isolation
	rm -f dist/pytransformer-*.tar.gz
	$(PY) -m build --sdist --no-isolation

# The package as a user gets it: the sdist installed into a fresh venv that has torch, then tools/smoke_test.py run
# from outside the checkout.
INSTALL_CHECK := build/install-check
install-check: sdist
	rm -rf $(INSTALL_CHECK) && $(PYTHON) -m venv $(INSTALL_CHECK)/venv
	$(INSTALL_CHECK)/venv/bin/pip install -q "$(TORCH_SPEC)" numpy tqdm ninja "setuptools>=64" wheel
	MAX_JOBS=$${MAX_JOBS:-$$(nproc)} $(INSTALL_CHECK)/venv/bin/pip install -q --no-build-isolation dist/pytransformer-*.tar.gz
	cd $(INSTALL_CHECK) && venv/bin/python $(CURDIR)/tools/smoke_test.py

clean:
	rm -rf build dist pytransformer/_C*.so *.egg-info
