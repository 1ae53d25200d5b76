"""``python -m bench.tools.shard_memory``: memory of the shuffle path's shard writer.

What it measures: one shard of ``--mb`` megabytes (records of 40-160 KB, in
~4 MB ``RecordBatch``es, as ConvertImages cuts them) through the Beam graph's
shard writer (``staging.write_staged_shard``, all its DoFn does), made on the fly
so that the input never sits in memory. Prints the traced Python allocation
peak above the start (``tracemalloc``) and the process's peak RSS above its
RSS at the start (``/proc/self/status`` VmHWM, reset first), per shard size:
what one shard in flight costs a Dataflow worker. The per-record arrays
(key, label, positions) grow with the records; the rest is fixed.

    python -m bench.tools.shard_memory [--mb 100,300,1000] [--staging DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import tempfile
import time
import tracemalloc

from beam_pipeline.core.elements import RecordBatch, ShardEntry
from beam_pipeline.stages.staging import write_staged_shard

SPLIT = "train"
BATCH_BYTES = 4 << 20  # what ConvertImages cuts a RecordBatch at


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


class Shard:
    """A shard's records, each a function of its number (never all held at once)."""

    def __init__(self, megabytes: int, seed: int = 11):
        rng = random.Random(seed)
        self._pool = rng.randbytes(1 << 20)
        self.records = []  # (key, image ID, label, size)
        total = 0
        while total < megabytes << 20:
            size = rng.randrange(40_000, 160_000)
            n = len(self.records)
            self.records.append((rng.getrandbits(64), f"photos/{n:07d}.jpg", n % 10, size))
            total += size

    def record(self, n: int) -> bytes:
        size = self.records[n][3]
        start = (n * 7919) % (len(self._pool) - size)
        return n.to_bytes(8, "little") + self._pool[start + 8 : start + size]

    def batches(self):
        batch, size = [], 0
        for n, (key, image_id, label, length) in enumerate(self.records):
            batch.append(ShardEntry(key, image_id, label, length, self.record(n)))
            size += length
            if size >= BATCH_BYTES:
                yield RecordBatch(SPLIT, tuple(batch))
                batch, size = [], 0
        if batch:
            yield RecordBatch(SPLIT, tuple(batch))

    def sha256(self) -> str:
        digest = hashlib.sha256()
        for n in sorted(range(len(self.records)), key=lambda n: self.records[n][:2]):
            digest.update(self.record(n))
        return digest.hexdigest()


def measure(megabytes: int, work: str) -> dict:
    """One shard through the writer: traced peak and RSS peak above the start, wall time."""
    shard = Shard(megabytes)
    rss_start = _status_kb("VmRSS")
    _reset_peak_rss()
    tracemalloc.start()
    try:
        started = time.perf_counter()
        traced_start, _ = tracemalloc.get_traced_memory()
        # The DoFn's own loop: the grouped batches' entries, read once, as one shard of one.
        entries = (entry for batch in shard.batches() for entry in batch.entries)
        info = write_staged_shard(f"{work}/out-{megabytes}", SPLIT, 0, 1, entries)
        wall = time.perf_counter() - started
        _, traced_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_peak = _status_kb("VmHWM")
    assert info.sha256 == shard.sha256(), "the shard's bytes differ from the sorted records"
    shutil.rmtree(f"{work}/out-{megabytes}", ignore_errors=True)
    return {
        "shard_mb": info.num_bytes / 1e6,
        "records": info.num_examples,
        "traced_peak_mb": (traced_peak - traced_start) / 1e6,
        "rss_peak_above_start_mb": (rss_peak - rss_start) / 1e3,
        "wall_s": wall,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.shard_memory", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--mb", default="100,300,1000", help="shard sizes, MiB (comma-separated)")
    parser.add_argument("--staging", help="temp folder for the staging files (default: $TMPDIR)")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="imagerecords-shard-memory-")
    if args.staging:
        tempfile.tempdir = args.staging
    try:
        for megabytes in (int(m) for m in args.mb.split(",")):
            row = measure(megabytes, work)
            print(
                f"{row['shard_mb']:7.0f} MB shard, {row['records']:6,} records: traced peak "
                f"{row['traced_peak_mb']:6.1f} MB, peak RSS +{row['rss_peak_above_start_mb']:.1f} "
                f"MB above the start, {row['wall_s']:.1f} s",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
