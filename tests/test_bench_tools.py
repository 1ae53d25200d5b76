"""The benchmark's side tools run, and no routine run writes the committed results.

``bench/results/`` holds the numbers of the last measurement; it changes only
when someone runs ``make bench`` and commits what it measured. Quick runs,
the profilers in ``bench.tools`` and the test suite write under gitignored
folders, so they never leave a modified results file behind.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from bench.common import settings
from bench.tools import profile_converter, profile_op, profile_reader

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
TOOLS = [
    "profile_converter",
    "profile_reader",
    "profile_op",
    "dryrun_scale",
    "page_faults",
    "shard_memory",
    "progress_cost",
    "crop_costs",
    "interleave",
    "codebase_stats",
]


@pytest.mark.parametrize("tool", TOOLS)
def test_each_tool_runs_as_a_module(tool):
    result = subprocess.run(
        [sys.executable, "-m", f"bench.tools.{tool}", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m bench.tools.{tool}")


def _ignored(path: Path) -> bool:
    """Whether git ignores ``path`` (a file that would be written there)."""
    probe = path / "probe.txt"
    result = subprocess.run(
        ["git", "check-ignore", "-q", str(probe.relative_to(REPO))], cwd=REPO, timeout=30
    )
    return result.returncode == 0


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)
def test_only_a_full_bench_run_writes_the_committed_results():
    full = bench_main.results_folder(bench_main.parse_args([]))
    assert full == settings.RESULTS_DIR and not _ignored(full)
    for argv in (["--only", "reader"], ["--report-only"]):
        assert bench_main.results_folder(bench_main.parse_args(argv)) == full
    quick = bench_main.results_folder(bench_main.parse_args(["--quick"]))
    assert quick != full and _ignored(quick)
    for folder in (
        profile_converter.PROFILE_DIR,
        profile_reader.PROFILE_DIR,
        profile_op.PROFILE_DIR,
        settings.CACHE_DIR,
    ):
        assert _ignored(folder), folder


def test_profile_op_decodes_the_readers_training_windows(tmp_path):
    """The op profiler's input: real decoded random windows, laid end to end."""
    from tests.shard_fixtures import write_dataset

    records = Path(write_dataset(tmp_path / "ds", per_class=6, max_side=90).path)
    pixels, shapes = profile_op.training_windows(records, 5)
    hw = shapes.numpy()
    assert hw.shape == (5, 2) and (hw > 0).all() and (hw <= 90).all()
    assert pixels.dtype.name == "uint8" and pixels.shape[0] == int((hw[:, 0] * hw[:, 1] * 3).sum())
    # Different seeds draw different windows somewhere in the batch.
    _, other = profile_op.training_windows(records, 5, seed=1)
    assert (other.numpy() != hw).any()


def test_crop_costs_numpy_row_is_the_readers_resize():
    """The NumPy row of bench.tools.crop_costs times the reader's arithmetic, not another."""
    import numpy as np
    import tensorflow as tf

    from bench.tools.crop_costs import numpy_bilinear
    from reader import decode

    window = np.random.default_rng(0).integers(0, 256, (37, 90, 3), dtype=np.uint8)
    for size in (224, 20):
        theirs = decode.normalize(
            decode.resize(window, (size, size), "bilinear"), "0_255", tf.uint8
        )
        diff = np.abs(numpy_bilinear(window, size).astype(int) - theirs.numpy())
        assert diff.max() <= 1 and diff.mean() < 0.01
