"""Fixtures shared by several test modules (pytest finds them here by name).

The GCS fixtures live in :mod:`tests.gcs_fixtures` with the emulator they
drive; see its docstring for what each one gives.
"""

import importlib.util

# The PyTorch tests (marked `torch`) need torch and torchvision, which `make
# test` does not install: there they are left out, and the run ends with one
# line that says so; `make test-torch` runs them in a venv that has both.
HAS_TORCH = importlib.util.find_spec("torchvision") is not None
NO_TORCH = (
    "torch is not installed here: the PyTorch tests (pytest -m torch) did not run; "
    "make test-torch runs them"
)
collect_ignore = [] if HAS_TORCH else ["test_imagerecords_torch.py"]

# In `make test-torch`'s venv: torchvision loads triton, which crashes the
# process (SIGSEGV) when TensorFlow was imported before it (triton 3.8, TF
# 2.21); the other order works. Test modules import TensorFlow as they are
# collected, so torchvision goes first, before any of them.
if HAS_TORCH:
    import torchvision  # noqa: F401

from tests.gcs_fixtures import (  # noqa: E402, F401 (pytest collects fixtures by name)
    gcs_account,
    gcs_bucket,
    gcs_emulator,
    gcs_proxy,
    tf_gcs_env,
)


def pytest_collection_modifyitems(config, items):
    if HAS_TORCH:
        return
    left_out = [item for item in items if item.get_closest_marker("torch")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("torch")]


def pytest_terminal_summary(terminalreporter):
    if not HAS_TORCH:
        terminalreporter.write_line(NO_TORCH)
