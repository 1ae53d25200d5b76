"""beam_pipeline.storage.output: atomic placement and deleting only the job's files.

Each behaviour runs on a local folder and on gs:// (Beam's FileSystems
against the GCS emulator), the two kinds of --output the converter writes.
"""

from __future__ import annotations

import os

import pytest

from beam_pipeline.core import errors, metadata
from beam_pipeline.storage import output as output_files
from beam_pipeline.storage import paths

TMP = metadata.TMP_DIR


class _Local:
    """Reads and writes the files of a local output folder directly."""

    def __init__(self, root):
        self.base = str(root / "out")

    def put(self, name: str, data: bytes) -> None:
        path = os.path.join(self.base, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as stream:
            stream.write(data)

    def get(self, name: str) -> bytes:
        with open(os.path.join(self.base, name), "rb") as stream:
            return stream.read()

    def names(self) -> list[str]:
        found = []
        for dirpath, _, files in os.walk(self.base):
            found += [os.path.relpath(os.path.join(dirpath, f), self.base) for f in files]
        return sorted(found)


class _Gcs:
    """The same through the emulator's own client (not the code under test)."""

    def __init__(self, emulator, bucket):
        self.emulator = emulator
        self.base = f"gs://{bucket}/out"

    def put(self, name: str, data: bytes) -> None:
        self.emulator.upload_bytes(f"{self.base}/{name}", data)

    def get(self, name: str) -> bytes:
        return self.emulator.read_bytes(f"{self.base}/{name}")

    def names(self) -> list[str]:
        return self.emulator.list_names(self.base)


@pytest.fixture(params=["local", "gcs"])
def where(request, tmp_path):
    if request.param == "local":
        return _Local(tmp_path)
    emulator = request.getfixturevalue("gcs_emulator")
    return _Gcs(emulator, request.getfixturevalue("gcs_bucket"))


@pytest.mark.parametrize(
    "name, ours",
    [
        ("imagerecords.json", True),
        ("dataset_info.json", True),  # format_version 1's metadata, TFDS's in version 2
        ("features.json", True),
        ("image-class-label.labels.txt", True),
        ("labels.txt", True),
        ("rejects.jsonl", True),
        ("skipped.jsonl", True),
        ("duplicates.jsonl", True),
        ("near_duplicates.jsonl", True),  # format_version 3
        ("train-00000-of-00012.tfrecord", True),
        ("my_split-00011-of-00012.tfrecord.idx", True),
        ("labels.txt.tmp-" + "0f" * 16, True),  # write_atomically's temporary name
        (f"{TMP}/job.json", True),
        (f"{TMP}/lock", True),  # a live run's lock (lock.py)
        (f"{TMP}/spill/123-abc.spill", True),
        ("labels.txt.tmp-123", False),  # not the 32 hex digits we write
        ("train-0-of-1.tfrecord", False),
        ("notes.txt", False),
        ("sub/labels.txt", False),
        ("imagerecords.json.bak", False),
        ("features.json.tmp-1", False),
        (f"x{TMP}/job.json", False),
    ],
)
def test_is_ours_recognises_only_the_names_a_run_writes(name, ours):
    assert output_files.is_ours(name) is ours


@pytest.mark.e2e
def test_write_atomically_replaces_the_file_and_leaves_no_temp(where):
    where.put("notes.txt", b"the user's")
    path = paths.join(where.base, "labels.txt")
    output_files.write_atomically(path, b"old\n")
    output_files.write_atomically(path, b"cat\ndog\n")
    assert where.get("labels.txt") == b"cat\ndog\n"
    assert where.names() == ["labels.txt", "notes.txt"]


def test_write_atomically_makes_a_local_files_folders(tmp_path):
    path = tmp_path / "new" / TMP / "job.json"
    output_files.write_atomically(str(path), b"{}")
    assert path.read_bytes() == b"{}"
    assert os.listdir(path.parent) == ["job.json"]


@pytest.mark.e2e
def test_create_writes_bytes_as_given(where):
    data = bytes(range(256)) * 1000  # no compression, no newline translation
    with output_files.create(paths.join(where.base, f"{TMP}/a.bin")) as stream:
        stream.write(data)
    assert where.get(f"{TMP}/a.bin") == data


@pytest.mark.e2e
def test_move_into_place_is_idempotent_across_a_retry(where):
    temp = paths.join(where.base, TMP)
    moves = []
    for i in range(3):
        where.put(f"{TMP}/s{i}.tmp", f"shard {i}".encode())
        moves.append(
            (f"{temp}/s{i}.tmp", paths.join(where.base, f"train-{i:05d}-of-00003.tfrecord"))
        )
    output_files.move_into_place(moves[:1], temp)  # a first try that stopped after one
    output_files.move_into_place(moves, temp)  # the retry completes the rest
    output_files.move_into_place(moves, temp)  # and a third try changes nothing
    assert where.names() == [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    assert [where.get(f"train-{i:05d}-of-00003.tfrecord") for i in range(3)] == [
        b"shard 0",
        b"shard 1",
        b"shard 2",
    ]


@pytest.mark.e2e
def test_delete_ours_refuses_a_foreign_name_and_deletes_nothing(where):
    where.put("labels.txt", b"a\n")
    where.put("notes.txt", b"the user's")
    with pytest.raises(ValueError, match="notes.txt"):
        output_files.delete_ours(where.base, ["labels.txt", "notes.txt"])
    assert where.names() == ["labels.txt", "notes.txt"]
    output_files.delete_ours(where.base, ["labels.txt"])
    assert where.names() == ["notes.txt"]


def test_delete_ours_of_a_local_file_already_gone_is_no_error(tmp_path):
    output_files.delete_ours(str(tmp_path), ["labels.txt", f"{TMP}/job.json"])


@pytest.mark.e2e
def test_temp_files_go_before_the_marker_and_nothing_else_goes(where):
    for name in (f"{TMP}/job.json", f"{TMP}/train-00000.ab", f"{TMP}/x/y.idx", "labels.txt"):
        where.put(name, b"x")
    where.put(f"{TMP}-not-ours/keep.txt", b"the user's")
    output_files.delete_temp_files(where.base, keep=[output_files.MARKER])
    assert where.names() == [f"{TMP}-not-ours/keep.txt", f"{TMP}/job.json", "labels.txt"]
    output_files.delete_temp_folder(where.base)
    assert where.names() == [f"{TMP}-not-ours/keep.txt", "labels.txt"]
    output_files.delete_temp_folder(where.base)  # a retried clean-up


def test_local_temp_folder_goes_with_its_empty_folders(tmp_path):
    (tmp_path / TMP / "spill" / "deep").mkdir(parents=True)
    output_files.delete_temp_folder(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_remove_empty_folders_keeps_folders_with_files(tmp_path):
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "d").mkdir()
    (tmp_path / "a" / "d" / "f").write_bytes(b"")
    output_files.remove_empty_folders(str(tmp_path / "a"))
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "a",
        "a/d",
        "a/d/f",
    ]


def test_delete_local_folder(tmp_path):
    (tmp_path / "spill").mkdir()
    (tmp_path / "spill" / "1.spill").write_bytes(b"x")
    output_files.delete_local_folder(str(tmp_path / "spill"))
    output_files.delete_local_folder(str(tmp_path / "spill"))  # gone already: no error
    output_files.delete_local_folder(None)
    assert os.listdir(tmp_path) == []


@pytest.mark.e2e
def test_clean_ups_leave_a_live_runs_lock_to_its_owner(where):
    """Finalize and resume clear the temp folder while the run still holds its lock."""
    for name in (output_files.LOCK, f"{TMP}/job.json", f"{TMP}/train-00000.ab", f"{TMP}/x/y"):
        where.put(name, b"x")
    output_files.delete_temp_files(where.base, keep=[output_files.MARKER])
    assert where.names() == [f"{TMP}/job.json", output_files.LOCK]
    output_files.delete_temp_folder(where.base)
    assert where.names() == [output_files.LOCK]


def test_a_failed_write_names_its_file(tmp_path):
    with pytest.raises(errors.CannotWrite, match=rf"^could not write {tmp_path}/no/such/b: "):
        with output_files.naming(str(tmp_path / "no" / "such" / "b")):
            os.rename(str(tmp_path / "nothing"), str(tmp_path / "no" / "such" / "b"))
