"""``--reuse OLD``: a grown folder's dataset is byte for byte a full conversion's.

One folder history serves every test: OLD is converted from the folder as it
was; then images are added, one is changed (same name, new bytes), one is
removed, a class is added whose name sorts first (every label number shifts,
so every reused record is rewritten with its new label) and a bad image
appears. Each ``--reuse`` run is compared, file by file, with a full
conversion of the folder as it is now; the only difference allowed is
imagerecords.json's ``reuse`` block, which describes the run. The counters
show that only the new and changed images were converted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from array import array
from pathlib import Path

# Beam with its GCS filesystem, as a CLI process whose paths are on gs:// has it: a
# local run in this process would import Beam without it (beam_private), for good.
import apache_beam.io.gcp.gcsfilesystem  # noqa: F401
import pytest
from PIL import Image

from beam_pipeline.__main__ import main
from beam_pipeline.cli import summary
from beam_pipeline.core import errors, images, metadata, settings, tfds_metadata
from beam_pipeline.core.elements import ImageRef
from beam_pipeline.features.near import search as near_search
from beam_pipeline.features.near.feature import PIXELS
from beam_pipeline.features.reuse import feature as reuse_feature
from beam_pipeline.features.reuse import scan as reuse_scan
from beam_pipeline.features.reuse import stage as reuse
from beam_pipeline.stages import convert
from beam_pipeline.storage import reading
from imagerecords import codec
from tests import contract
from tests.image_factory import add_bad_files, jpeg_bytes, make_class_folders, photo

COMMON = ["--quiet", "--max_reject_fraction", "0.5", "--image_size", "64"]
DIRECT = ["--runner", "DirectRunner"]


@dataclasses.dataclass
class History:
    before: Path  # the folder OLD was made from
    after: Path  # the same folder grown
    old: Path  # the dataset of `before`
    full: Path  # a full conversion of `after`
    reused: int  # images of `after` whose record OLD holds unchanged
    converted: int  # new and changed images that convert
    rejected: int


def _convert(input_path, output, *extra) -> int:
    return main(["--input", str(input_path), "--output", str(output), *COMMON, *extra])


def _digests(folder: Path) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in contract.all_files(str(folder)).items()}


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> History:
    base = tmp_path_factory.mktemp("reuse")
    before = base / "before"
    ids = make_class_folders(str(before), per_class=8, seed=5, size_range=(60, 140))
    add_bad_files(str(before))  # rejected by OLD: converted (and rejected) again
    old = base / "old"
    assert _convert(before, old) == 0
    after = base / "after"
    shutil.copytree(before, after)
    (after / ids[1]).unlink()  # removed
    changed = after / ids[-1]  # same name, new bytes
    changed.write_bytes(jpeg_bytes(photo(90, 70, seed=99)))
    (after / "cat" / "new.jpg").write_bytes(jpeg_bytes(photo(100, 80, seed=100)))
    Image.new("RGB", (70, 90), (30, 60, 90)).save(after / "fish" / "new.png")
    make_class_folders(str(after), classes=("bird",), per_class=3, seed=6, size_range=(60, 140))
    (after / "bird" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    full = base / "full"
    assert _convert(after, full) == 0
    return History(before, after, old, full, reused=24 - 2, converted=1 + 2 + 3, rejected=3)


def _assert_same_as_full(new: Path, full: Path, old: str) -> dict:
    """Every file of ``new`` is ``full``'s, imagerecords.json apart from its reuse block."""
    got, want = contract.all_files(str(new)), contract.all_files(str(full))
    assert sorted(got) == sorted(want)
    info = json.loads(got.pop(metadata.INFO_FILE))
    block = info.pop("reuse")
    assert metadata.dumps(info) == want.pop(metadata.INFO_FILE)
    assert got == want
    assert block["dataset"] == old
    return block


@pytest.mark.e2e
@pytest.mark.parametrize(
    "engine",
    [[], DIRECT, [*DIRECT, "--local_processes", "1"]],
    ids=["local-engine", "DirectRunner", "DirectRunner-records-through-the-shuffle"],
)
def test_a_reuse_run_writes_what_a_full_conversion_writes(history, tmp_path, capsys, engine):
    before = _digests(history.old)
    capsys.readouterr()
    new = tmp_path / "new"
    assert _convert(history.after, new, "--reuse", str(history.old), *engine) == 0
    block = _assert_same_as_full(new, history.full, str(history.old))
    assert block["images_reused"] == history.reused
    counted = summary.read_counters(capsys.readouterr().out)
    # Only the new and changed images were decoded; OLD's rejections were tried again.
    assert counted["images_converted"] == history.converted
    assert counted["images_reused"] == history.reused
    assert counted["images_rejected"] == history.rejected
    assert _digests(history.old) == before  # OLD is only read
    contract.check_output(str(new), str(history.after))


def test_an_interrupted_reuse_run_resumes_to_the_same_bytes(history, tmp_path, capsys, monkeypatch):
    """What an interrupted --reuse run spilled (the records it took from OLD, as it
    checked them, and those it converted) is resumed."""
    from beam_pipeline.stages import finalize

    def crash(self, *args):
        raise KeyboardInterrupt  # every image done, nothing published

    new = tmp_path / "new"
    with monkeypatch.context() as patch:
        patch.setattr(finalize.Finalizer, "run", crash)
        assert _convert(history.after, new, "--reuse", str(history.old)) == 130
    capsys.readouterr()
    assert _convert(history.after, new, "--reuse", str(history.old)) == 0
    counted = summary.read_counters(capsys.readouterr().out)
    # Every image was done before the interruption: none is converted again.
    assert counted["images_resumed"] + counted.get("images_reused", 0) == 22 + 6 + 3
    assert "images_converted" not in counted
    block = _assert_same_as_full(new, history.full, str(history.old))
    # It counts the records this run took from OLD (the others it resumed).
    assert block["images_reused"] == counted.get("images_reused", 0)


def test_the_summary_says_how_many_records_were_reused(history, tmp_path, capsys):
    assert _convert(history.after, tmp_path / "new", "--reuse", str(history.old)) == 0
    out = capsys.readouterr().out
    assert f"reused {history.reused} records of {history.old}" in out


def test_reuse_with_dedupe_and_other_shards(history, tmp_path):
    extra = ("--dedupe", "--min_shards", "2", "--index_files", "--seed", "9")
    full, new = tmp_path / "full", tmp_path / "new"
    assert _convert(history.after, full, *extra) == 0
    assert _convert(history.after, new, "--reuse", str(history.old), *extra) == 0
    _assert_same_as_full(new, full, str(history.old))


def test_a_format_1_dataset_is_reused(history, tmp_path):
    """OLD's metadata under format 1's name (dataset_info.json) is found the same way."""
    old = tmp_path / "old1"
    shutil.copytree(history.old, old)
    info = json.loads((old / metadata.INFO_FILE).read_text())
    info["format_version"] = 1
    for name in tfds_metadata.FILES:
        (old / name).unlink()
    (old / metadata.V1_INFO_FILE).write_text(json.dumps(info))
    (old / metadata.INFO_FILE).unlink()
    new = tmp_path / "new"
    assert _convert(history.after, new, "--reuse", str(old)) == 0
    assert _assert_same_as_full(new, history.full, str(old))["images_reused"] == history.reused


def test_a_dataset_of_another_converter_version_is_reused_with_a_note(history, tmp_path, capsys):
    old = tmp_path / "old-version"
    shutil.copytree(history.old, old)
    info = json.loads((old / metadata.INFO_FILE).read_text())
    info["created_by"] = "imagerecords 0.0.1"
    (old / metadata.INFO_FILE).write_text(json.dumps(info))
    capsys.readouterr()
    argv = ["--input", history.after, "--output", tmp_path / "new", "--reuse", old]
    assert main([*map(str, argv), "--max_reject_fraction", "0.5", "--image_size", "64"]) == 0
    err = capsys.readouterr().err
    assert f"{old} was made by imagerecords 0.0.1: its records are reused as that version" in err
    assert f"{history.old} was made by" not in err


@pytest.mark.e2e
@pytest.mark.parametrize("engine", [[], DIRECT], ids=["local-engine", "DirectRunner"])
def test_a_gcs_dataset_is_reused(history, gcs_emulator, tmp_path, capsys, engine):
    url = f"gs://{gcs_emulator.create_bucket()}/old"
    gcs_emulator.upload_dir(history.old, url)
    capsys.readouterr()
    new = tmp_path / "new"
    assert _convert(history.after, new, "--reuse", url + "/", *engine) == 0
    assert _assert_same_as_full(new, history.full, url)["images_reused"] == history.reused
    assert summary.read_counters(capsys.readouterr().out)["images_converted"] == history.converted


@pytest.mark.e2e
def test_everything_on_gcs(history, gcs_emulator, tmp_path):
    """Input, OLD and output on gs://: what Dataflow runs (no local file of OLD)."""
    bucket = f"gs://{gcs_emulator.create_bucket()}"
    gcs_emulator.upload_dir(history.old, f"{bucket}/old")
    gcs_emulator.upload_dir(history.after, f"{bucket}/images")
    full, new = f"{bucket}/full", f"{bucket}/new"
    assert _convert(f"{bucket}/images", full) == 0
    assert _convert(f"{bucket}/images", new, "--reuse", f"{bucket}/old") == 0
    local_full = gcs_emulator.download_dir(full, tmp_path / "full")
    local_new = gcs_emulator.download_dir(new, tmp_path / "new")
    assert _assert_same_as_full(local_new, local_full, f"{bucket}/old")["images_reused"] == (
        history.reused
    )


def _refused(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(list(map(str, argv))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_other_image_settings_are_refused_naming_the_difference(history, tmp_path, capsys):
    line = _refused(
        capsys, "--input", history.after, "--output", tmp_path / "new", "--reuse", history.old,
        "--image_size", "32", "--resample", "lanczos",
    )  # fmt: skip
    assert line.startswith("error: --reuse ")
    assert "image_size 64 -> 32, resample bicubic -> lanczos" in line
    assert not (tmp_path / "new").exists()


def test_settings_that_do_not_decide_a_record_may_change(history, tmp_path):
    """Seed, splits and shard size place the records; the records stay the same."""
    extra = ("--splits", "train=0.5,val=0.5", "--seed", "3", "--target_shard_mb", "0.01")
    full, new = tmp_path / "full", tmp_path / "new"
    assert _convert(history.after, full, *extra) == 0
    assert _convert(history.after, new, "--reuse", str(history.old), *extra) == 0
    _assert_same_as_full(new, full, str(history.old))


@pytest.mark.parametrize("where", ["same", "inside"])
def test_the_output_must_not_be_the_old_dataset(history, capsys, where):
    output = history.old if where == "same" else history.old / "new"
    before = _digests(history.old)
    line = _refused(
        capsys, "--input", history.after, "--output", output, "--reuse", history.old,
        "--overwrite", *COMMON,
    )  # fmt: skip
    assert "the --reuse dataset" in line
    assert _digests(history.old) == before


def test_an_unfinished_or_missing_dataset_is_refused(history, tmp_path, capsys):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(history.old, unfinished)
    (unfinished / metadata.INFO_FILE).unlink()
    for old, why in (
        (unfinished, "is not a finished imagerecords dataset: it holds no imagerecords.json"),
        (tmp_path / "nowhere", "does not exist: give the folder of a finished imagerecords"),
    ):
        line = _refused(
            capsys, "--input", history.after, "--output", tmp_path / "new", "--reuse", old,
        )  # fmt: skip
        assert line == f"error: --reuse {old} {why}" + line.split(why)[1]
    assert not (tmp_path / "new").exists()


def test_the_dry_run_counts_what_would_be_reused_converted_and_dropped(history, tmp_path, capsys):
    capsys.readouterr()
    argv = ["--input", history.after, "--output", tmp_path / "new", "--reuse", history.old]
    assert main([*map(str, argv), *COMMON, "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert (
        f"reused {history.reused} unchanged ({history.reused} with a new label); "
        "converted 1 changed and 8 without a record there (new, or rejected by it); "
        "dropped 1 no longer listed"
    ) in out
    assert not (tmp_path / "new").exists()


def test_the_dry_run_warns_of_a_refusal(history, tmp_path, capsys):
    argv = ["--input", history.after, "--output", tmp_path / "new", "--reuse", history.old]
    assert main([*map(str, argv), "--dry_run", "--image_size", "32"]) == 0
    assert "warning: the real run would stop before starting: --reuse" in capsys.readouterr().out


# ------------------------------------------- an OLD of an earlier fingerprint scheme


def _with_scheme(history: History, where: Path, scheme: str) -> Path:
    """A copy of OLD that records ``scheme``, its records' fingerprints zeroed (so a run
    that kept them would be seen): the layout is the same, only the shards' SHA-256 change."""
    shutil.copytree(history.old, where)
    info_path = where / metadata.INFO_FILE
    info = json.loads(info_path.read_text())
    info["image"]["near_scheme"] = info["near_duplicates"]["scheme"] = scheme
    for split in info["splits"].values():
        for shard in split["shards"]:
            path = where / shard["file"]
            with open(path, "rb") as f:
                records = [codec.parse_example(data) for data in codec.iter_records(f)]
            for record in records:
                for key in codec.NEAR_FEATURES:
                    record[key] = bytes(len(record[key]))
            data = b"".join(codec.frame_record(codec.make_example(r)) for r in records)
            assert len(data) == shard["num_bytes"]
            path.write_bytes(data)
            shard["sha256"] = hashlib.sha256(data).hexdigest()
    info_path.write_text(metadata.dumps(info).decode())
    return where


def _records(folder: Path) -> dict[str, dict]:
    """Every record of a dataset, all its features, by image ID."""
    rows = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".tfrecord"):
            with open(folder / name, "rb") as f:
                for data in codec.iter_records(f):
                    record = codec.parse_example(data)
                    rows[record["image/filename"].decode()] = record
    return rows


@pytest.mark.e2e
def test_an_old_of_an_earlier_scheme_is_reused_its_fingerprints_made_anew(
    history, tmp_path, capsys
):
    from reader import load_info, verify

    # The last earlier scheme whose fingerprints differ from SCHEME's.
    earlier = [s for s in near_search.EARLIER_SCHEMES if s not in near_search.SAME_FINGERPRINT][-1]
    old = _with_scheme(history, tmp_path / "old", earlier)
    outputs = {}
    for name, engine in (("local", []), ("beam", DIRECT)):
        capsys.readouterr()
        new = tmp_path / name
        assert _convert(history.after, new, "--reuse", str(old), *engine) == 0
        out = capsys.readouterr().out
        counted = summary.read_counters(out)
        assert counted["images_reused"] == history.reused
        assert counted["images_near_hashed"] == history.reused + history.converted
        assert f"{history.reused} fingerprinted from their stored JPEG" in out
        assert verify.verify(load_info(str(new))) == []
        outputs[name] = contract.all_files(str(new))
    assert outputs["beam"] == outputs["local"]
    # Each reused record (its JPEG OLD's) holds its stored JPEG's fingerprint, not
    # OLD's zeros; each converted one a conversion's, as in the full run.
    olds, full, new = _records(old), _records(history.full), _records(tmp_path / "local")
    reused = [i for i in new if i in olds and olds[i]["image/encoded"] == new[i]["image/encoded"]]
    assert len(reused) == history.reused
    for image_id, record in new.items():
        near = record["image/near/phash"] + record["image/near/colour"]
        if image_id in reused:
            assert (
                near == images.near_of_stored(record["image/encoded"], PIXELS) != bytes(len(near))
            )
        else:
            assert record == full[image_id]
    argv = ["--input", history.after, "--output", tmp_path / "dry", "--reuse", old]
    assert main([*map(str, argv), *COMMON, "--dry_run"]) == 0
    assert (
        f"({history.reused} of scheme {earlier}, fingerprinted from their stored JPEG)"
    ) in capsys.readouterr().out


@pytest.mark.e2e
@pytest.mark.parametrize("scheme", near_search.SAME_FINGERPRINT)
def test_an_old_whose_scheme_changed_only_the_search_keeps_its_records(
    history, tmp_path, capsys, scheme
):
    """An OLD of an earlier scheme with this scheme's fingerprints (only the search
    changed): reused as it is, the same bytes as a --reuse of an OLD of today's scheme."""
    old = tmp_path / "old"
    shutil.copytree(history.old, old)
    info = json.loads((old / metadata.INFO_FILE).read_text())
    info["image"]["near_scheme"] = info["near_duplicates"]["scheme"] = scheme
    (old / metadata.INFO_FILE).write_text(metadata.dumps(info).decode())
    outputs = {}
    for name, source in (("earlier", old), ("today", history.old)):
        capsys.readouterr()
        new = tmp_path / name
        assert _convert(history.after, new, "--reuse", str(source)) == 0
        out = capsys.readouterr().out
        counted = summary.read_counters(out)
        assert counted["images_reused"] == history.reused
        assert counted["images_near_hashed"] == history.converted  # none made anew
        assert "fingerprinted from their stored JPEG" not in out
        outputs[name] = contract.all_files(str(new))
        info = json.loads(outputs[name].pop(metadata.INFO_FILE))
        assert info["reuse"].pop("dataset") == str(source)
        outputs[name][metadata.INFO_FILE] = info
    assert outputs["earlier"] == outputs["today"]


@pytest.mark.parametrize("scheme", ["newer", "dhash-v1", "phash19-v0", "phash19"])
def test_an_old_of_a_newer_or_foreign_scheme_is_refused(history, tmp_path, capsys, scheme):
    if scheme == "newer":
        name, version = near_search.SCHEME.rsplit("-v", 1)
        scheme = f"{name}-v{int(version) + 95}"
    old = tmp_path / "old"
    shutil.copytree(history.old, old)
    info = json.loads((old / metadata.INFO_FILE).read_text())
    info["image"]["near_scheme"] = scheme
    (old / metadata.INFO_FILE).write_text(metadata.dumps(info).decode())
    line = _refused(
        capsys, "--input", history.after, "--output", tmp_path / "new", "--reuse", old, *COMMON
    )
    assert line.startswith(f"error: --reuse {old} was made with other image settings")
    assert f"(near_scheme {scheme} -> {near_search.SCHEME})" in line
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------ the parts


def _record(label: int, class_name: str, image_id: str = "dog/a.jpg") -> bytes:
    ref = ImageRef(image_id, "unused", label, "train")
    data = jpeg_bytes(photo(120, 80, seed=4))
    decoded = convert.decode_data(data, images.ImageSpec(size=32, pixels=PIXELS))
    classes = ("ant", "bee", "cat", "dog")[: label + 1]
    classes = classes[:label] + (class_name,)
    return convert.finish(ref, decoded, 42, classes).result.entry.data


def test_relabel_gives_the_bytes_a_conversion_with_the_new_label_gives():
    assert reuse.relabel(_record(1, "dog"), 3, "dog") == _record(3, "dog")
    assert reuse.relabel(_record(1, "dog"), 1, "hound") == _record(1, "hound")
    assert reuse.relabel(_record(2, "dog"), 2, "dog") == _record(2, "dog")


def _old_shard(path: Path, records_in_it: int = 0) -> reuse_scan.OldShard:
    """``path`` as OLD's metadata would describe it as written (its size and SHA-256 now)."""
    data = path.read_bytes()
    return reuse_scan.OldShard(
        str(path), len(data), records_in_it, hashlib.sha256(data).hexdigest()
    )


def test_a_shard_is_scanned_without_decoding_and_refused_whole_at_damage(tmp_path):
    framed = [_record(0, "dog", f"dog/{n}.jpg") for n in range(3)]
    shard = tmp_path / "train-00000-of-00001.tfrecord"
    shard.write_bytes(b"".join(framed))
    described = _old_shard(shard, 3)
    found = reuse_scan.scan_records(described)
    assert found.distrusted == 0
    assert [image_id for image_id, _ in found.records] == ["dog/0.jpg", "dog/1.jpg", "dog/2.jpg"]
    assert [(o.offset, o.size) for _, o in found.records] == [
        (0, len(framed[0])),
        (len(framed[0]), len(framed[1])),
        (len(framed[0]) + len(framed[1]), len(framed[2])),
    ]
    assert reuse.read_record(found.records[1][1]) == framed[1]
    damaged = bytearray(shard.read_bytes())
    damaged[len(framed[0]) + 20] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    # Damage anywhere: none of the shard's records is taken (not even those before it).
    scanned = reuse_scan.scan_records(described)
    assert (scanned.records, scanned.distrusted) == ([], 3)
    assert "CRC does not match" in scanned.problem
    assert scanned.problem.endswith("none of its 3 records is reused (their images are converted)")
    with pytest.raises(errors.OldDatasetChanged, match="holds another record at byte"):
        reuse.read_record(found.records[1][1])


def test_a_shard_of_intact_frames_that_are_not_examples_gives_no_record(tmp_path):
    shard = tmp_path / "train-00000-of-00001.tfrecord"
    shard.write_bytes(_record(0, "dog", "dog/0.jpg") + codec.frame_record(b"\xff\xff\xff"))
    scanned = reuse_scan.scan_records(_old_shard(shard, 2))
    assert (scanned.records, scanned.distrusted) == ([], 2)
    assert "a record that is not a tf.train.Example at byte" in scanned.problem


def test_a_shard_that_is_not_the_one_its_metadata_describes_gives_no_record(tmp_path):
    """Intact records, CRCs and all, in a shard whose SHA-256 is not OLD's metadata's."""
    shard = tmp_path / "train-00000-of-00001.tfrecord"
    shard.write_bytes(_record(0, "dog", "dog/0.jpg") + _record(0, "dog", "dog/1.jpg"))
    described = _old_shard(shard, 2)._replace(sha256="0" * 64)
    scanned = reuse_scan.scan_records(described)
    assert (scanned.records, scanned.distrusted) == ([], 2)
    assert "not the 000000000000... its metadata gives" in scanned.problem


@pytest.mark.parametrize("change", ["removed", "cut short"])
def test_a_shard_gone_or_shorter_at_its_scan_stops_the_run(tmp_path, change):
    shard = tmp_path / "train-00000-of-00001.tfrecord"
    shard.write_bytes(_record(0, "dog", "dog/0.jpg") + _record(0, "dog", "dog/1.jpg"))
    described = _old_shard(shard, 2)
    if change == "removed":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(errors.OldDatasetChanged) as raised:
        reuse_scan.scan_records(described)
    message = str(raised.value)
    assert message.startswith(f"the --reuse dataset {tmp_path} changed while this run read it: ")
    assert message.endswith("rerun the same command to resume (or convert without --reuse)")


def test_take_checks_the_id_and_the_source_and_relabels(tmp_path):
    framed = _record(1, "dog")
    shard = tmp_path / "s.tfrecord"
    shard.write_bytes(framed)
    old = reuse_scan.scan_records(_old_shard(shard, 1)).records[0][1]
    assert old == reuse.OldRecord(str(shard), 0, len(framed), int.from_bytes(framed[-4:], "little"))
    sha256 = codec.parse_example(codec.payload(framed))["image/key/sha256"].decode()
    assert reuse.take(old, "dog/a.jpg", sha256, 1, "dog", PIXELS)[:2] == (framed, True)
    assert reuse.take(old, "dog/a.jpg", sha256, 3, "dog", PIXELS)[:2] == (_record(3, "dog"), False)
    assert reuse.take(old, "dog/b.jpg", sha256, 1, "dog", PIXELS) is None  # another image's record
    assert reuse.take(old, "dog/a.jpg", "0" * 64, 1, "dog", PIXELS) is None  # the source changed
    # Not the record the scan saw: OLD changed under the run, which stops.
    for other in (old._replace(size=len(framed) - 1), old._replace(crc=old.crc ^ 1)):
        with pytest.raises(errors.OldDatasetChanged):
            reuse.take(other, "dog/a.jpg", sha256, 1, "dog", PIXELS)


def test_the_index_finds_each_id_and_gives_its_memory_back(tmp_path):
    shards = []
    for number in range(3):
        path = tmp_path / f"s{number}.tfrecord"
        path.write_bytes(b"".join(_record(0, "dog", f"dog/{number}-{n}.jpg") for n in range(4)))
        shards.append(_old_shard(path, 4))
    index = reuse_scan.OldIndex(reuse_scan.scan_shard(shard) for shard in shards)
    assert len(index) == 12
    for shard in shards:
        for image_id, old in reuse_scan.scan_records(shard).records:
            assert index.get(image_id) == old
    for missing in ("dog/3-0.jpg", "dog/0-4.jpg", "", "dog/0-0.jp"):
        assert index.get(missing) is None
    index.close()
    assert len(index) == 0 and index.get("dog/0-0.jpg") is None


def test_an_index_of_many_records_grows_its_maps():
    """More records than the first map holds (the growth path of a real dataset)."""
    count = 20_000
    hashes = [reuse_scan.id_hash(f"c/{n}.jpg") for n in range(count)]
    crcs = array("I", [n * 7919 % 2**32 for n in range(count)])
    scan = reuse_scan.ShardScan(
        "s", array("q", hashes), array("q", range(count)), array("q", [7] * count), crcs
    )
    empty = reuse_scan.ShardScan("t", array("q"), array("q"), array("q"), array("I"), 5)
    index = reuse_scan.OldIndex([scan, empty])
    assert len(index) == count and index.distrusted == 5
    assert index.get("c/12345.jpg") == reuse.OldRecord("s", 12345, 7, 12345 * 7919)
    assert index.get("c/20000.jpg") is None


@pytest.mark.parametrize(
    "old_image, why",
    [
        ({"image_size": 64}, ""),
        ({"image_size": 32}, "image_size 32 -> 64"),
        ({"image_size": 64, "resample": None}, "resample not recorded -> bicubic"),
        ({"image_size": 64, "jpeg_quality": 95}, "jpeg_quality 95 -> 90"),
        ({"near_scheme": None}, ""),  # format 2: fingerprinted anew
        ({"near_scheme": near_search.EARLIER_SCHEMES[0]}, ""),  # so is an earlier scheme
        ({"near_scheme": near_search.EARLIER_SCHEMES[-1]}, ""),
        ({"near_scheme": "phash19-v99"}, f"near_scheme phash19-v99 -> {near_search.SCHEME}"),
        ({"near_scheme": "dhash-v1"}, f"near_scheme dhash-v1 -> {near_search.SCHEME}"),
        ({"near_scheme": ["phash19-v3"]}, "near_scheme"),  # not even a string
    ],
)
def test_refusal_names_each_image_setting_that_differs(old_image, why):
    wanted = images.ImageSpec(size=64, pixels=PIXELS)
    recorded = {**settings.image_settings(wanted), **old_image}
    recorded = {k: v for k, v in recorded.items() if v is not None}
    old = reuse.OldDataset("/data/old", "/data/old/imagerecords.json", recorded, "", (), 0)
    problem = reuse.refusal(old, "/data/new", wanted)
    assert (why in problem) if why else problem == ""
    assert "the --reuse dataset" in reuse.refusal(old, "/data/old/", wanted)
    assert "the --reuse dataset" in reuse.refusal(old, "/data", wanted)


def test_a_reused_record_is_not_decoded(history, monkeypatch):
    """The reuse path never reaches the image code when the source is unchanged."""

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded")

    index = reuse_scan.build_index(
        reuse.open_old(str(history.old), images.ImageSpec(pixels=PIXELS)).shards
    )
    image_id = "dog/dog_0001.jpg"
    found = index.get(image_id)
    monkeypatch.setattr(images, "convert", no_decoding)
    ref = ImageRef(image_id, str(history.after / image_id), 3, "train")
    classes = ("bird", "cat", "dog", "fish")
    spec = images.ImageSpec(size=64, pixels=PIXELS)
    outcome = convert.convert_ref(ref, spec, 42, classes, found, reuse_feature.take_or_convert)
    assert outcome.reused
    entry = outcome.result.entry
    assert codec.is_intact(entry.data)
    assert codec.parse_example(codec.payload(entry.data))["image/class/label"] == 3
    assert os.path.exists(history.after / image_id)


def test_a_source_is_hashed_in_place_or_read(tmp_path):
    photo_file, empty = tmp_path / "a.jpg", tmp_path / "empty.jpg"
    data = jpeg_bytes(photo(90, 60, seed=3))
    photo_file.write_bytes(data)
    empty.write_bytes(b"")
    assert reading.hash_source(str(photo_file)) == (
        hashlib.sha256(data).hexdigest(),
        len(data),
        None,
    )
    assert reading.hash_source(str(empty)) == (hashlib.sha256(b"").hexdigest(), 0, b"")
    with pytest.raises(OSError):
        reading.hash_source(str(tmp_path / "missing.jpg"))
