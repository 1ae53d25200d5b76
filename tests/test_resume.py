"""Resumable local runs: a killed or failed run is carried on by the same command.

The runs go through the real entry point in a subprocess of its own process
group, so that a test can SIGKILL the CLI and its conversion processes at once,
as a crash, the OOM killer or a reboot would.
"""

import io
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import keys, metadata, spill, tfds_metadata
from beam_pipeline.features.dedupe import duplicates
from tests import contract, held_run, killed_at
from tests.image_factory import add_bad_files, make_class_folders

pytestmark = pytest.mark.e2e

PER_CLASS = 500  # 1,500 tiny images: long enough to kill midway, quick to convert
COMMON = ["--image_size", "32", "--target_shard_mb", "0.05", "--max_reject_fraction", "0.1"]


def _command(root, out, *extra):
    return [
        sys.executable,
        "-m",
        "beam_pipeline",
        "--input",
        str(root),
        "--output",
        str(out),
        "--local_processes",
        "2",
        *COMMON,
        *extra,
    ]


def _run(root, out, *extra):
    result = subprocess.run(
        _command(root, out, *extra), capture_output=True, text=True, timeout=600
    )
    counters = dict(re.findall(r"(\w+)=(\d+)", result.stdout))
    return result, {k: int(v) for k, v in counters.items()}


def _kill_midway(root, out, at_least: int, *extra):
    """Starts the CLI and SIGKILLs its whole process group once records are on disk.

    The run is held (tests/held_run.py): a few images past ``at_least`` its
    conversion processes wait for a gate that never opens, so it is still
    running when killed, however fast the machine.
    """
    # Held after this many images in all: each process's unfinished chunk is not
    # spilled yet, and rejections are not records.
    after = at_least + 50
    assert after < 3 * PER_CLASS, "the run must be held before its last image"
    process = subprocess.Popen(
        held_run.command(out.parent / "gate", after, _command(root, out, *extra)[3:]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    try:
        while held_run.spilled(out) < at_least:
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "nothing was spilled"
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert not (out / metadata.INFO_FILE).exists(), "the run finished before it was killed"
    spilled = held_run.spilled(out)
    assert spilled <= 2 * after
    return spilled


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """1,502 tiny images (2 bad) and the output of one uninterrupted run."""
    base = tmp_path_factory.mktemp("resume")
    root = base / "images"
    ids = make_class_folders(str(root), per_class=PER_CLASS, size_range=(20, 48))
    bad = add_bad_files(str(root))
    reference = base / "reference"
    result, counters = _run(root, reference)
    assert result.returncode == 0, result.stderr
    assert counters["images_converted"] == len(ids)
    return root, ids, bad, reference


def test_thousands_of_images_over_many_shards_are_exactly_once_and_leave_no_temp_file(images):
    root, ids, bad, reference = images
    by_split = contract.check_output(str(reference), str(root), decode=False)
    written = [i for rows in by_split.values() for i in contract.ids(rows)]
    assert sorted(written) == sorted(ids)
    rejected = sorted(r["id"] for r in contract.read_rejects(str(reference)))
    assert rejected == sorted(bad)
    info = contract.load_info(str(reference))
    assert len(info["splits"]["train"]["shards"]) >= 20
    for rows in by_split.values():
        order = [keys.order_key(42, i) for i in contract.ids(rows)]
        assert order == sorted(order)
    assert sorted(os.listdir(reference)) == sorted(
        [metadata.INFO_FILE, metadata.LABELS_FILE, metadata.REJECTS_FILE, metadata.SKIPPED_FILE]
        + [duplicates.DUPLICATES_FILE, metadata.NEAR_DUPLICATES_FILE, *tfds_metadata.FILES]
        + [s["file"] for split in info["splits"].values() for s in split["shards"]]
    ), "a temp or spill file was left behind"


def test_a_killed_run_resumes_with_the_same_command_to_the_same_bytes(images, tmp_path):
    root, ids, bad, reference = images
    out = tmp_path / "o"
    spilled = _kill_midway(root, out, at_least=1100)  # past the ~1,024 converted ahead
    assert (out / metadata.TMP_DIR).is_dir()
    result, counters = _run(root, out)  # the same command, no --overwrite
    assert result.returncode == 0, result.stderr
    assert "resuming the unfinished run" in result.stderr
    assert counters["images_resumed"] >= min(spilled, 1100)
    assert counters.get("images_converted", 0) < len(ids) - 1000  # fewer the second time
    assert contract.all_files(str(out)) == contract.all_files(str(reference))
    # The rate counts what this run read, not what it took from the first one.
    resumed = counters["images_resumed"]
    (rate,) = [line for line in result.stdout.splitlines() if " images read in " in line]
    assert rate.startswith(f"{len(ids) + len(bad) - resumed} images read in ")
    assert f"({resumed} more taken from the unfinished run, not counted)" in rate


def test_a_changed_image_size_after_a_kill_does_not_reuse_the_records(images, tmp_path):
    root, ids, bad, reference = images
    out = tmp_path / "o"
    _kill_midway(root, out, at_least=300)
    result, _ = _run(root, out, "--image_size", "24")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --output {out} holds an unfinished run with other settings "
        "(image_size 32 -> 24); run its command again to resume it, or pass --overwrite "
        "to start afresh"
    )
    result, counters = _run(root, out, "--image_size", "24", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert counters.get("images_resumed", 0) == 0
    assert counters["images_converted"] == len(ids)
    rows = contract.check_output(str(out), decode=False)["train"]
    assert max(max(r["image/height"], r["image/width"]) for r in rows) <= 24 * 48 // 20


def test_a_run_killed_with_another_filter_is_not_resumed_into_the_default_one(images, tmp_path):
    """Records made with --resample lanczos never mix into a bicubic dataset."""
    root, ids, bad, reference = images
    out = tmp_path / "o"
    _kill_midway(root, out, 300, "--resample", "lanczos")
    result, _ = _run(root, out)  # the default filter, bicubic
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --output {out} holds an unfinished run with other settings "
        "(resample lanczos -> bicubic); run its command again to resume it, or pass "
        "--overwrite to start afresh"
    )
    result, counters = _run(root, out, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert counters.get("images_resumed", 0) == 0
    assert contract.all_files(str(out)) == contract.all_files(str(reference))


def test_an_unreadable_file_is_read_again_on_resume(tmp_path, capsys):
    """A file that could not be read (here: not there yet) is retried, not its rejection reused."""
    root = tmp_path / "images"
    ids = make_class_folders(str(root), classes=("a", "b"), per_class=6, nested=False)
    late = "b/late.jpg"
    manifest = tmp_path / "list.csv"
    manifest.write_text("".join(f"{i},{i.split('/')[0]}\n" for i in [*ids, late]))
    argv = ["--manifest", str(manifest), "--input", str(root), "--local_processes", "2"]
    argv += ["--image_size", "24", "--max_reject_fraction", "0"]
    out = tmp_path / "o"
    assert main([*argv, "--output", str(out)]) == 1  # the missing file fails the books
    assert "cannot read: FileNotFoundError" in (out / metadata.REJECTS_FILE).read_text()
    capsys.readouterr()
    (root / late).write_bytes((root / ids[0]).read_bytes())  # the cause is gone
    assert main([*argv, "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert "images_converted=1," in captured.out, captured.out  # only the late one
    assert f"images_resumed={len(ids)}" in captured.out
    reference = tmp_path / "reference"  # an uninterrupted run of the same command
    assert main([*argv, "--output", str(reference)]) == 0
    assert contract.all_files(str(out)) == contract.all_files(str(reference))
    assert contract.read_rejects(str(out)) == []


def test_a_failed_run_reruns_without_overwrite_and_never_looks_finished(images, tmp_path, capsys):
    root, ids, bad, reference = images
    out = tmp_path / "o"
    argv = ["--input", str(root), "--output", str(out), "--local_processes", "2", *COMMON[:4]]
    assert main([*argv, "--max_reject_fraction", "0"]) == 1
    assert "too many rejected images: 2 of" in capsys.readouterr().err
    assert not (out / metadata.INFO_FILE).exists()
    (out / "my-notes.md").write_text("mine")
    spilled = spill.spill_files(spill.default_dir(str(out)))
    assert spilled
    # A file the job did not write is refused, named: the dataset would fail --verify.
    assert main([*argv, "--max_reject_fraction", "0"]) == 2
    assert "holds 1 entry ('my-notes.md') that the converter did not write" in (
        capsys.readouterr().err
    )
    assert (out / "my-notes.md").read_text() == "mine"
    (out / "my-notes.md").unlink()
    # The same command runs again (no --overwrite needed) and converts nothing anew.
    assert main([*argv, "--max_reject_fraction", "0"]) == 1
    captured = capsys.readouterr()
    assert "too many rejected images" in captured.err and "not empty" not in captured.err
    assert spill.spill_files(spill.default_dir(str(out))) == spilled
    # With the threshold raised it finishes from the records on disk.
    assert main([*argv, "--max_reject_fraction", "0.1"]) == 0
    captured = capsys.readouterr()
    assert f"images_resumed={len(ids) + len(bad)}" in captured.out
    assert "images_converted=" not in captured.out
    assert contract.all_files(str(out)) == contract.all_files(str(reference))


def test_an_output_with_files_the_job_did_not_write_is_refused(images, tmp_path, capsys):
    root, _, _, _ = images
    out = tmp_path / "o"
    out.mkdir()
    (out / "train-00000-of-00001.tfrecord").write_bytes(b"someone else's")
    assert main(["--input", str(root), "--output", str(out), "--quiet"]) == 2
    assert (
        f"--output {out} holds 1 file ('train-00000-of-00001.tfrecord') named as a run names "
        f"its own, but neither {metadata.INFO_FILE} nor an unfinished run's marker: pass "
        "--overwrite to replace them"
    ) in capsys.readouterr().err
    assert (out / "train-00000-of-00001.tfrecord").read_bytes() == b"someone else's"


@pytest.mark.parametrize("point", sorted(killed_at.POINTS))
def test_a_run_killed_after_publishing_is_finished_by_the_same_command(images, tmp_path, point):
    """Killed once imagerecords.json is there but its temporary folder is not gone yet,
    the same command finishes the clean-up (exit 0, the same bytes), another is
    refused, and --verify's advice (run its command again) is what works."""
    from reader import inspect as inspect_tool

    root, ids, bad, reference = images
    out = tmp_path / "o"
    command = [sys.executable, "-m", "tests.killed_at", point, "--", *_command(root, out)[3:]]
    killed = subprocess.run(command, capture_output=True, timeout=600, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / metadata.INFO_FILE).exists() and (out / metadata.TMP_DIR).is_dir()
    told = io.StringIO()
    with redirect_stdout(told), redirect_stderr(told):
        assert inspect_tool.main([str(out), "--verify"]) != 0
    assert "run its command again to complete it" in told.getvalue()
    left = contract.all_files(str(out))
    other, _ = _run(root, out, "--image_size", "24")  # not this dataset's command
    assert other.returncode == 2
    assert other.stderr.count("\n") == 1 and "stopped while it cleared" in other.stderr
    assert contract.all_files(str(out)) == left
    result, counters = _run(root, out)  # the same command
    assert result.returncode == 0, result.stderr
    assert "already holds the dataset of this command" in result.stderr
    assert not (out / metadata.TMP_DIR).exists()
    assert contract.all_files(str(out)) == contract.all_files(str(reference))
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        assert inspect_tool.main([str(out), "--verify"]) == 0
