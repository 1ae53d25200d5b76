# `make demo` and `make test` do all the set-up on a fresh machine: they create
# .venv and install the project with its test extras into it on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint format bench clean

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

# The fast loop, while editing: the pure and in-process tests, not the ones
# marked e2e (they start the CLI, the GCS emulator, a compiler or a benchmark;
# tests/conftest.py fails an unmarked test that starts a process) or slow.
# `make test` before committing runs everything.
.PHONY: test-fast
test-fast: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 -m "not e2e and not slow"

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
