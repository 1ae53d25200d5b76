"""What --output holds that no run made: links, others' files, other names of OLD.

The converter never writes or deletes through a symbolic link it did not
make, never publishes a dataset beside files that are not its own (the
dataset would fail its own --verify), and tells --output, --input and
--reuse apart as filesystem objects (a bind mount gives one folder two
names). Each case is one ``error:`` line, exit 2, before anything is written.
"""

import contextlib
import os
import shutil
import subprocess

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import metadata
from beam_pipeline.storage import paths
from tests import contract
from tests.image_factory import make_class_folders

RUN = ["--image_size", "24", "--quiet", "--local_processes", "1"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Images, and a finished dataset of them (copied where a test changes it)."""
    base = tmp_path_factory.mktemp("links")
    images = base / "images"
    make_class_folders(str(images), per_class=3)
    dataset = base / "dataset"
    assert main(["--input", str(images), "--output", str(dataset), *RUN]) == 0
    return images, dataset


def _convert(images, out, *extra) -> int:
    return main(["--input", str(images), "--output", str(out), *RUN, *map(str, extra)])


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def _tree(folder) -> dict:
    """Every entry below ``folder`` -> its bytes, or its link's target (links not followed)."""
    found = {}
    for dirpath, dirnames, names in os.walk(folder):
        for name in dirnames + names:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                found[os.path.relpath(path, folder)] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as stream:
                    found[os.path.relpath(path, folder)] = stream.read()
    return found


def _finished_copy(made, where):
    shutil.copytree(made[1], where)
    return where


# ------------------------------------------------------------- links (item 1)

# Where the link goes, and whether --output holds a finished dataset first.
LINKS = [
    (metadata.TMP_DIR, False),  # the spill files on a scratch disk
    (metadata.TMP_DIR, True),
    (metadata.LABELS_FILE, True),  # a link under one of the job's own names
    (f"{metadata.TMP_DIR}/spill", False),  # inside the temporary folder
    ("elsewhere", False),  # anywhere: a dataset is published beside no link
]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["plain", "overwrite"])
@pytest.mark.parametrize("name, finished", LINKS)
def test_a_link_in_the_output_is_refused_and_what_it_points_to_survives(
    made, tmp_path, capsys, name, finished, overwrite
):
    images, _ = made
    out = _finished_copy(made, tmp_path / "out") if finished else tmp_path / "out"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "precious.txt").write_text("not the converter's")
    (scratch / "spill").mkdir()
    (scratch / "spill" / "results.bin").write_bytes(b"\0" * 10)
    link = out / name
    link.parent.mkdir(parents=True, exist_ok=True)
    target = scratch / "precious.txt" if name == metadata.LABELS_FILE else scratch
    if name == metadata.LABELS_FILE:
        link.unlink()
    link.symlink_to(target)
    before_out, before_scratch = _tree(out), _tree(scratch)

    assert _convert(images, out, *overwrite) == 2
    err = _one_error(capsys)
    assert "symbolic link" in err and "never writes or deletes through a link" in err
    assert paths.shown(name) in err
    assert _tree(scratch) == before_scratch  # nothing deleted or written there
    assert _tree(out) == before_out  # refused before anything was written


def test_a_link_made_in_the_lock_s_place_is_not_written_through(made, tmp_path, capsys):
    """Should the lock's place be a link when the run takes it (made after the check),
    the lock is refused, not created and truncated through the link."""
    from beam_pipeline.storage import lock

    out = tmp_path / "out"
    (out / metadata.TMP_DIR).mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("kept")
    (out / metadata.LOCK).symlink_to(victim)
    with pytest.raises(lock.UsageError, match="cannot create"):
        lock.acquire(str(out))
    assert victim.read_text() == "kept"


def test_the_clean_ups_never_delete_through_a_linked_temp_folder(tmp_path):
    """Should a link appear after the check (another process), the clean-ups that
    list the temporary folder find nothing in it to delete."""
    from beam_pipeline.storage import output

    scratch = tmp_path / "scratch"
    (scratch / "deep").mkdir(parents=True)
    (scratch / "deep" / "precious.txt").write_text("kept")
    out = tmp_path / "out"
    out.mkdir()
    (out / metadata.TMP_DIR).symlink_to(scratch)
    output.delete_temp_files(str(out))
    output.delete_temp_folder(str(out))
    assert (scratch / "deep" / "precious.txt").read_text() == "kept"


# ------------------------------------------------- others' files (item 11)


def test_a_folder_of_someone_else_s_files_is_refused_naming_them_even_with_overwrite(
    made, tmp_path, capsys
):
    images, _ = made
    out = tmp_path / "out"
    out.mkdir()
    for name in ("my_notes.txt", "b.txt", "c.txt", "d.txt"):
        (out / name).write_text("mine")
    (out / "drafts").mkdir()
    for overwrite in ([], ["--overwrite"]):
        assert _convert(images, out, *overwrite) == 2
        err = _one_error(capsys)
        assert "holds 5 entries ('b.txt', 'c.txt', 'd.txt' and 2 more)" in err
        assert "converter did not write" in err and "even with --overwrite" in err
        assert "earlier run" not in err  # there was none
    assert sorted(os.listdir(out)) == ["b.txt", "c.txt", "d.txt", "drafts", "my_notes.txt"]


def test_a_finished_dataset_with_a_file_added_is_refused_and_kept_whole(made, tmp_path, capsys):
    """--overwrite would leave my_notes.txt beside the new dataset, which its own
    --verify then fails: the folder is refused, the earlier dataset untouched."""
    images, _ = made
    out = _finished_copy(made, tmp_path / "out")
    (out / "my_notes.txt").write_text("mine")
    before = contract.all_files(str(out))
    assert _convert(images, out, "--overwrite") == 2
    err = _one_error(capsys)
    assert "holds 1 entry ('my_notes.txt') that the converter did not write" in err
    assert contract.all_files(str(out)) == before


def test_a_finished_dataset_is_named_as_such(made, tmp_path, capsys):
    images, dataset = made
    assert _convert(images, dataset) == 2
    err = _one_error(capsys)
    assert f"holds a finished dataset ({metadata.INFO_FILE} and " in err
    assert "pass --overwrite to replace it" in err


# ------------------------------------------------ bind mounts (item 2)


@contextlib.contextmanager
def _bind(source, target):
    """``target`` made another name of ``source`` (mount --bind) for the block."""
    target.mkdir()
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    if done.returncode:
        pytest.skip(f"mount --bind is not permitted here: {done.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


@pytest.mark.e2e  # mount(8) is a program of its own
@pytest.mark.parametrize(
    "output, extra",
    [("same/new", []), ("same", ["--overwrite"]), ("same", [])],
    ids=["below-OLD", "OLD-overwrite", "OLD"],
)
def test_a_bind_mount_of_old_is_old(made, tmp_path, capsys, output, extra):
    images, _ = made
    old = _finished_copy(made, tmp_path / "old")
    before = _tree(old)
    with _bind(old, tmp_path / "same"):
        assert _convert(images, tmp_path / output, "--reuse", old, *extra) == 2
        err = _one_error(capsys)
        assert "the --reuse dataset" in err and "(the old one is only read)" in err
    assert _tree(old) == before


@pytest.mark.e2e
def test_a_bind_mount_of_the_input_is_the_input(made, tmp_path, capsys):
    images, _ = made
    source = tmp_path / "images"
    shutil.copytree(images, source)
    before = _tree(source)
    with _bind(source, tmp_path / "alias"):
        assert _convert(source, tmp_path / "alias" / "out") == 2
        assert "lies inside --input" in _one_error(capsys)
    assert _tree(source) == before


@pytest.mark.parametrize(
    "path, folder, expected",
    [
        ("a/b/new/deeper", "a/b", True),  # not made yet: its nearest existing folder counts
        ("a/b", "a/b", True),
        ("a", "a/b", False),
        ("a/other", "a/b", False),
        ("a/b", "missing", False),
    ],
)
def test_inside_walks_up_to_the_nearest_existing_folder(tmp_path, path, folder, expected):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "other").mkdir()
    assert paths.inside(str(tmp_path / path), str(tmp_path / folder)) is expected


# --------------------------------------------------- gs:// URLs (item 10)

MALFORMED = ["gs://", "gs:bucket/records", "gs:/bucket/records", "gs:///records", "GS://b/r"]


@pytest.mark.parametrize("flag", ["--output", "--input", "--manifest", "--reuse"])
@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_gs_url_is_one_error_and_writes_nothing(
    made, tmp_path, capsys, monkeypatch, flag, url
):
    images, dataset = made
    monkeypatch.chdir(tmp_path)
    given = {"--input": str(images), "--output": str(tmp_path / "out")}
    if flag == "--reuse":
        given["--reuse"] = url
    elif flag == "--manifest":
        given["--manifest"] = url
        del given["--input"]
    else:
        given[flag] = url
    argv = [x for pair in given.items() for x in pair]
    assert main([*argv, *RUN]) == 2
    err = _one_error(capsys)
    assert f"{flag} {paths.shown(url)}" in err and "expected gs://BUCKET/PATH" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "path, problem",
    [
        ("gs://bucket/records", ""),
        ("gs://b", ""),
        ("./gs:records", ""),  # a local folder may be named so, spelled as a path
        ("records/gs:x", ""),
        ("gs://", "names no bucket"),
        ("gs:///x", "names no bucket"),
        ("gs:b/x", "is not a gs:// URL"),
        ("Gs://b/x", "is not a gs:// URL"),
        ("gs:", "is not a gs:// URL"),
    ],
)
def test_gcs_url_problem(path, problem):
    assert paths.gcs_url_problem(path).startswith(problem) and bool(problem) == bool(
        paths.gcs_url_problem(path)
    )


# ------------------------------- a clean-up cut short (item 7, in-process)


@pytest.mark.parametrize(
    "extra",
    [["--index_files"], ["--image_size", "32"], ["--seed", "7"], ["--min_shards", "2"]],
    ids=["index-files", "image-size", "seed", "min-shards"],
)
def test_a_published_dataset_with_its_temp_folder_left_is_finished_by_its_command_only(
    made, tmp_path, capsys, extra
):
    """Another command, even one whose records would be the same, is refused: the
    dataset is not what it would publish. Its own command finishes the clean-up."""
    images, _ = made
    out = _finished_copy(made, tmp_path / "out")
    (out / metadata.TMP_DIR).mkdir()
    before = _tree(out)
    assert _convert(images, out, *extra) == 2
    assert "whose run was stopped while it cleared" in _one_error(capsys)
    assert _tree(out) == before
    assert _convert(images, out) == 0
    assert not (out / metadata.TMP_DIR).exists()
    assert _tree(out) == _tree(made[1])
