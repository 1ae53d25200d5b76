# `make demo` and `make test` do all the set-up on a fresh machine: they create
# .venv and install the project with its test extras into it on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint format bench flags clean

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

# deploy/metadata.json's parameters and the README's flag table, from
# beam_pipeline/core/flags.py (tests/test_flags.py fails when they differ).
flags: $(STAMP)
	$(PY) scripts/write_flags.py

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
