"""job.run's steps, each called alone, and an out-of-order call refused.

No step here forks: a job of one local process on Beam has no pool, and the
steps after the fork are given a ``Forked`` without one.
"""

import os

import pytest

from beam_pipeline.cli import arguments, job
from beam_pipeline.core import metadata, spill
from beam_pipeline.core.elements import ImageRef
from beam_pipeline.core.errors import UsageError
from beam_pipeline.engines import choice
from beam_pipeline.stages import convert, resume
from tests.image_factory import make_class_folders


@pytest.fixture
def folders(tmp_path):
    root = tmp_path / "images"
    ids = make_class_folders(str(root), classes=("a", "b"), per_class=3, nested=False)
    return root, tmp_path / "out", ids


def _command(root, out, *more):
    return arguments.parse_args(["--input", str(root), "--output", str(out), *more])


def _said():
    lines = []
    return lines, lines.append


def test_check_alone_decides_the_engine_and_the_spill_folder_and_writes_nothing(folders):
    root, out, _ = folders
    lines, say = _said()
    checked = job.check(_command(root, out, "--local_processes", "2"), say)
    assert checked.engine.name == choice.LOCAL_ENGINE
    assert checked.engine.processes == 2 and checked.engine.pooled
    assert checked.spill_dir == spill.default_dir(str(out))
    assert tuple(checked.config.layout.classes) == ("a", "b")
    assert checked.workers_log is None  # the local engine has no Beam workers
    assert not out.exists()


def test_check_alone_on_beam_with_one_process_has_no_pool(folders):
    root, out, _ = folders
    checked = job.check(
        _command(root, out, "--runner", "DirectRunner", "--local_processes", "1"), _said()[1]
    )
    assert checked.engine.name == choice.BEAM
    assert not checked.engine.pooled and checked.spill_dir is None
    assert not out.exists()


def test_check_refuses_before_anything_is_written(folders):
    root, out, _ = folders
    with pytest.raises(UsageError, match="lies inside --input"):
        job.check(_command(root, root / "a" / "out"), _said()[1])
    assert not (root / "a" / "out").exists()


def test_prepare_alone_writes_the_marker_and_fork_without_a_pool_forks_nothing(folders):
    root, out, _ = folders
    checked = job.check(
        _command(root, out, "--runner", "DirectRunner", "--local_processes", "1"), _said()[1]
    )
    prepared = job.prepare(checked, None)
    assert prepared.found.kind == "empty"
    assert (out / resume.MARKER).is_file()
    forked = job.fork(prepared)
    assert forked.pool is None and forked.prepared is prepared


def test_read_leftovers_alone_reads_what_an_unfinished_run_spilled(folders):
    """An unfinished run (marker and spill files) is prepared again: its records are read."""
    root, out, ids = folders
    command = _command(root, out, "--local_processes", "2")
    checked = job.check(command, _said()[1])
    job.prepare(checked, None)
    task = convert.SpillTask.of(checked.config)
    refs = [ImageRef(i, str(root / i), 0, "train") for i in sorted(ids)[:2]]
    convert.spill_chunk(refs, *task)  # what the first run converted before it stopped
    spill.forget_indexes()

    again = job.prepare(job.check(command, _said()[1]), None)
    assert again.found.kind == "unfinished"
    lines, say = _said()
    resumed = job.read_leftovers(job.Forked(again, None), say)
    try:
        assert sorted(resumed.done) == sorted(ids)[:2]
        assert lines == [
            f"imagerecords: resuming the unfinished run in {out}: 2 images already converted"
        ]
    finally:
        spill.forget_indexes()


def test_steps_out_of_order_are_refused(folders):
    root, out, _ = folders
    checked = job.check(
        _command(root, out, "--runner", "DirectRunner", "--local_processes", "1"), _said()[1]
    )
    with pytest.raises(
        job.StepOutOfOrder,
        match=r"job\.fork takes the Prepared that job\.prepare returns, not Checked",
    ):
        job.fork(checked)  # the output not prepared, not locked
    assert not out.exists()
    prepared = job.prepare(checked, None)
    with pytest.raises(job.StepOutOfOrder, match="job.read_leftovers takes the Forked"):
        job.read_leftovers(prepared, _said()[1])  # the index read before the fork
    forked = job.fork(prepared)
    with pytest.raises(job.StepOutOfOrder, match="job.launch takes the Resumed"):
        job.launch(forked, _said()[1])  # Beam imported, the heartbeat started, before the index
    with pytest.raises(job.StepOutOfOrder, match="job.run_local takes the Resumed"):
        job.run_local(forked, _said()[1])
    resumed = job.read_leftovers(forked, _said()[1])
    with pytest.raises(job.StepOutOfOrder, match="job.run_beam takes the Launched"):
        job.run_beam(resumed, _said()[1])  # Beam run without its launch
    assert sorted(os.listdir(out)) == [metadata.TMP_DIR]  # nothing but the marker's folder
