"""The converter end to end on gs:// (the emulator): gs->gs, local->gs, gs->local.

Every output is checked from the bucket: downloaded, then held to the contract
by ``tests.contract`` (records parsed by ``tf.io.parse_example``, counts and
hashes against imagerecords.json, source hashes against the input), with every
input accounted for as a record or a rejection and no temporary object left.
The same input and seed must give the same shards whichever side is GCS.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import metadata, tfds_metadata
from tests import contract
from tests.image_factory import add_bad_files, make_class_folders

pytestmark = pytest.mark.e2e

# Fixtures used by name in this module (an import would read as unused to linters).

IN_MEMORY = "--direct_running_mode=in_memory"
MULTI_PROCESSING = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
OUR_FILES = {
    "imagerecords.json",
    "labels.txt",
    "rejects.jsonl",
    "skipped.jsonl",
    "duplicates.jsonl",
    "near_duplicates.jsonl",  # (format_version 3)
    *tfds_metadata.FILES,  # TFDS's metadata (format_version 2)
}


@dataclasses.dataclass
class Source:
    local: Path  # the image folder on disk
    url: str  # the same folder uploaded to gs://
    bucket: str
    ids: list[str]  # images that must become records
    bad: dict[str, str]  # files that must become rejections: id -> reason prefix
    work: Path  # scratch space


@pytest.fixture(scope="module")
def source(gcs_emulator, tmp_path_factory) -> Source:
    work = tmp_path_factory.mktemp("gcs-convert")
    local = work / "images"
    ids = make_class_folders(str(local), per_class=6, size_range=(60, 160))
    bad = add_bad_files(str(local))
    (local / "dog" / ".DS_Store").write_bytes(b"\0hidden")  # hidden: ignored
    (local / "README.md").write_text("no class")  # skipped: not inside a class folder
    (local / "cat" / "LICENSE.txt").write_text("CC-BY")  # skipped: not an image file
    # Names that need escaping somewhere: URL syntax, glob syntax, non-ASCII, and
    # a backslash before a dot (a character of the name, not a hidden component).
    for name in (
        "cat/with space #1?.jpg",
        "dog/[x] 100%+.jpg",
        "sea [lion]*/déjà vu.jpg",
        "cat/back\\.slash.jpg",
    ):
        (local / name).parent.mkdir(exist_ok=True)
        (local / name).write_bytes((local / ids[0]).read_bytes())
        ids.append(name)
    bucket = gcs_emulator.create_bucket()
    url = f"gs://{bucket}/images"
    gcs_emulator.upload_dir(local, url)
    # Folder placeholders, as the Cloud Console's "Create folder" leaves them.
    for name in ("images/", "images/cat/", "images/dog/batch0/"):
        gcs_emulator.upload_bytes(f"gs://{bucket}/{name}", b"")
    return Source(local, url, bucket, ids, bad, work)


def _convert(input_path, output, *extra) -> int:
    argv = ["--input", str(input_path), "--output", str(output), "--quiet"]
    return main(argv + ["--max_reject_fraction", "0.2", *extra])


def _fetch(gcs_emulator, output: str, local: Path) -> Path:
    """A local copy of an output folder (downloaded when it is on gs://)."""
    if not output.startswith("gs://"):
        return Path(output)
    return gcs_emulator.download_dir(output, local)


def _verify(gcs_emulator, source: Source, output: str) -> dict[str, bytes]:
    """Holds one output to the contract; returns its files for cross-run comparison."""
    local = _fetch(
        gcs_emulator, output, source.work / f"fetched-{len(list(source.work.iterdir()))}"
    )
    by_split = contract.check_output(str(local), input_root=str(source.local))
    info = contract.load_info(str(local))
    written = [i for rows in by_split.values() for i in contract.ids(rows)]
    rejected = {
        r["path"].rsplit("images/", 1)[1]: r["reason"] for r in contract.read_rejects(str(local))
    }
    # Every input exactly once: a record or a rejection, nothing else.
    assert sorted(written) == sorted(source.ids)
    assert set(rejected) == set(source.bad)
    for image_id, reason in source.bad.items():
        assert rejected[image_id].startswith(reason)
    assert info["rejected"]["count"] == len(source.bad)
    assert info["skipped"]["by_reason"] == {
        "not an image file (.txt)": 1,
        "not inside a class folder": 1,
    }
    assert info["source"] == (source.url if "gs://" in info["source"] else str(source.local))

    shards = {s["file"] for e in info["splits"].values() for s in e["shards"]}
    files = contract.all_files(str(local))
    if output.startswith("gs://"):
        # Exactly our files: no temp shard, no temp folder, nothing else.
        assert set(gcs_emulator.list_names(output)) == OUR_FILES | shards
    else:
        assert set(files) == OUR_FILES | shards
    return {name: data for name, data in files.items() if name in shards | {"labels.txt"}}


_runs: dict[str, dict[str, bytes]] = {}


def _run_once(gcs_emulator, source: Source, kind: str) -> dict[str, bytes]:
    """Converts once per kind for the module; later tests compare the results."""
    if kind not in _runs:
        gs_out = f"gs://{source.bucket}/out/{kind}"
        local_out = str(source.work / f"out-{kind}")
        input_path, output, extra = {
            # The local default: in_memory plus forked conversion processes
            # that read the images from GCS themselves.
            "gs-gs-default": (source.url, gs_out, ["--local_processes", "2"]),
            "gs-gs-in-memory": (source.url, gs_out, [IN_MEMORY]),
            "gs-gs-multi-processing": (source.url, gs_out, MULTI_PROCESSING),
            "local-gs": (source.local, gs_out, [IN_MEMORY]),
            "gs-local": (source.url, local_out, [IN_MEMORY]),
        }[kind]
        assert _convert(input_path, output, *extra) == 0
        _runs[kind] = _verify(gcs_emulator, source, output)
    return _runs[kind]


KINDS = ["gs-gs-default", "gs-gs-in-memory", "gs-gs-multi-processing", "local-gs", "gs-local"]


@pytest.mark.parametrize("kind", KINDS)
def test_convert_meets_the_contract(gcs_emulator, source, kind):
    _run_once(gcs_emulator, source, kind)


def test_same_shards_whichever_side_is_gcs(gcs_emulator, source):
    outputs = [_run_once(gcs_emulator, source, kind) for kind in KINDS]
    assert len(outputs[0]) >= 2  # labels.txt and at least one shard
    for other in outputs[1:]:
        assert other == outputs[0]


def test_nonempty_gcs_output_is_refused_then_overwritten(gcs_emulator, source, capsys):
    out = f"gs://{source.bucket}/out/overwrite"
    stale = [
        "train-00000-of-00009.tfrecord",
        "imagerecords.json",
        f"{metadata.TMP_DIR}/train-00003.abc",
    ]
    for name in stale + ["notes/readme.md"]:
        gcs_emulator.upload_bytes(f"{out}/{name}", b"from an earlier run")

    # Not ours: refused, named, even with --overwrite (the dataset would fail --verify).
    for overwrite in ([], ["--overwrite"]):
        assert _convert(source.local, out, IN_MEMORY, *overwrite) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --output {out} holds 1 entry ('notes/readme.md') that")
    gcs_emulator._blob(f"{out}/notes/readme.md").delete()

    assert _convert(source.local, out, IN_MEMORY) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --output {out} holds a finished dataset (imagerecords.json)")
    assert err.endswith("or pass --overwrite to replace it")

    assert _convert(source.local, out, IN_MEMORY, "--overwrite") == 0
    names = set(gcs_emulator.list_names(out))
    assert "train-00000-of-00009.tfrecord" not in names
    assert not [n for n in names if n.startswith(metadata.TMP_DIR)]
    info = json.loads(gcs_emulator.read_bytes(f"{out}/imagerecords.json"))
    assert info["rejected"]["count"] == len(source.bad)
    assert info["skipped"]["by_reason"] == {
        "not an image file (.txt)": 1,
        "not inside a class folder": 1,
    }


@pytest.mark.parametrize(
    "input_name, output_name, message",
    [
        ("images", "gs://no-such-bucket-7/out", "Bucket gs://no-such-bucket-7 does not exist"),
        (
            "gs://{bucket}/nothing-here",
            "{work}/o",
            "No objects under gs://{bucket}/nothing-here (nor an object",
        ),
        ("gs://no-such-bucket-7/images", "{work}/o", "Bucket gs://no-such-bucket-7 does not exist"),
    ],
    ids=["output-bucket-missing", "input-prefix-empty", "input-bucket-missing"],
)
def test_bad_gcs_paths_give_one_clear_line(source, capsys, input_name, output_name, message):
    fill = {"bucket": source.bucket, "work": source.work}
    input_path = source.local if input_name == "images" else input_name.format(**fill)
    assert _convert(input_path, output_name.format(**fill), IN_MEMORY) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message.format(**fill) in err, err
    assert len(err.splitlines()) == 1


def test_presplit_layout_on_gcs(gcs_emulator, source):
    local = source.work / "presplit"
    train = make_class_folders(str(local / "train"), classes=("a", "b"), per_class=3, nested=False)
    val = make_class_folders(
        str(local / "val"), classes=("a", "b"), per_class=2, seed=3, nested=False
    )
    url = f"gs://{source.bucket}/presplit"
    gcs_emulator.upload_dir(local, url)
    out = f"gs://{source.bucket}/out/presplit"
    assert _convert(url, out, IN_MEMORY) == 0
    fetched = gcs_emulator.download_dir(out, source.work / "presplit-out")
    by_split = contract.check_output(str(fetched), input_root=str(local))
    assert sorted(contract.ids(by_split["train"])) == sorted(f"train/{i}" for i in train)
    assert sorted(contract.ids(by_split["val"])) == sorted(f"val/{i}" for i in val)


def test_manifest_stored_in_gcs(gcs_emulator, source):
    """A CSV manifest in the bucket, its paths relative to the manifest's folder."""
    rows = [(f"images/{i}", i.split("/")[0], "") for i in source.ids[:6]]
    text = io.StringIO()
    csv.writer(text).writerows([("path", "label", "split"), *rows])
    manifest = f"gs://{source.bucket}/list.csv"
    gcs_emulator.upload_bytes(manifest, text.getvalue())
    out = f"gs://{source.bucket}/out/manifest"
    argv = ["--manifest", manifest, "--output", out, "--quiet", IN_MEMORY]
    assert main(argv) == 0
    fetched = gcs_emulator.download_dir(out, source.work / "manifest-out")
    by_split = contract.check_output(str(fetched), input_root=str(source.work))
    got = sorted(i for rows_ in by_split.values() for i in contract.ids(rows_))
    assert got == sorted(r[0] for r in rows)


def test_gcs_manifest_without_permission_gives_one_clear_line(gcs_account, tmp_path, capsys):
    gcs_account()  # no permission at all on the bucket
    argv = ["--manifest", "gs://private/list.csv", "--output", str(tmp_path / "o"), IN_MEMORY]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Permission denied to list objects in gs://private/list.csv")
    assert len(err.splitlines()) == 1
