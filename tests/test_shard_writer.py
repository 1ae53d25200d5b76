"""The shuffle path's shard writer: the same bytes as sorting in memory, in memory
that holds each record's key and position, not its bytes (staging.py)."""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import tracemalloc

import pytest

from beam_pipeline.core import books
from beam_pipeline.core.elements import ShardEntry, SpillLocation
from beam_pipeline.stages.shards import sort_entries, write_shard
from beam_pipeline.stages.staging import write_staged_shard
from bench.tools import shard_memory

SPLIT = "train"


def reference_shard(entries: list[ShardEntry], spilled: dict[str, bytes]) -> dict:
    """What a shard of ``entries`` holds, computed the old way: all in memory, sorted
    by (key, image ID) with equal pairs in arrival order (a stable sort)."""
    ordered = sorted(entries, key=lambda e: (e.key, e.image_id))
    records = [
        e.data if isinstance(e.data, bytes) else spilled[e.data.path][e.data.offset :][: e.size]
        for e in ordered
    ]
    index, offset = [], 0
    for record in records:
        index.append(f"{offset} {len(record)}\n")
        offset += len(record)
    counts: dict[int, int] = {}
    for e in ordered:
        counts[e.label] = counts.get(e.label, 0) + 1
    return {
        "bytes": b"".join(records),
        "index": "".join(index).encode(),
        "num_examples": len(ordered),
        "key_sum": books.key_sum([e.key for e in ordered]),
        "class_counts": tuple(sorted(counts.items())),
    }


def written(info) -> dict:
    with open(info.temp, "rb") as stream:
        data = stream.read()
    with open(info.temp_index, "rb") as stream:
        index = stream.read()
    assert info.num_bytes == len(data)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    return {
        "bytes": data,
        "index": index,
        "num_examples": info.num_examples,
        "key_sum": info.key_sum,
        "class_counts": info.class_counts,
    }


@pytest.fixture
def entries(tmp_path) -> tuple[list[ShardEntry], dict[str, bytes]]:
    """Records in arrival order: record bytes, spill references, and equal keys
    (different IDs arriving out of order; (key, ID) pairs repeated, different bytes)."""
    rng = random.Random(3)
    spill_path = str(tmp_path / "pool.spill")
    spill_data = rng.randbytes(50_000)
    with open(spill_path, "wb") as stream:
        stream.write(spill_data)
    result = []
    for i in range(200):
        key = rng.getrandbits(64)
        size = rng.randrange(1, 900)
        if i % 3 == 0:
            offset = rng.randrange(0, len(spill_data) - size)
            data = SpillLocation(spill_path, offset)
        else:
            data = rng.randbytes(size)
        result.append(ShardEntry(key, f"img/{i:04d}.jpg", i % 7, size, data))
    tied = rng.getrandbits(64)
    for image_id, data in [
        ("z.jpg", b"z-first"),
        ("b.jpg", b"b"),
        ("z.jpg", b"z-second, arrived later"),
        ("a.jpg", b"a"),
        ("\u00e9.jpg", b"e-acute"),
    ]:
        result.insert(rng.randrange(len(result)), ShardEntry(tied, image_id, 1, len(data), data))
    for copy in range(40):  # one (key, ID) pair many times: arrival order decides
        data = f"copy {copy}".encode()
        result.insert(rng.randrange(len(result)), ShardEntry(tied, "same.jpg", 4, len(data), data))
    result.insert(50, ShardEntry(0, "zero.jpg", 2, 4, b"zero"))
    result.insert(90, ShardEntry(2**64 - 1, "max.jpg", 3, 3, b"max"))
    return result, {spill_path: spill_data}


def test_staged_shard_has_the_bytes_of_the_in_memory_sort(entries, tmp_path):
    records, spilled = entries
    expected = reference_shard(records, spilled)
    staged = write_staged_shard(str(tmp_path / "out"), SPLIT, 3, 8, iter(records), index_files=True)
    in_memory = write_shard(
        str(tmp_path / "out"), SPLIT, 3, 8, sort_entries(list(records)), index_files=True
    )
    assert written(staged) == expected
    assert written(in_memory) == expected
    assert (staged.split, staged.index, staged.shards) == (SPLIT, 3, 8)
    assert staged.sha256 == in_memory.sha256


def test_the_arrival_order_of_distinct_records_does_not_change_the_shard(entries, tmp_path):
    # What a retried bundle sees: the same records, maybe in another order.
    records, spilled = entries
    distinct = [e for e in records if e.image_id not in ("z.jpg", "same.jpg")]
    shuffled = list(distinct)
    random.Random(9).shuffle(shuffled)
    first = write_staged_shard(str(tmp_path / "a"), SPLIT, 0, 1, distinct, index_files=True)
    second = write_staged_shard(str(tmp_path / "b"), SPLIT, 0, 1, shuffled, index_files=True)
    assert written(first) == written(second) == reference_shard(distinct, spilled)


def test_the_staging_file_is_deleted_after_success_and_failure(entries, tmp_path):
    records, _ = entries
    staging = tmp_path / "staging"
    staging.mkdir()
    write_staged_shard(str(tmp_path / "out"), SPLIT, 0, 1, records, staging_dir=str(staging))
    assert os.listdir(staging) == []

    def failing():
        yield from records[:20]
        raise RuntimeError("the shuffle read failed")

    with pytest.raises(RuntimeError, match="shuffle read failed"):
        write_staged_shard(str(tmp_path / "out"), SPLIT, 0, 1, failing(), staging_dir=str(staging))
    assert os.listdir(staging) == []


# ------------------------------------------------ a 300 MB shard through the DoFn

SHARD_MB = 300


def test_writing_a_300_mb_shard_holds_its_keys_not_its_bytes(tmp_path, monkeypatch):
    from beam_pipeline.engines.pipeline import _WriteShardFn

    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    # Made on the fly (each record a function of its number), as the bench tool does.
    shard = shard_memory.Shard(SHARD_MB)
    plans = {SPLIT: books.SplitPlan(SPLIT, 0, 0, 0, (), (len(shard.records),), (0,))}
    writer = _WriteShardFn(str(tmp_path / "out"))

    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        (info,) = writer.process(((SPLIT, 0), shard.batches()), plans)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak - start < 50 << 20, f"peak {(peak - start) >> 20} MB above the start"
    assert info.num_bytes == sum(r[3] for r in shard.records) >= SHARD_MB << 20
    assert info.num_examples == len(shard.records)
    assert info.sha256 == shard.sha256()
    assert os.listdir(staging) == []
