"""``--reuse OLD`` against an OLD that is hostile: another spelling of the output,
damage that keeps its CRCs, a shard rewritten or removed while the run reads it.

OLD is only ever read: every spelling of it as ``--output`` is refused before
anything is written, and OLD stays byte for byte what it was. What NEW takes
from OLD is what was checked: a shard that is not the one OLD's metadata
describes gives no record (its images are converted, and NEW is a full
conversion's bytes), and a shard that changes during the run stops it with
one line naming OLD and what to do, never publishing a dataset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.cli import summary
from beam_pipeline.core import metadata
from beam_pipeline.engines import local_engine
from beam_pipeline.storage import paths
from imagerecords import codec
from tests import contract
from tests.image_factory import make_class_folders

COMMON = ["--quiet", "--image_size", "48"]
DIRECT = ["--runner", "DirectRunner"]


@dataclasses.dataclass
class Dataset:
    images: Path  # the folder
    old: Path  # its dataset: OLD (copy it before changing it)
    full: Path  # a second conversion of the same folder: what NEW must be


def _convert(input_path, output, *extra) -> int:
    return main(["--input", str(input_path), "--output", str(output), *COMMON, *map(str, extra)])


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Dataset:
    base = tmp_path_factory.mktemp("trust")
    images = base / "images"
    make_class_folders(str(images), per_class=6, seed=8, size_range=(60, 120))
    old, full = base / "old", base / "full"
    # Three shards: one can fail while the others are reused.
    assert _convert(images, old, "--splits", "train=1.0", "--min_shards", "3") == 0
    assert _convert(images, full, "--splits", "train=1.0", "--min_shards", "3") == 0
    return Dataset(images, old, full)


RUN = ("--splits", "train=1.0", "--min_shards", "3")


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _copy_of_old(made: Dataset, tmp_path: Path) -> Path:
    old = tmp_path / "old"
    shutil.copytree(made.old, old)
    return old


def _shard_files(old: Path) -> list[Path]:
    info = json.loads((old / metadata.INFO_FILE).read_text())
    return [old / row["file"] for row in info["splits"]["train"]["shards"]]


def _records(old: Path) -> int:
    info = json.loads((old / metadata.INFO_FILE).read_text())
    return sum(row["num_examples"] for row in info["splits"]["train"]["shards"])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


# ------------------------------------------------- OLD is input, never output


def _arrange(kind: str, tmp_path: Path, old: Path) -> tuple[Path, Path]:
    """(--output, --reuse) naming OLD twice, in one of the ways a user's folders do."""
    link = tmp_path / "link"
    if kind == "output-links-to-old":  # latest -> v3, then --output latest --reuse v3
        link.symlink_to(old)
        return link, old
    if kind == "reuse-links-to-output":
        link.symlink_to(old)
        return old, link
    if kind == "output-inside-old-through-a-link":
        link.symlink_to(old)
        return link / "new", old
    raise ValueError(kind)


@pytest.mark.parametrize(
    "kind, extra",
    [
        ("output-links-to-old", ["--overwrite"]),
        ("output-links-to-old", [*DIRECT, "--overwrite"]),
        ("reuse-links-to-output", ["--overwrite"]),
        ("reuse-links-to-output", [*DIRECT, "--overwrite"]),
        ("output-inside-old-through-a-link", []),
    ],
    ids=[
        "output-links-to-old",
        "output-links-to-old-DirectRunner",
        "reuse-links-to-output",
        "reuse-links-to-output-DirectRunner",
        "output-inside-old-through-a-link",
    ],
)
def test_no_spelling_of_old_is_written_to(made, tmp_path, capsys, kind, extra):
    old = _copy_of_old(made, tmp_path)
    output, reuse = _arrange(kind, tmp_path, old)
    before = _digests(old)
    capsys.readouterr()
    assert _convert(made.images, output, "--reuse", reuse, *RUN, *extra) == 2
    line = _one_error_line(capsys)
    assert "the --reuse dataset" in line and "write the new dataset to another folder" in line
    assert _digests(old) == before  # byte for byte, and nothing added (no .imagerecords-tmp/)


@pytest.mark.parametrize(
    "path, folder, expected",
    [
        ("v3", "v3", True),
        ("latest", "v3", True),  # latest -> v3
        ("v3", "latest", True),
        ("latest/new", "v3", True),
        ("v3/sub/..", "v3", True),
        ("into-sub/..", "v3", True),  # into-sub -> v3/sub: its ".." is v3, not "."
        ("v3", "v3/sub", False),
        ("v2", "v3", False),
        ("v3-other", "v3", False),  # a name that starts like it is not inside it
        ("gs://b/data/v3", "gs://b/data/v3/", True),
        ("gs://b/data/v3/new", "gs://b/data/v3", True),
        ("gs://b/data/v3-other", "gs://b/data/v3", False),
        ("gs://b/data/v3", "v3", False),
    ],
)
def test_inside_compares_the_places_paths_name(tmp_path, monkeypatch, path, folder, expected):
    (tmp_path / "v3" / "sub").mkdir(parents=True)
    (tmp_path / "v2").mkdir()
    (tmp_path / "latest").symlink_to(tmp_path / "v3")
    (tmp_path / "into-sub").symlink_to(tmp_path / "v3" / "sub")
    monkeypatch.chdir(tmp_path)
    assert paths.inside(path, folder) is expected


def test_output_and_input_are_compared_as_places(made, tmp_path, capsys):
    """An --output that is a link to a folder inside --input is inside it."""
    images = tmp_path / "images"
    shutil.copytree(made.images, images)
    (tmp_path / "link").symlink_to(images / "cat")
    capsys.readouterr()
    assert _convert(images, tmp_path / "link" / "out") == 2
    assert "lies inside --input" in _one_error_line(capsys)
    assert not (images / "cat" / "out").exists()


# ------------------------------------- a reused record is as trusted as a converted one


def _launder(shard: Path, which: int = 0) -> None:
    """Alters the JPEG bytes of record ``which`` of ``shard`` and frames it anew: the
    record is intact (both CRCs right), of the same size, only the shard's SHA-256
    (in OLD's metadata) tells. What another tool rewriting a shard would leave."""
    data = bytearray(shard.read_bytes())
    offset = 0
    for _ in range(which):
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    length = int.from_bytes(data[offset : offset + 8], "little")
    fields = codec.parse_example(bytes(data[offset + 12 : offset + 12 + length]))
    jpeg = bytearray(fields["image/encoded"])
    jpeg[len(jpeg) // 2] ^= 0x55  # in the entropy-coded data: still decodes
    framed = codec.frame_record(
        codec.image_record(
            bytes(jpeg),
            fields["image/height"],
            fields["image/width"],
            fields["image/class/label"],
            fields["image/class/text"],
            fields["image/filename"],
            fields["image/key/sha256"],
            tuple(fields[key] for key in codec.NEAR_FEATURES),
        )
    )
    assert len(framed) == length + 16 and codec.is_intact(framed)
    data[offset : offset + len(framed)] = framed
    shard.write_bytes(bytes(data))


def _same_as_full(new: Path, full: Path) -> dict:
    """NEW holds a full conversion's files, imagerecords.json apart from its reuse block."""
    got, want = contract.all_files(str(new)), contract.all_files(str(full))
    assert sorted(got) == sorted(want)
    info = json.loads(got.pop(metadata.INFO_FILE))
    block = info.pop("reuse")
    assert metadata.dumps(info) == want.pop(metadata.INFO_FILE)
    assert got == want
    return block


def _verify_problems(dataset: Path) -> list[str]:
    from reader import load_info, verify

    return verify.verify(load_info(str(dataset)))


@pytest.mark.e2e
@pytest.mark.parametrize("engine", [[], DIRECT], ids=["local-engine", "DirectRunner"])
def test_damage_with_its_crcs_recomputed_is_not_laundered(made, tmp_path, capsys, caplog, engine):
    old = _copy_of_old(made, tmp_path)
    shard = _shard_files(old)[1]
    _launder(shard)
    assert _verify_problems(old)  # OLD's own --verify sees it: the shard's SHA-256
    info = json.loads((old / metadata.INFO_FILE).read_text())
    in_shard = info["splits"]["train"]["shards"][1]["num_examples"]
    images = _records(old)
    capsys.readouterr()
    new = tmp_path / "new"
    assert _convert(made.images, new, "--reuse", old, *RUN, *engine) == 0
    captured = capsys.readouterr()
    # One line names the shard and what happens to its records.
    warned = [r.getMessage() for r in caplog.records if str(shard) in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"none of its {in_shard} records is reused" in warned[0]
    counted = summary.read_counters(captured.out)
    assert counted["old_records_distrusted"] == in_shard
    assert counted["images_converted"] == in_shard
    assert counted["images_reused"] == images - in_shard
    # The shard's images were converted again: NEW is a full conversion's bytes.
    assert _same_as_full(new, made.full)["images_reused"] == images - in_shard
    assert _verify_problems(new) == []


def _hook_after_the_scan(monkeypatch, action) -> None:
    """Runs ``action`` once OLD's shards are scanned, before any image is converted:
    the listing, which conversion pulls from, starts only then."""
    real = local_engine._list_images

    def listing_after_the_action(*args):
        action()
        yield from real(*args)

    monkeypatch.setattr(local_engine, "_list_images", listing_after_the_action)


@pytest.mark.parametrize("change", ["rewritten", "cut-short", "removed"])
def test_old_changing_after_its_scan_stops_the_run_naming_old(
    made, tmp_path, capsys, monkeypatch, change
):
    old = _copy_of_old(made, tmp_path)
    shard = _shard_files(old)[0]

    def change_the_shard():
        if change == "rewritten":  # as a concurrent run writing OLD would
            replacement = tmp_path / "replacement"
            shutil.copy(shard, replacement)
            _launder(replacement)
            os.replace(replacement, shard)
        elif change == "cut-short":
            shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
        else:
            shard.unlink()

    _hook_after_the_scan(monkeypatch, change_the_shard)
    capsys.readouterr()
    new = tmp_path / "new"
    assert _convert(made.images, new, "--reuse", old, *RUN) == 1
    line = _one_error_line(capsys)
    assert line.startswith(f"error: the --reuse dataset {old} changed while this run read it: ")
    assert shard.name in line
    assert line.endswith("rerun the same command to resume (or convert without --reuse)")
    assert not (new / metadata.INFO_FILE).exists()  # nothing published


@pytest.mark.e2e
@pytest.mark.parametrize(
    "engine",
    [DIRECT, [*DIRECT, "--local_processes", "1"]],
    ids=["DirectRunner", "DirectRunner-records-through-the-shuffle"],
)
def test_old_rewritten_after_its_scan_stops_a_beam_run(made, tmp_path, capsys, monkeypatch, engine):
    """On Beam every shard is scanned before any image is converted (the join by ID
    waits for all of them): the shard is rewritten as soon as its scan is done."""
    from beam_pipeline.features.reuse import scan as reuse_scan

    old = _copy_of_old(made, tmp_path)
    shard = _shard_files(old)[0]
    real = reuse_scan.scan_records

    def scan_then_rewrite(described, *args):
        scanned = real(described, *args)
        if described.path == str(shard):
            replacement = tmp_path / "replacement"
            shutil.copy(shard, replacement)
            _launder(replacement)
            os.replace(replacement, shard)
        return scanned

    monkeypatch.setattr(reuse_scan, "scan_records", scan_then_rewrite)
    capsys.readouterr()
    new = tmp_path / "new"
    assert _convert(made.images, new, "--reuse", old, *RUN, *engine) == 1
    line = _one_error_line(capsys)
    assert line.startswith(f"error: the --reuse dataset {old} changed while this run read it: ")
    assert f"{shard.name} holds another record at byte 0 than it did" in line
    assert not (new / metadata.INFO_FILE).exists()


def test_old_changing_after_its_records_were_taken_does_not_reach_new(
    made, tmp_path, capsys, monkeypatch
):
    """What is copied into NEW is what was checked, not OLD's shard as it is by then."""
    old = _copy_of_old(made, tmp_path)
    shards = _shard_files(old)
    real = local_engine._write_shards

    def write_after_old_changed(*args):
        for shard in shards:
            _launder(shard)
        return real(*args)

    monkeypatch.setattr(local_engine, "_write_shards", write_after_old_changed)
    new = tmp_path / "new"
    assert _convert(made.images, new, "--reuse", old, *RUN) == 0
    block = _same_as_full(new, made.full)
    assert block["images_reused"] == _records(old)


# ----------------------------------------------------- an OLD that cannot be used


def _refused(capsys, made, tmp_path, old) -> str:
    capsys.readouterr()
    new = tmp_path / "new"
    assert _convert(made.images, new, "--reuse", old, *RUN) == 2
    line = _one_error_line(capsys)
    assert not new.exists()  # refused before anything was written: no .imagerecords-tmp/
    return line


def test_old_without_its_shards_is_refused_before_anything_is_written(made, tmp_path, capsys):
    old = _copy_of_old(made, tmp_path)
    shards = _shard_files(old)
    shards[1].unlink()
    line = _refused(capsys, made, tmp_path, old)
    assert line == (
        f"error: --reuse {old} lacks 1 of the 3 shards its imagerecords.json lists, or holds "
        f"them cut short (e.g. {shards[1].name}): restore them, or convert without --reuse"
    )


def test_a_missing_old_is_called_missing(made, tmp_path, capsys):
    line = _refused(capsys, made, tmp_path, tmp_path / "nowhere")
    assert line == (
        f"error: --reuse {tmp_path / 'nowhere'} does not exist: give the folder of a "
        "finished imagerecords dataset"
    )


def test_metadata_that_is_not_ours_is_called_not_an_imagerecords_dataset(made, tmp_path, capsys):
    old = _copy_of_old(made, tmp_path)
    (old / metadata.INFO_FILE).write_text("{}")
    line = _refused(capsys, made, tmp_path, old)
    assert line.startswith(f"error: --reuse {old} is not an imagerecords dataset: ")
    assert "holds no format_version" in line
