# The whole set-up: `make run` and `make test`. Both create .venv with the machine's Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
OUT ?= results/quickstart

.PHONY: run test fuzz lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The simulator alone: no torch.
$(VENV)/.run-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# Every extra the tests use: dev tools, torch (CPU build at the pinned version), Ray.
$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,calib,ray]'
	touch $@ $(VENV)/.run-installed

run: $(VENV)/.run-installed
	$(BIN)/cbsim run scenarios/quickstart.yaml --out $(OUT)

# Two phases: everything else on two workers, then the tests that time the CPU (marker `timing`)
# alone, so a neighbouring worker cannot move what they measure.
test: $(VENV)/.test-installed
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not timing"
	$(BIN)/python -m pytest -q -p no:xdist -m timing

fuzz: $(VENV)/.test-installed
	CBSIM_FUZZ_PROFILE=deep $(BIN)/python -m pytest -q tests -k "property or fuzz"

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .

bench: $(VENV)/.test-installed
	$(BIN)/python bench/sim_speed.py

clean:
	rm -rf $(VENV) results
