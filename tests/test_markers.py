"""The fast loop's guard (tests/conftest.py): unmarked tests start no other program.

``make test-fast`` runs ``pytest -m "not e2e and not slow"``; it stays fast only
while every test that runs the CLI in a subprocess, starts the GCS emulator,
compiles the native op or runs a benchmark program carries ``e2e``.
"""

import subprocess
import sys

import pytest

from tests import conftest


def test_an_unmarked_test_cannot_start_a_process():
    with pytest.raises(conftest.UnmarkedProcessError, match="pytest.mark.e2e"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.e2e
def test_a_marked_test_starts_processes():
    done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ran\n"


class _Item:
    """What the collection check reads of a pytest item: its id, markers and fixtures."""

    def __init__(self, nodeid, fixturenames, marks=()):
        self.nodeid, self.fixturenames, self._marks = nodeid, fixturenames, marks

    def get_closest_marker(self, name):
        return name if name in self._marks else None


@pytest.mark.parametrize(
    "fixtures, marks, flagged",
    [
        (["tmp_path"], (), False),
        (["tmp_path"], ("e2e",), False),
        (["gcs_bucket", "gcs_emulator"], (), True),  # gcs_bucket asks for gcs_emulator
        (["gcs_bucket", "gcs_emulator"], ("slow",), True),
        (["gcs_bucket", "gcs_emulator"], ("e2e",), False),
    ],
)
def test_an_unmarked_test_that_needs_the_emulator_is_named(fixtures, marks, flagged):
    items = [_Item("tests/test_x.py::test_y", fixtures, marks)]
    assert conftest.unmarked_e2e_fixture_users(items) == (
        ["tests/test_x.py::test_y"] if flagged else []
    )
