"""Shards: write one from its sorted records, check them against the plan, rename them.

Pure of Beam (the local engine runs it without importing Beam; the Beam graph
wraps it in ``pipeline.WriteShards`` and ``pipeline.Finalize``). Records are
ShardEntries that carry either the framed record or where the local pool
spilled it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from array import array
from collections import Counter
from collections.abc import Callable

from beam_pipeline.core import books, keys, metadata, spill
from beam_pipeline.core.elements import RecordBatch, ShardEntry
from beam_pipeline.stages.job_config import output_path
from beam_pipeline.storage import output as output_files


@dataclasses.dataclass(frozen=True)
class WrittenShard:
    """A shard written to a temp file: what Finalize checks, renames and describes."""

    split: str
    index: int
    shards: int  # in the split
    temp: str
    num_examples: int
    num_bytes: int
    sha256: str
    key_sum: int  # sum of its keys mod 2^64 (the books check it against the plan)
    class_counts: tuple[tuple[int, int], ...]  # (label, count), by label
    temp_index: str | None = None

    @property
    def file(self) -> str:
        return keys.shard_filename(self.split, self.index, self.shards)


def by_shard(batch: RecordBatch, plans: dict[str, books.SplitPlan]):
    """RecordBatch -> ((split, shard), RecordBatch) for each shard its records fall in."""
    plan = plans[batch.split]
    parts: dict[int, list[ShardEntry]] = {}
    for entry in batch.entries:
        parts.setdefault(plan.shard_of(entry.key), []).append(entry)
    for shard, entries in parts.items():
        yield (batch.split, shard), RecordBatch(batch.split, tuple(entries))


def sort_entries(entries: list[ShardEntry]) -> list[ShardEntry]:
    """A shard's records in their stored order: by (order key, image ID).

    Sorting makes the shard's bytes independent of the order records arrived in.
    """
    entries.sort(key=lambda e: (e.key, e.image_id))
    return entries


# How often write_shard reports: a 300 MB shard of phone photos is ~1,000
# records, of thumbnails ~100,000; a report per record would cost more than it says.
PROGRESS_EVERY = 256


def write_shard(
    output: str,
    split: str,
    shard: int,
    count: int,
    entries,
    index_files: bool = False,
    on_records: Callable[[int], None] | None = None,
) -> WrittenShard:
    """Writes ``entries`` (already sorted; any iterable, read once) to a temp file of
    shard ``shard`` of ``count``; ``on_records(n)`` hears of every
    :data:`PROGRESS_EVERY` records written, and of the rest at the end.

    A unique temporary name per attempt: a retried write never collides with,
    or leaves, a partial file under a final name. Finalize renames the reported
    files into place once the books balance. Per record only its key and size
    stay in memory (16 bytes), never its bytes.
    """
    temp = output_path(output, f"{metadata.TMP_DIR}/{split}-{shard:05d}.{uuid.uuid4().hex}")
    digest = hashlib.sha256()
    written_keys = array("Q")
    sizes = array("q")
    class_counts: Counter[int] = Counter()
    reader = spill.Reader()
    try:
        with output_files.create(temp) as stream:
            for entry in entries:
                framed = entry.data
                if not isinstance(framed, bytes):
                    framed = reader.read(framed.path, framed.offset, entry.size)
                stream.write(framed)
                digest.update(framed)
                written_keys.append(entry.key)
                sizes.append(len(framed))
                class_counts[entry.label] += 1
                if on_records is not None and len(sizes) % PROGRESS_EVERY == 0:
                    on_records(PROGRESS_EVERY)
    finally:
        reader.close()
    if on_records is not None and len(sizes) % PROGRESS_EVERY:
        on_records(len(sizes) % PROGRESS_EVERY)
    temp_index = None
    if index_files:
        temp_index = temp + ".idx"
        with output_files.create(temp_index) as stream:
            for chunk in _index_chunks(sizes):
                stream.write(chunk)
    return WrittenShard(
        split=split,
        index=shard,
        shards=count,
        temp=temp,
        num_examples=len(sizes),
        num_bytes=sum(sizes),
        sha256=digest.hexdigest(),
        key_sum=books.key_sum(written_keys),
        class_counts=tuple(sorted(class_counts.items())),
        temp_index=temp_index,
    )


def _index_chunks(sizes, lines_per_chunk: int = 4096):
    """The .idx file's bytes, a line ``"offset size"`` per record, a few thousand lines at a time."""
    offset = 0
    for start in range(0, len(sizes), lines_per_chunk):
        lines = []
        for size in sizes[start : start + lines_per_chunk]:
            lines.append(f"{offset} {size}\n")
            offset += size
        yield "".join(lines).encode()


def check_shards(
    plans: dict[str, books.SplitPlan], shards: list[WrittenShard]
) -> tuple[list[WrittenShard], list[str]]:
    """One written shard per planned shard, holding exactly the planned records.

    Returns the shards to keep and the problems. A shard reported twice with
    the same bytes (a retried write) is kept once.
    """
    chosen: dict[tuple[str, int], WrittenShard] = {}
    problems = []
    for shard in sorted(shards, key=lambda s: s.temp):
        seen = chosen.setdefault((shard.split, shard.index), shard)
        if seen is not shard and seen.sha256 != shard.sha256:
            problems.append(f"shard {shard.index} of {shard.split} written twice, differently")
    for split, plan in plans.items():
        for index in range(plan.shards):
            shard = chosen.get((split, index))
            if shard is None:
                problems.append(f"shard {index} of {split} was not written")
            elif (shard.num_examples, shard.key_sum) != (plan.counts[index], plan.key_sums[index]):
                problems.append(
                    f"shard {index} of {split} holds {shard.num_examples} records, "
                    f"not the {plan.counts[index]} planned"
                )
    return sorted(chosen.values(), key=lambda s: (s.split, s.index)), problems


def place_shards(shards: list[WrittenShard], output: str) -> list[dict]:
    """Renames the checked shards' temp files to their final names.

    Idempotent, so a retried Finalize completes the renames the first try began.

    Returns:
        One imagerecords.json row per shard (see ``metadata.build_info``).
    """
    rows = []
    moves = []
    for shard in shards:
        final = output_path(output, shard.file)
        row = {
            "split": shard.split,
            "file": shard.file,
            "num_examples": shard.num_examples,
            "num_bytes": shard.num_bytes,
            "sha256": shard.sha256,
            "class_counts": {str(label): n for label, n in shard.class_counts},
        }
        moves.append((shard.temp, final))
        if shard.temp_index:
            row["index"] = shard.file + ".idx"
            moves.append((shard.temp_index, final + ".idx"))
        rows.append(row)
    output_files.move_into_place(moves, output_path(output, metadata.TMP_DIR))
    return rows
