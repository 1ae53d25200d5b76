"""imagerecords.RecordSource: the shards by position, for Grain and PyTorch (docs/trainers.md).

Datasets are converted by the real CLI; records are compared with TensorFlow's
own parsing of the same shards (tests/contract.py), Grain is the real package,
and gs:// is the GCS emulator behind a counting HTTP proxy. ``make test`` has
no PyTorch (its Linux wheel pulls GB of CUDA libraries): the map-style protocol
(``__len__``, ``__getitem__``, ``__getitems__``) is exercised here with a plain
loop, and docs/trainers.md's PyTorch blocks (marked ``needs-torch``) run under
``make test-torch``, as tests/test_imagerecords_torch.py does.
"""

from __future__ import annotations

import collections
import hashlib
import http.client
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import threading
import types
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grain
import numpy as np
import pytest

from imagerecords import (
    CorruptRecordError,
    DatasetNotFoundError,
    IndexFileError,
    RecordSource,
    UnknownSplitError,
    codec,
    storage,
)
from imagerecords import index as index_lib
from imagerecords import info as info_lib
from tests import contract
from tests.image_factory import make_class_folders

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "trainers.md"
CLASSES = ("cat", "dog", "fish")


def _convert(root: Path, out: Path, *extra: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "--input", str(root), "--output", str(out)]
        + ["--min_shards", "3", "--quiet", *extra],
        check=True,
        cwd=REPO,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """48 images in 3 classes, converted with and without --index_files (3 shards a split)."""
    base = tmp_path_factory.mktemp("trainers")
    root = base / "images"
    ids = make_class_folders(str(root), classes=CLASSES, per_class=16)
    indexed, plain = base / "indexed", base / "plain"
    _convert(root, indexed, "--index_files")
    _convert(root, plain)
    return types.SimpleNamespace(root=root, ids=ids, indexed=indexed, plain=plain)


def _expected_label(image_id: str) -> int:
    return CLASSES.index(image_id.split("/")[0])


def _tf_records(dataset: Path, split: str) -> list[dict]:
    """The split's records in shard order, parsed by TensorFlow."""
    info = contract.load_info(str(dataset))
    rows = []
    for shard in info["splits"][split]["shards"]:
        rows += contract.read_shard(str(dataset / shard["file"]))
    return rows


def _split_names(dataset: Path) -> list[str]:
    return list(contract.load_info(str(dataset))["splits"])


# ------------------------------------------------------------------ the source


@pytest.mark.parametrize("variant", ["indexed", "plain"])
def test_every_record_once_with_tensorflows_values(converted, variant):
    """With .idx files or without (offsets scanned), every split reads as TensorFlow reads it."""
    dataset = getattr(converted, variant)
    seen = []
    for split in _split_names(dataset):
        source = RecordSource(str(dataset), split)
        expected = _tf_records(dataset, split)
        assert len(source) == len(expected) > 0
        records = [source[i] for i in range(len(source))]
        for record, row in zip(records, expected, strict=True):
            assert record["image"] == row["image/encoded"]
            assert record["label"] == row["image/class/label"]
            assert record["filename"] == row["image/filename"].decode()
            assert record["class_name"] == row["image/class/text"].decode()
            assert record["sha256"] == row["image/key/sha256"].decode()
            assert (record["height"], record["width"], record["channels"]) == (
                row["image/height"],
                row["image/width"],
                3,
            )
            assert record["format"] == "jpeg"
        for record in records:
            assert record["label"] == _expected_label(record["filename"])
            assert source.classes[record["label"]] == record["class_name"]
            source_bytes = (converted.root / record["filename"]).read_bytes()
            assert record["sha256"] == hashlib.sha256(source_bytes).hexdigest()
        seen += [r["filename"] for r in records]
    assert sorted(seen) == sorted(converted.ids)


def test_every_record_key_has_a_field_name():
    """Each key of the format is either read under a name or left out on purpose."""
    from imagerecords.codec import FEATURE_TYPES
    from imagerecords.source import FIELD_NAMES, LEFT_OUT

    assert set(FIELD_NAMES) | LEFT_OUT == set(FEATURE_TYPES)
    assert not set(FIELD_NAMES) & LEFT_OUT
    assert len(set(FIELD_NAMES.values())) == len(FIELD_NAMES)


def test_scanned_offsets_equal_the_index_files(converted):
    """The framing scan finds exactly the offsets the converter wrote to .idx."""
    info_path, info = info_lib.find_info(str(converted.indexed))
    files = storage.Files()
    for split in _split_names(converted.indexed):
        for shard in info_lib.split_shards(str(converted.indexed), info_path, info, split):
            from_file = index_lib.shard_offsets(files, shard)
            scanned = index_lib.scan_offsets(files, shard, window=codec.FRAME_HEAD)
            wide = index_lib.scan_offsets(files, shard, window=1000)  # windows cut records
            assert list(from_file) == list(scanned) == list(wide)
            assert len(from_file) == shard.num_examples + 1


def test_batched_reads_coalesce_adjacent_records(converted):
    """__getitems__ returns the records in the asked order; one read per run of neighbours."""
    source = RecordSource(str(converted.indexed), "train")
    order = list(range(len(source)))
    random.Random(0).shuffle(order)
    singles = [source[i] for i in order]
    before = source.requests
    assert source.__getitems__(order) == singles
    # The whole split, in any order, is one run per shard.
    assert source.requests - before == len(source.shards)
    before = source.requests
    repeated = source.__getitems__([3, 1, 3, -1])
    assert repeated == [source[3], source[1], source[3], source[-1]]
    assert repeated[0] is not repeated[2]  # a transform may change one in place
    assert source._getitems([0]) == [source[0]]  # Grain's name for it


def test_index_errors_and_iteration(converted):
    source = RecordSource(str(converted.indexed), "val")
    with pytest.raises(IndexError, match=f"record {len(source)} of a split of {len(source)}"):
        source[len(source)]
    # The sequence protocol (what a plain `for` over a map-style dataset uses).
    assert [r["filename"] for r in source] == [source[i]["filename"] for i in range(len(source))]
    assert source[np.int64(1)] == source[1]


def test_serialized_records_parse_with_tensorflow(converted):
    import tensorflow as tf

    source = RecordSource(str(converted.indexed), "train", parse=False)
    parsed = tf.io.parse_single_example(source[2], contract.FEATURES)
    assert (
        parsed["image/filename"].numpy().decode()
        == RecordSource(str(converted.indexed), "train")[2]["filename"]
    )


def test_pickled_and_forked_copies_read_the_same(converted):
    source = RecordSource(str(converted.plain), "train")
    first = source[0]
    copy = pickle.loads(pickle.dumps(source))
    assert copy[0] == first and len(copy) == len(source)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reads through the descriptor map it inherited
        try:
            os.write(write, source[len(source) - 1]["filename"].encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as stream:
        child = stream.read().decode()
    os.waitpid(pid, 0)
    assert child == source[len(source) - 1]["filename"]


def test_corrupt_record_names_shard_and_record(converted, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(converted.indexed, copy)
    source = RecordSource(str(copy), "train")
    shard = source.shards[1]
    offsets = [int(line.split()[0]) for line in Path(shard.index_path).read_text().splitlines()]
    data = bytearray(Path(shard.path).read_bytes())
    data[offsets[2] + 100] ^= 0xFF  # inside record 2's payload
    Path(shard.path).write_bytes(bytes(data))
    position = source.shards[0].num_examples + 2
    with pytest.raises(CorruptRecordError, match=re.escape(f"{shard.path}: record 2 (bytes")):
        source[position]
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        source.__getitems__([position - 1, position, position + 1])
    source[position - 1]  # its neighbours are intact


def test_corrupt_header_without_index_fails_when_built(converted, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(converted.plain, copy)
    info = contract.load_info(str(copy))
    shard = copy / info["splits"]["train"]["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[3] ^= 0x01  # the first record's length
    shard.write_bytes(bytes(data))
    with pytest.raises(IndexFileError, match=re.escape(f"{shard}: record 0 at byte 0")):
        RecordSource(str(copy), "train")


def test_index_file_that_disagrees_fails_when_built(converted, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(converted.indexed, copy)
    info = contract.load_info(str(copy))
    index = copy / info["splits"]["val"]["shards"][0]["index"]
    index.write_text("".join(index.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(IndexFileError, match=re.escape(str(index))):
        RecordSource(str(copy), "val")
    index.unlink()
    with pytest.raises(IndexFileError, match="is missing"):
        RecordSource(str(copy), "val")


def test_missing_dataset_and_unknown_split(converted, tmp_path):
    with pytest.raises(DatasetNotFoundError, match="imagerecords.json or dataset_info.json"):
        RecordSource(str(tmp_path), "train")
    with pytest.raises(UnknownSplitError, match="its splits are: train, val, test"):
        RecordSource(str(converted.indexed), "validation")
    with pytest.raises(ValueError, match="only local paths and gs://"):
        RecordSource("s3://bucket/data", "train")


def test_format_2_metadata_name_wins_over_tfds_dataset_info(converted, tmp_path):
    """imagerecords.json is ours; the dataset_info.json beside it (no format_version) is TFDS's."""
    copy = tmp_path / "ds"
    shutil.copytree(converted.indexed, copy)
    assert "format_version" not in json.loads((copy / "dataset_info.json").read_text())
    source = RecordSource(str(copy), "train")
    assert source.info_path.endswith("imagerecords.json") and len(source) > 0
    ours = json.loads((copy / "imagerecords.json").read_text())
    (copy / "imagerecords.json").unlink()
    with pytest.raises(DatasetNotFoundError):
        RecordSource(str(copy), "train")
    ours["format_version"] = 4
    (copy / "imagerecords.json").write_text(json.dumps(ours))
    with pytest.raises(ValueError, match="format_version 4; this imagerecords reads 1, 2, 3"):
        RecordSource(str(copy), "train")


def test_a_format_version_1_dataset_reads(tmp_path):
    """tests/data/v1_dataset: its metadata is dataset_info.json, with a format_version."""
    source = RecordSource(str(Path(__file__).parent / "data" / "v1_dataset"), "train")
    assert source.info_path.endswith("dataset_info.json")
    rows = [source[i] for i in range(len(source))]
    assert len(rows) == 9 and {r["class_name"] for r in rows} <= {"cat", "dog", "fish"}


def test_imports_neither_tensorflow_nor_beam(converted):
    code = (
        "import sys\n"
        "from imagerecords import RecordSource\n"
        f"source = RecordSource({str(converted.plain)!r}, 'train')\n"
        "source.__getitems__(range(len(source)))\n"
        "print(sorted(m for m in ('tensorflow', 'apache_beam') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


def test_map_style_protocol_as_a_dataloader_uses_it(converted):
    """PyTorch's DataLoader, reduced to its protocol: a sampler, batches of indices, __getitems__."""
    source = RecordSource(str(converted.indexed), "train")
    for epoch in range(2):
        order = list(range(len(source)))
        random.Random(epoch).shuffle(order)  # RandomSampler
        seen = []
        for start in range(0, len(order), 8):  # BatchSampler(batch_size=8)
            batch = source.__getitems__(order[start : start + 8])
            seen += [(r["filename"], r["label"]) for r in batch]
        assert sorted(name for name, _ in seen) == sorted(r["filename"] for r in source)
        assert all(label == _expected_label(name) for name, label in seen)


# ------------------------------------------------------------------ Grain


def _names(batches) -> list[str]:
    return [str(name) for batch in batches for name in batch["filename"]]


def test_grain_map_dataset_global_shuffle_every_record_once_per_epoch(converted):
    source = RecordSource(str(converted.indexed), "train")
    n = len(source)
    dataset = (
        grain.MapDataset.source(source)
        .shuffle(seed=7)
        .repeat(2)
        .map(lambda r: {"filename": r["filename"], "label": r["label"]})
        .batch(5)
    )
    batches = list(dataset.to_iter_dataset(grain.ReadOptions(num_threads=2)))
    names = _names(batches)
    labels = [int(label) for batch in batches for label in batch["label"]]
    in_order = [r["filename"] for r in source]
    epochs = names[:n], names[n:]
    assert len(names) == 2 * n
    for epoch in epochs:
        assert sorted(epoch) == sorted(in_order)
        assert epoch != in_order
    assert epochs[0] != epochs[1]  # a new permutation each epoch
    assert labels == [_expected_label(name) for name in names]


def test_grain_map_dataset_iterator_resumes_mid_epoch(converted):
    source = RecordSource(str(converted.indexed), "train")
    dataset = grain.MapDataset.source(source).shuffle(seed=3).map(lambda r: r["filename"])
    iterator = iter(dataset.to_iter_dataset())
    head = [next(iterator) for _ in range(7)]
    state = iterator.get_state()
    tail = list(iterator)
    resumed = iter(dataset.to_iter_dataset())
    resumed.set_state(state)
    assert list(resumed) == tail
    assert sorted(head + tail) == sorted(r["filename"] for r in source)


def _loader(source, seed=5):
    return grain.DataLoader(
        data_source=source,
        sampler=grain.samplers.IndexSampler(
            len(source),
            shard_options=grain.sharding.NoSharding(),
            shuffle=True,
            num_epochs=1,
            seed=seed,
        ),
        operations=[grain.transforms.Batch(4)],
        worker_count=0,
    )


def test_grain_data_loader_checkpoint_resumes_to_the_same_next_record(converted):
    source = RecordSource(str(converted.plain), "train")
    iterator = iter(_loader(source))
    head = [next(iterator) for _ in range(3)]
    state = iterator.get_state()
    rest = list(iterator)
    resumed = iter(_loader(source))
    resumed.set_state(state)
    again = list(resumed)
    assert _names(again) == _names(rest) and len(rest) > 0
    names = _names(head + rest)
    assert sorted(names) == sorted(r["filename"] for r in source)  # once each
    labels = [int(x) for batch in head + rest for x in batch["label"]]
    assert labels == [_expected_label(name) for name in names]


# ------------------------------------------------------------------ docs/trainers.md


def _doc_blocks() -> list[str]:
    return [code for _, code in _marked_blocks()]


def _marked_blocks() -> list[tuple[bool, str]]:
    """(whether it needs torch: a ``needs-torch`` marker above it, its code) per block."""
    found = re.findall(
        r"(<!-- snippet: needs-torch -->\n)?```python\n(.*?)```", DOC.read_text(), re.S
    )
    return [(bool(marker), code) for marker, code in found]


def _file_name(block: str) -> str | None:
    """A block whose first line is ``# name.py`` is a file the others import."""
    match = re.fullmatch(r"# (\w+\.py)", block.splitlines()[0])
    return match.group(1) if match else None


def _doc_workdir(tmp_path: Path, dataset: Path) -> Path:
    (tmp_path / "photos-records").symlink_to(dataset)
    for block in _doc_blocks():
        name = _file_name(block)
        if name:
            (tmp_path / name).write_text(block)
    return tmp_path


@pytest.mark.parametrize(
    "number",
    [
        pytest.param(i, marks=pytest.mark.torch) if torch else i
        for i, (torch, code) in enumerate(_marked_blocks())
        if not _file_name(code)
    ],
)
def test_docs_examples_run(converted, tmp_path, number):
    _, block = _marked_blocks()[number]  # needs-torch ones: marked, and left out without torch
    workdir = _doc_workdir(tmp_path, converted.indexed)
    (workdir / "example.py").write_text(block)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=workdir, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


# ------------------------------------------------------------------ gs://


class _Requests(list):
    """(method, path, Range) of each object request; ``other``: every other request."""

    other: list


class _CountingProxy(BaseHTTPRequestHandler):
    """Forwards every request to the emulator and logs (method, path, Range)."""

    upstream: tuple[str, int]
    log: _Requests

    def _forward(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        connection = http.client.HTTPConnection(*self.upstream, timeout=30)
        connection.request(self.command, self.path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        entry = (self.command, self.path, self.headers.get("Range"))
        path = urllib.parse.urlsplit(self.path).path
        (self.log if "/o/" in path else self.log.other).append(entry)
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        connection.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, *args):
        pass


@pytest.fixture
def counted_gcs(gcs_emulator, monkeypatch):
    """STORAGE_EMULATOR_HOST through a proxy; yields the object requests it saw.

    Only object requests (``/o/`` in the path) are the source's: the storage
    client (3.17) also looks its bucket up once, in a background thread, for
    its tracing metadata (and checks the bucket exists after a 404), which may
    land at any time; those are bucket requests and are kept apart in ``.other``.
    """
    url = urllib.parse.urlsplit(gcs_emulator.url)
    log = _Requests()
    log.other = []
    handler = type("Handler", (_CountingProxy,), {"upstream": (url.hostname, url.port), "log": log})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_address[1]}")
    yield log
    server.shutdown()
    server.server_close()


def _runs(source: RecordSource, positions) -> int:
    """Runs of adjacent records in the same shard among ``positions``."""
    starts = [0]
    for shard in source.shards:
        starts.append(starts[-1] + shard.num_examples)
    wanted = set(positions)
    return sum(1 for p in wanted if p - 1 not in wanted or p in starts)


@pytest.mark.e2e
def test_gcs_reads_are_ranged_and_bounded_per_batch(converted, gcs_emulator, counted_gcs):
    bucket = gcs_emulator.create_bucket()
    url = f"gs://{bucket}/indexed"
    gcs_emulator.upload_dir(converted.indexed, url)
    local = RecordSource(str(converted.indexed), "train")

    counted_gcs.clear()
    source = RecordSource(url, "train")
    # imagerecords.json, then one .idx per shard.
    assert len(counted_gcs) == 1 + len(source.shards)

    counted_gcs.clear()
    assert source[5] == local[5]
    assert len(counted_gcs) == 1 and counted_gcs[0][0] == "GET" and counted_gcs[0][2]

    batch = random.Random(1).sample(range(len(source)), 16)
    counted_gcs.clear()
    assert source.__getitems__(batch) == [local[i] for i in batch]
    assert len(counted_gcs) == _runs(source, batch) <= 16
    assert all(method == "GET" and ranged for method, _, ranged in counted_gcs)

    consecutive = list(range(len(source)))
    counted_gcs.clear()
    assert source.__getitems__(consecutive) == [local[i] for i in consecutive]
    assert len(counted_gcs) == len(source.shards)  # one range per shard
    # Whatever else the client sent were lookups of the bucket, none per read.
    assert {urllib.parse.urlsplit(path).path for _, path, _ in counted_gcs.other} <= {
        f"/storage/v1/b/{bucket}"
    }


@pytest.mark.e2e
def test_gcs_without_index_files_scans_each_shard_once(
    converted, gcs_emulator, counted_gcs, caplog
):
    bucket = gcs_emulator.create_bucket()
    url = f"gs://{bucket}/plain"
    gcs_emulator.upload_dir(converted.plain, url)
    counted_gcs.clear()
    source = RecordSource(url, "train")
    assert f"{url} has no index files: reading its 3 shards of 'train' once" in caplog.text
    small = all(s.num_bytes <= index_lib.GCS_SCAN_WINDOW for s in source.shards)
    assert small and len(counted_gcs) == 1 + len(source.shards)
    local = RecordSource(str(converted.plain), "train")
    assert [r["filename"] for r in source] == [r["filename"] for r in local]


@pytest.mark.e2e
def test_grain_reads_gcs(converted, gcs_emulator, counted_gcs):
    bucket = gcs_emulator.create_bucket()
    url = f"gs://{bucket}/indexed"
    gcs_emulator.upload_dir(converted.indexed, url)
    source = RecordSource(url, "val")
    dataset = grain.MapDataset.source(source).shuffle(seed=1).map(lambda r: r["filename"])
    counted_gcs.clear()
    names = list(dataset.to_iter_dataset(grain.ReadOptions(num_threads=4)))
    assert sorted(names) == sorted(
        r["filename"] for r in RecordSource(str(converted.indexed), "val")
    )
    assert collections.Counter(method for method, _, _ in counted_gcs) == {"GET": len(source)}
