# `make demo` and `make test` do all the set-up on a fresh machine: they create
# .venv and install the project with its test extras into it on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-torch lint format bench clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: $(STAMP)
	$(PY) -m bench

# The PyTorch tests (pytest -m torch) in a venv of their own, with the test
# extras and the torch extra: `make test` leaves them out (tests/conftest.py). PyPI's Linux torch is
# the CUDA build (~3 GB of wheels, CUDA libraries included); it runs on a CPU,
# and it is the build PyPI's torchvision (needed for its JPEG decoder) loads
# its C ops against.
TORCH_VENV := .venv-torch
TORCH_PY := $(TORCH_VENV)/bin/python
TORCH_STAMP := $(TORCH_VENV)/.installed

$(TORCH_STAMP): setup.py
	test -x $(TORCH_PY) || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install --quiet --upgrade pip
	$(TORCH_PY) -m pip install --quiet -e ".[test,torch]"
	touch $(TORCH_STAMP)

test-torch: $(TORCH_STAMP)
	$(TORCH_PY) -m pytest -q -m torch -n 2 --dist loadfile

clean:
	rm -rf $(VENV) $(TORCH_VENV) .pytest_cache .ruff_cache *.egg-info
