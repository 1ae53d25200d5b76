# `make demo` and `make test` do all the set-up on a fresh machine: they create
# .venv and install the project with its test extras into it on first use, at
# the exact versions of the lock file (scripts/lock.py writes it).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LOCK := constraints/test.txt
STAMP := $(VENV)/.installed
# `make test-latest`: the newest versions setup.py allows, in a venv of their own.
LATEST_VENV := .venv-latest
# `make beam-range`: another Beam 2.x, as a user's install gets it (not editable).
BEAM ?= 2.60.0
BEAM_VENV := .venv-beam-$(BEAM)

.PHONY: demo test test-any-machine test-latest beam-range test-torch lint format bench flags samples clean

$(STAMP): setup.py $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(LOCK) -e ".[test]"
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

# Before a change that touches timing, processes or TensorFlow is done, on a
# fresh clone: oneDNN on and off, and twice under load (docs/development.md,
# "Tests that run anywhere"; scripts/test_any_machine.sh --help).
test-any-machine: $(STAMP)
	scripts/test_any_machine.sh

# Not part of `make test`: for the day the lock moves (then scripts/lock.py in
# this venv writes the new lock).
test-latest:
	test -x $(LATEST_VENV)/bin/python || $(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[test]"
	$(LATEST_VENV)/bin/python -m pytest -q -n 2 --dist loadfile

beam-range:
	test -x $(BEAM_VENV)/bin/python || $(PYTHON) -m venv $(BEAM_VENV)
	$(BEAM_VENV)/bin/python -m pip install --quiet "apache-beam[gcp]==$(BEAM)" .
	cd /tmp && $(CURDIR)/$(BEAM_VENV)/bin/python $(CURDIR)/scripts/beam_range.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# deploy/metadata.json's parameters and docs/flags.md's table, from
# beam_pipeline/core/flags.py (tests/test_flags.py fails when they differ).
flags: $(STAMP)
	$(PY) scripts/write_flags.py

# The README's dry-run sample, from a run of its command on the demo photos
# (tests/test_doc_snippets.py fails when it differs but for the machine's figures).
samples: $(STAMP)
	$(PY) scripts/write_samples.py

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

$(TORCH_STAMP): setup.py $(LOCK)
	test -x $(TORCH_PY) || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install --quiet --upgrade pip
	$(TORCH_PY) -m pip install --quiet -c $(LOCK) -e ".[test,torch]"
	touch $(TORCH_STAMP)

test-torch: $(TORCH_STAMP)
	$(TORCH_PY) -m pytest -q -m torch -n 2 --dist loadfile

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(TORCH_VENV) .venv-beam-* .pytest_cache .ruff_cache *.egg-info
