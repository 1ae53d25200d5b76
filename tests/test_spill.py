"""Spill files and the resume index (beam_pipeline.core.spill): pure, no Beam."""

import concurrent.futures
import hashlib
import multiprocessing
import os

import pytest

from beam_pipeline.core import images, keys, metadata, spill
from beam_pipeline.core.elements import Converted, ImageRef, Rejection, RejectKind, SpillLocation
from beam_pipeline.stages import convert
from beam_pipeline.storage import discovery
from imagerecords import codec
from tests.image_factory import add_bad_files, make_class_folders


def _entries():
    framed = [codec.frame_record(f"record {i}".encode() * (i + 1)) for i in range(4)]
    items = [
        spill.encode(spill.RECORD, "train", f"cat/{i}.jpg", 1000 + i, i % 2, data)
        for i, data in enumerate(framed)
    ]
    items.insert(2, spill.encode(spill.REJECTION, "val", "dog/x.jpg", 77, -1, b"", "corrupt"))
    return framed, items


def test_entries_read_back_with_their_offsets(tmp_path):
    framed, items = _entries()
    writer = spill.Writer(str(tmp_path))
    offsets = writer.append(items[:3]) + writer.append(items[3:])
    writer.close()
    found = list(spill.scan(writer.path))
    assert [f.image_id for f in found] == [
        "cat/0.jpg",
        "cat/1.jpg",
        "dog/x.jpg",
        "cat/2.jpg",
        "cat/3.jpg",
    ]
    rejection = found[2]
    assert (rejection.split, rejection.reason, rejection.size) == ("val", "corrupt", 0)
    reader = spill.Reader()
    records_found = [f for f in found if not f.reason]
    for item, data in zip(records_found, framed, strict=True):
        assert item.size == len(data)
        assert reader.read(item.path, item.offset, item.size) == data
    reader.close()
    # The offsets the writer returned are where each entry starts.
    assert offsets[0] == 0 and sorted(offsets) == offsets


@pytest.mark.parametrize("damage", ["truncated", "zeros", "flipped"])
def test_a_damaged_tail_loses_only_the_entries_from_the_damage_on(tmp_path, damage):
    """A SIGKILL mid-write (truncated) or a power cut (zeros, garbage) is survived."""
    framed, items = _entries()
    writer = spill.Writer(str(tmp_path))
    writer.append(items)
    writer.close()
    whole = open(writer.path, "rb").read()
    last_start = len(whole) - len(items[-1])
    for cut in range(last_start, len(whole), 7):
        if damage == "truncated":
            data = whole[:cut]
        elif damage == "zeros":
            data = whole[:cut] + b"\0" * (len(whole) - cut)
        else:
            data = whole[:cut] + bytes([whole[cut] ^ 0x40]) + whole[cut + 1 :]
        with open(writer.path, "wb") as f:
            f.write(data)
        assert [f.image_id for f in spill.scan(writer.path)] == [
            "cat/0.jpg",
            "cat/1.jpg",
            "dog/x.jpg",
            "cat/2.jpg",
        ], cut


def test_a_damaged_record_in_the_middle_stops_the_scan_there(tmp_path):
    framed, items = _entries()
    writer = spill.Writer(str(tmp_path))
    writer.append(items)
    writer.close()
    data = bytearray(open(writer.path, "rb").read())
    data[len(items[0]) + len(items[1]) - 5] ^= 1  # inside cat/1's record bytes
    open(writer.path, "wb").write(bytes(data))
    assert [f.image_id for f in spill.scan(writer.path)] == ["cat/0.jpg"]


def test_index_over_files_takes_the_first_copy_and_is_read_once(tmp_path):
    _, items = _entries()
    for _ in range(2):  # the same images spilled twice (a retried bundle)
        writer = spill.Writer(str(tmp_path))
        writer.append(items)
        writer.close()
    (tmp_path / "notes.txt").write_text("not a spill file")
    index = spill.load_index(str(tmp_path))
    first = sorted(spill.spill_files(str(tmp_path)))[0]
    assert sorted(index) == ["cat/0.jpg", "cat/1.jpg", "cat/2.jpg", "cat/3.jpg", "dog/x.jpg"]
    assert {item.path for item in index.values()} == {first}
    writer = spill.Writer(str(tmp_path))
    writer.append([spill.encode(spill.RECORD, "train", "new.jpg", 5, 0, codec.frame_record(b"x"))])
    assert "new.jpg" not in spill.load_index(str(tmp_path))  # this run's files: not in it
    spill.forget_indexes()
    assert "new.jpg" in spill.load_index(str(tmp_path))  # read again once forgotten
    spill.forget_indexes()


def _spill_in_child(spill_dir, refs, spec, classes):
    return convert.spill_chunk(refs, spec, 42, classes, spill_dir), os.getpid()


def test_each_process_spills_to_its_own_file_and_returns_references(tmp_path):
    root = tmp_path / "images"
    ids = make_class_folders(str(root), per_class=4, nested=False)
    bad = add_bad_files(str(root))
    layout = discovery.discover(str(root))
    refs = discovery.local_refs(layout, 100, 10**9, 42, {"train": 0.5, "val": 0.5})
    spill_dir = str(tmp_path / "spill")
    spec = images.ImageSpec(size=32)
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        halves = [refs[::2], refs[1::2]]
        results = list(
            pool.map(_spill_in_child, [spill_dir] * 2, halves, [spec] * 2, [layout.classes] * 2)
        )
    outcomes = [o for result, _ in results for o in result]
    converted = [o.result for o in outcomes if isinstance(o.result, Converted)]
    rejected = [o.result for o in outcomes if isinstance(o.result, Rejection)]
    assert sorted(c.entry.image_id for c in converted) == sorted(ids)
    assert sorted(r.image_id for r in rejected) == sorted(bad)
    files = spill.spill_files(spill_dir)
    assert 1 <= len(files) <= 2  # one per process that got work
    reader = spill.Reader()
    for item in converted:
        where = item.entry.data
        assert isinstance(where, SpillLocation) and where.path in files
        framed = reader.read(where.path, where.offset, item.entry.size)
        (payload,) = codec.iter_records(__import__("io").BytesIO(framed))
        assert codec.parse_example(payload)["image/filename"].decode() == item.entry.image_id
        assert item.entry.key == keys.order_key(42, item.entry.image_id)
    reader.close()
    # The index a resumed run would read has every image, rejections included.
    index = spill.load_index(spill_dir)
    spill.forget_indexes()
    assert sorted(index) == sorted(ids + list(bad))
    assert {i for i, item in index.items() if item.reason} == set(bad)
    original = next(c for c in converted if c.entry.image_id == ids[0])
    # The source's sha256 survives the spill file (a resumed run still finds duplicates).
    with open(original.entry.path, "rb") as source:
        assert original.entry.sha256 == hashlib.sha256(source.read()).hexdigest()
    assert convert.from_spill(index[ids[0]], original.entry.path) == original


def test_default_spill_dir_is_local(monkeypatch, tmp_path):
    assert spill.default_dir("/data/out") == f"/data/out/{metadata.TMP_DIR}/spill"
    monkeypatch.setenv("IMAGERECORDS_SPILL_DIR", str(tmp_path))
    a, b = spill.default_dir("gs://b/out1"), spill.default_dir("gs://b/out2")
    assert a.startswith(str(tmp_path)) and a != b and a == spill.default_dir("gs://b/out1")


def test_a_rejection_the_same_bytes_would_get_again_is_spilled_a_transient_one_is_not(tmp_path):
    """An unreadable file (a real failing open(), here: not there yet) is retried on resume."""
    root = tmp_path / "images"
    ids = make_class_folders(str(root), classes=("a",), per_class=2, nested=False)
    bad = add_bad_files(str(root), "a")  # bad image data: deterministic rejections
    missing = str(root / "a" / "not-there-yet.jpg")
    refs = [ImageRef(i, str(root / i), 0, "train") for i in sorted(ids + list(bad))]
    refs.append(ImageRef("a/not-there-yet.jpg", missing, 0, "train"))
    spill_dir = str(tmp_path / "spill")
    outcomes = convert.spill_chunk(refs, images.ImageSpec(size=16), 42, ("a",), spill_dir)
    rejected = [o.result for o in outcomes if isinstance(o.result, Rejection)]
    reasons = {r.image_id: r.reason for r in rejected}
    kinds = {r.image_id: r.kind for r in rejected}
    assert reasons["a/not-there-yet.jpg"].startswith("cannot read: FileNotFoundError")
    index = spill.load_index(spill_dir)
    spill.forget_indexes()
    assert sorted(index) == sorted(ids + list(bad))  # all but the unreadable one
    assert {i for i, item in index.items() if item.reason} == set(bad)
    assert kinds["a/not-there-yet.jpg"] is RejectKind.UNREADABLE
    assert all(kinds[i] is RejectKind.BAD_IMAGE for i in bad)


def _spill_many(directory, count, copies_from=0):
    """``count`` records (every 7th a rejection) in one new spill file; returns the entries."""
    entries = []
    for i in range(copies_from, copies_from + count):
        image_id = f"class {i % 3}/photo-{i:06d}.jpg"
        if i % 7 == 0:
            entries.append(
                spill.encode(spill.REJECTION, "val", image_id, 10 * i, -1, b"", f"bad {i}")
            )
        else:
            sha = hashlib.sha256(image_id.encode()).hexdigest()
            framed = codec.frame_record(image_id.encode() * 3)
            entries.append(
                spill.encode(
                    spill.RECORD, ("train", "test")[i % 2], image_id, 10 * i, i % 3, framed, "", sha
                )
            )
    writer = spill.Writer(str(directory))
    writer.append(entries)
    writer.close()


def test_the_index_answers_as_a_dict_of_every_first_copy_would(tmp_path):
    _spill_many(tmp_path, 500)
    _spill_many(tmp_path, 300, copies_from=400)  # 100 IDs spilled twice, 200 new
    expected = {}
    for path in spill.spill_files(str(tmp_path)):
        for item in spill.scan(path):
            expected.setdefault(item.image_id, item)
    index = spill.Index(spill.spill_files(str(tmp_path)))
    assert len(index) == len(expected) == 700
    assert sorted(index) == sorted(expected)
    assert all(index[image_id] == item for image_id, item in expected.items())
    assert "class 0/photo-999999.jpg" not in index and index.get("nope") is None
    assert 12 not in index  # not an ID at all


@pytest.mark.slow
def test_the_index_holds_an_image_in_half_what_a_dict_of_tuples_held(tmp_path):
    """What a resumed run holds per image already converted (tracemalloc: Python's own count)."""
    import tracemalloc

    _spill_many(tmp_path, 20_000)
    paths = spill.spill_files(str(tmp_path))

    def held(build):
        tracemalloc.start()
        built = build()
        size, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(built) == 20_000
        return size / len(built)

    def as_tuples():  # the same index held as plain tuples, for comparison
        index = {}
        for path in paths:
            for item in spill.scan(path):
                index.setdefault(item.image_id, item)
        return index

    compact, tuples = held(lambda: spill.Index(paths)), held(as_tuples)
    assert compact < 0.6 * tuples, f"{compact:.0f} vs {tuples:.0f} bytes an image"


@pytest.mark.parametrize(
    "variable, value, under",
    [
        ("IMAGERECORDS_SPILL_DIR", "rel/spill", "{cwd}/rel/spill"),
        ("IMAGERECORDS_SPILL_DIR", "~/spill", "{home}/spill"),
        ("XDG_CACHE_HOME", "cache", "{cwd}/cache/imagerecords"),
    ],
)
def test_a_gcs_outputs_spill_folder_is_absolute_however_the_variable_spells_it(
    variable, value, under, tmp_path, monkeypatch
):
    monkeypatch.delenv("IMAGERECORDS_SPILL_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    found = spill.default_dir("gs://bucket/out")
    expected = under.format(cwd=tmp_path, home=tmp_path / "home")
    assert os.path.dirname(found) == expected
