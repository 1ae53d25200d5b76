"""`python -m beam_pipeline` with a Python that lacks the project's dependencies."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
def test_a_python_without_the_dependencies_is_told_to_use_the_venv():
    # -S: no site-packages, as a system Python without the install; the package
    # itself is found in the working directory, as in a clone.
    result = subprocess.run(
        [sys.executable, "-S", "-m", "beam_pipeline", "--input", "x", "--output", "y"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert result.stderr.startswith("error: imagerecords is not installed for this Python")
    assert "no module '" in result.stderr and "source .venv/bin/activate" in result.stderr
