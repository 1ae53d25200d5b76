"""Fixtures and checks shared by every test module (pytest finds them here by name).

The GCS fixtures live in :mod:`tests.gcs_fixtures` with the emulator they
drive; see its docstring for what each one gives.

The fast loop (``make test-fast``: ``pytest -m "not e2e and not slow"``) stays
fast only while every test that starts another program carries the ``e2e``
marker, so this module enforces it:

* while a test without the marker runs, starting a process (``subprocess.run``,
  ``check_output`` and ``Popen`` all go through ``Popen._execute_child``) fails
  that test with a message naming the marker;
* a test without the marker that asks for the GCS emulator, directly or through
  another fixture, stops the collection: the shared emulator may already be up
  when it runs, so the first check alone would depend on the order of tests.
"""

import importlib.util
import platform
import subprocess

import pytest

# TensorFlow's first import (through h5py) asks platform.processor(), which
# on Linux runs `uname -p`: a test that happens to import TensorFlow first in
# its worker would start a program. Asked once here, the answer is cached.
platform.processor()

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

E2E_MARK = "e2e"
E2E_FIXTURES = frozenset({"gcs_emulator"})
MARK_HINT = (
    f"add @pytest.mark.{E2E_MARK} to the test, or pytestmark = pytest.mark.{E2E_MARK} to its module"
)


class UnmarkedProcessError(AssertionError):
    """A test without the ``e2e`` marker started another program."""


def _refuse_process(*args, **kwargs):
    raise UnmarkedProcessError(
        f"this test starts another program but is not marked end-to-end: {MARK_HINT}"
    )


def unmarked_e2e_fixture_users(items) -> list[str]:
    """Node ids of the items that use an end-to-end fixture without the marker."""
    return [
        item.nodeid
        for item in items
        if item.get_closest_marker(E2E_MARK) is None
        and E2E_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    ]


def pytest_collection_modifyitems(config, items):
    if not HAS_TORCH:
        left_out = [item for item in items if item.get_closest_marker("torch")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("torch")]
    unmarked = unmarked_e2e_fixture_users(items)
    if unmarked:
        listed = "\n  ".join(unmarked)
        raise pytest.UsageError(
            f"these tests start the GCS emulator but are not marked end-to-end "
            f"({MARK_HINT}):\n  {listed}"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker(E2E_MARK) is not None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", _refuse_process)
        yield


def pytest_terminal_summary(terminalreporter):
    if not HAS_TORCH:
        terminalreporter.write_line(NO_TORCH)
