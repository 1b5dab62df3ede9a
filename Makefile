# One command per chore. `make lab` and `make test` each install everything first.
PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
# a venv installed without a GPU is checked again (its torch) on a GPU machine
STAMP   := $(VENV)/.installed$(if $(HAS_GPU),-gpu)
# CPU build of torch for machines without an NVIDIA GPU; GPU machines keep a CUDA build or get
# one: a torch without CUDA there (a CPU build from an earlier install) is replaced. On Linux
# PyPI's torch is the CUDA build; TORCH_CUDA_INDEX picks another CUDA index, e.g.
# TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu128
TORCH_CPU ?= torch==2.13.0
TORCH_CUDA ?= torch>=2.10,<3
TORCH_CUDA_INDEX ?=
# Every tool (and the ninja that builds DeepSpeed's ops) comes from the venv, so DeepSpeed's
# cached op builds are not invalidated by a second ninja on the system PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install lab kernel test test-fast fuzz lint bench gpu-check gpu-wheels browser-deps notebooks-html clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade --quiet pip
ifeq ($(HAS_GPU),1)
	$(PY) -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null || { \
	  $(PIP) uninstall --quiet --yes torch >/dev/null 2>&1; \
	  $(PIP) install --quiet $(if $(TORCH_CUDA_INDEX),--index-url $(TORCH_CUDA_INDEX)) "$(TORCH_CUDA)"; }
	$(PY) -c "import sys, torch; sys.exit(0 if torch.version.cuda else 'torch ' + torch.__version__ + ' has no CUDA on this GPU machine: set TORCH_CUDA_INDEX to a CUDA wheel index')"
else
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet $(TORCH_CPU)
endif
	$(PIP) install --quiet -e ".[test]"
	$(PIP) uninstall --quiet --yes workbench >/dev/null 2>&1 || true  # the project's former name
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium for the browser tests (Playwright drives it; no browser download). An
# ordinary user without sudo (or, with no terminal, without password-less sudo) is told the
# one command to run as root.
browser-deps:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium; \
	  elif command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then \
	    sudo apt-get update -q && sudo apt-get install -y -q chromium; \
	  else echo "make test needs Debian's chromium (/usr/bin/chromium) for the browser tests;" \
	    "install it once as root: apt-get install -y chromium (or: sudo apt-get install -y chromium)" >&2; \
	    exit 1; fi; }

# Serves notebooks/ on 127.0.0.1 only; the browser and the URL it prints (with its token) open
# the start notebook.
lab: install
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root) \
	  --ServerApp.root_dir=notebooks --LabApp.default_url=/lab/tree/00_start_here.ipynb

# The .venv's Python as a kernel every Jupyter of this user lists (another JupyterLab, an
# editor): pick "workbench (.venv)" there (workbench/kernel.py warns a kernel that is not it).
kernel: install
	$(PY) -m ipykernel install --user --name workbench --display-name "workbench (.venv)"

# One pytest process by default. TEST_WORKERS=2 runs two workers, each test file on one of
# them (about 26 instead of 45 minutes on 2 cores), but a few checks that measure a step's
# split (notebook 06's data-loader stall) can miss under the load, so it is not the default.
# The temporary folders sit under a short per-user base (emptied at the start of a run):
# messages show a path whole up to 80 characters, and the tests read their paths back.
TEST_WORKERS ?= 0
TEST_TMP ?= /tmp/wb$(shell id -u)
test: install browser-deps
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --basetemp=$(TEST_TMP) tests

test-fast: install
	$(PY) -m pytest -q tests/unit

# The bad-input tests (docs/bad_input.md), the property tests with many more examples than
# `make test` runs (minutes).
FUZZ_EXAMPLES ?= 3000
fuzz: install
	WORKBENCH_HYPOTHESIS_PROFILE=explore WORKBENCH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
	  $(PY) -m pytest -q tests/unit/test_fuzz_*.py \
	  tests/unit/test_model_options.py tests/integration/test_hostile_*.py

lint: install
	$(VENV)/bin/ruff check workbench tests benchmarks
	$(VENV)/bin/ruff format --check workbench tests benchmarks
	$(VENV)/bin/mypy

bench: install
	$(PY) benchmarks/estimator.py
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/sampler.py
	$(PY) benchmarks/panels.py
	$(PY) benchmarks/sharding.py
	$(PY) benchmarks/long_run.py
	$(PY) benchmarks/anchors.py

# On a machine with an NVIDIA GPU: every CUDA, NCCL and NVML path (fails without CUDA).
gpu-check: install
	$(PY) benchmarks/gpu_check.py $(ARGS)

# For a GPU machine that reaches no package registry: the wheels gpu_check needs beyond its
# PyTorch image, into .whl/; there, `bash benchmarks/gpu_run.sh` installs them and runs it.
gpu-wheels: install
	PY=$(PY) bash benchmarks/gpu_wheels.sh

# Every notebook executed and rendered as HTML under docs/notebooks/ (minutes), for readers
# without a kernel; tests/notebooks checks each page records its notebook's current cells.
notebooks-html: install
	$(PY) docs/notebooks/render.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
