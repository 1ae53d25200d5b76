"""The Beam graph: one composite PTransform per stage (docs/format.md sections 2-7).

ListImages      PBegin -> ImageRef ("refs") + Skipped ("skipped")
ConvertImages   ImageRef -> Record (main) + Rejection ("rejected")
WriteShards     {Record, ImageRef, Rejection} -> ShardInfo dict (main)
                + the books of each key range ("books": split, listed, problems)
Finalize        side inputs -> rejects.jsonl, labels.txt, dataset_info.json (last)
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import time
import uuid
from collections import Counter

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsDict, AsList, TaggedOutput
from apache_beam.transforms.window import GlobalWindows

from beam_pipeline import errors, images, keys, listing, local_pool, metadata, records
from beam_pipeline.convert import (
    Outcome,
    Record,
    Rejection,
    convert_chunk,
    convert_ref,
    finish,
    payload_size,
)
from beam_pipeline.errors import BooksDoNotBalance

NAMESPACE = "imagerecords"
TMP_DIR = ".imagerecords-tmp"
REJECTED = "rejected"
SKIPPED = "skipped"
BOOKS = "books"
_MAX_PROBLEMS_SHOWN = 20
_LOG_EVERY_S = 15.0  # progress line per converting worker

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Everything the graph needs; built and validated by the CLI."""

    layout: listing.Layout
    output: str
    splits: dict[str, float]
    seed: int = 42
    image: images.ImageSpec = images.ImageSpec()
    target_shard_bytes: int = 200 * 2**20
    min_shards: int = 1
    max_reject_fraction: float = 0.01
    # Also write <shard>.idx: "offset length" per record (NVIDIA DALI's format).
    index_files: bool = False
    # >1: convert in that many local processes (for in-process runners only).
    conversion_processes: int = 1

    @property
    def split_names(self) -> list[str]:
        """Splits in dataset_info order: the layout's own, else --splits."""
        return list(self.layout.split_names or self.splits)


def _output_path(output: str, name: str) -> str:
    return listing.join(output, name)


def _write_atomically(path: str, data: bytes) -> None:
    """Temp file then rename: readers never see a partial file."""
    temp = f"{path}.tmp-{uuid.uuid4().hex}"
    with FileSystems.create(temp, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
        stream.write(data)
    FileSystems.rename([temp], [path])


# --------------------------------------------------------------------- listing


def _refs_or_skipped(entries, to_ref):
    for entry in entries:
        if isinstance(entry, listing.Skipped):
            yield TaggedOutput(SKIPPED, entry)
        else:
            yield to_ref(*entry)


class ListImages(beam.PTransform):
    """PBegin -> {"refs": ImageRef, every image's split assigned; "skipped": Skipped}."""

    def __init__(self, config: JobConfig):
        super().__init__()
        self._config = config

    def expand(self, pbegin):
        layout, seed, splits = self._config.layout, self._config.seed, self._config.splits
        listed = Metrics.counter(NAMESPACE, "images_listed")

        def to_ref(image_id, path, label, split):
            listed.inc()
            return listing.ImageRef(
                image_id, path, label, split or keys.assign_split(seed, image_id, splits)
            )

        if layout.kind == "manifest":
            label_of = {name: i for i, name in enumerate(layout.classes)}
            refs = (
                pbegin
                | "ManifestPath" >> beam.Create([layout.manifest], reshuffle=False)
                # str -> ImageRef (one worker streams the file; conversion fans out below)
                | "ReadManifest"
                >> beam.FlatMap(
                    lambda path: (
                        to_ref(row.image_id, row.path, label_of[row.label_name], row.split)
                        for row in listing.read_manifest(path, layout.root)
                    )
                )
            )
            skipped = pbegin | "NothingSkipped" >> beam.Create([])  # a manifest names its files
        else:
            # Create's own Reshuffle would cost a shuffle stage; SpreadFolders
            # below redistributes where there is more than one worker.
            folders = pbegin | "ClassFolders" >> beam.Create(list(layout.folders), reshuffle=False)
            if self._config.conversion_processes == 1:
                # ClassFolder, one per worker: folders are listed in parallel
                folders = folders | "SpreadFolders" >> beam.Reshuffle()
            found = folders | "ListFolder" >> beam.FlatMap(
                lambda folder: _refs_or_skipped(listing.list_folder(folder, layout.root), to_ref)
            ).with_outputs(SKIPPED, main="refs")
            refs, skipped = found.refs, found[SKIPPED]
        if self._config.conversion_processes == 1:
            # ImageRef, redistributed so that conversion is not fused to the listing
            # worker (one local runner process: the conversion pool fans out instead)
            refs = refs | "SpreadImages" >> beam.Reshuffle()
        return {"refs": refs, SKIPPED: skipped}


# ------------------------------------------------------------------ conversion


class _ConvertFn(beam.DoFn):
    """ImageRef -> Record, or Rejection on the ``rejected`` output; converts inline."""

    def __init__(self, config: JobConfig):
        self._args = (config.image, config.seed, config.layout.classes)
        self._converted = Metrics.counter(NAMESPACE, "images_converted")
        self._rejected = Metrics.counter(NAMESPACE, "images_rejected")
        self._passed = Metrics.counter(NAMESPACE, "images_passed_through")
        self._bytes_in = Metrics.counter(NAMESPACE, "bytes_read")
        self._bytes_out = Metrics.counter(NAMESPACE, "record_bytes")

    def setup(self):
        self._count = 0
        self._started = self._last_log = time.monotonic()

    def process(self, ref):
        yield self._emit(convert_ref(tuple(ref), *self._args))

    def _emit(self, outcome: Outcome):
        self._bytes_in.inc(outcome.bytes_read)
        if isinstance(outcome.result, Rejection):
            self._rejected.inc()
            return TaggedOutput(REJECTED, outcome.result)
        self._converted.inc()
        self._bytes_out.inc(len(outcome.result.payload))
        if outcome.passed_through:
            self._passed.inc()
        self._count += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            rate = self._count / (now - self._started)
            log.info("converted %d images so far (%.1f images/s)", self._count, rate)
            self._last_log = now
        return outcome.result


class _Finishing:
    """Future-like: an image converted ahead, finished into its record on demand."""

    def __init__(self, ahead, ref, seed, classes):
        (self._future, self._index), self._ref = ahead, ref
        self._seed, self._classes = seed, classes

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> list[Outcome]:
        decoded = self._future.result()[self._index]
        return [finish(self._ref, decoded, self._seed, self._classes)]


class _PooledConvertFn(_ConvertFn):
    """Like _ConvertFn, but spreads the images over local worker processes.

    For runners that execute a bundle in one process (DirectRunner in_memory),
    this is what uses every core: the Beam graph stays in one process with no
    gRPC hops, and only the codec work moves to the pool. Results may come back
    in any order; shard contents are sorted later, so output bytes do not change.
    A worker that dies (a decoder crash) costs the one image that killed it,
    which becomes a rejection; the others are converted again.
    """

    CHUNK = 8

    def __init__(self, config: JobConfig, processes: int):
        super().__init__(config)
        self._processes = processes
        self._ahead = Metrics.counter(NAMESPACE, "images_converted_ahead")

    def setup(self):
        super().setup()
        self._executor = local_pool.take(self._processes)

    def _new_executor(self):
        return local_pool.new(self._processes)

    def _emit(self, outcome: Outcome):
        output = super()._emit(outcome)
        if isinstance(output, Record):  # the bytes stay here; see local_pool.park
            return output._replace(payload=local_pool.park(output.image_id, output.payload))
        return output

    def start_bundle(self):
        self._chunk: list[tuple] = []
        self._pending: collections.deque = collections.deque()  # (refs, future)

    def process(self, ref):
        ref = tuple(ref)
        ahead = local_pool.claim(ref[1])
        if ahead is not None:  # converted while Beam was starting
            self._ahead.inc()
            self._pending.append(([ref], _Finishing(ahead, ref, *self._args[1:])))
        else:
            self._chunk.append(ref)
            if len(self._chunk) >= self.CHUNK:
                self._submit()
        # Keep every process busy, but bound what is in flight (memory).
        while self._pending and (
            self._pending[0][1].done() or len(self._pending) > 3 * self._processes
        ):
            yield from map(self._emit, self._next_outcomes())

    def _submit(self):
        if self._chunk:
            future = self._executor.submit(convert_chunk, self._chunk, *self._args)
            self._pending.append((self._chunk, future))
            self._chunk = []

    def _next_outcomes(self) -> list[Outcome]:
        try:
            outcomes = self._pending[0][1].result()
        except concurrent.futures.process.BrokenProcessPool:
            outcomes = self._recover()
        self._pending.popleft()
        return outcomes

    def _recover(self) -> list[Outcome]:
        """A worker died: convert every in-flight image again, one per task."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        local_pool.drop_ahead()  # those futures died with the pool
        executor = None
        for index, (refs, _) in enumerate(self._pending):
            outcomes = []
            for ref in refs:
                executor = executor or self._new_executor()
                try:
                    outcomes += executor.submit(convert_chunk, [ref], *self._args).result()
                except concurrent.futures.process.BrokenProcessPool:
                    image_id, path, _, split = ref
                    reason = "crashed the image decoder (its worker process died)"
                    outcomes.append(Outcome(Rejection(image_id, path, split, reason), 0, False))
                    executor.shutdown(wait=False)
                    executor = None
            finished = concurrent.futures.Future()
            finished.set_result(outcomes)
            self._pending[index] = (refs, finished)
        self._executor = executor or self._new_executor()
        return self._pending[0][1].result()

    def finish_bundle(self):
        self._submit()
        while self._pending:
            for output in map(self._emit, self._next_outcomes()):
                if isinstance(output, TaggedOutput):
                    yield TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
                else:
                    yield GlobalWindows.windowed_value(output)

    def teardown(self):
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True)


class ConvertImages(beam.PTransform):
    """ImageRef -> Record, with Rejection on the ``rejected`` output."""

    def __init__(self, config: JobConfig):
        super().__init__()
        self._config = config

    def expand(self, refs):
        processes = self._config.conversion_processes
        fn = (
            _PooledConvertFn(self._config, processes) if processes > 1 else _ConvertFn(self._config)
        )
        return refs | "Convert" >> beam.ParDo(fn).with_outputs(REJECTED, main="records")


# --------------------------------------------------------------------- shards


# What goes through the shard GroupByKey: every record, and every listed and
# rejected image ID, keyed by the hash range of its order key. One group then
# holds everything needed both to write that shard and to check its books.
#   (kind, key, image_id, label, payload)     kind: RECORD | LISTED | REJECTED_ID
RECORD, LISTED, REJECTED_ID = "record", "listed", "rejected"


def _entry_of_record(record: Record):
    return record.split, record.key, RECORD, record.image_id, record.label, record.payload


def _entry_of_id(item, kind: str, seed: int):
    """A listed ImageRef or a Rejection: the ID alone, under its order key."""
    return item.split, keys.order_key(seed, item.image_id), kind, item.image_id, -1, b""


def _assign_shard(entry, shard_counts: dict[str, int]):
    split, key, kind, image_id, label, payload = entry
    # A split whose images were all rejected has no bytes and so no count: 1 range.
    shard = keys.shard_of_key(key, shard_counts.get(split, 1))
    return (split, shard), (kind, key, image_id, label, payload)


def balance(entries) -> tuple[int, int, list[str]]:
    """Books of one key range -> (listed count, problem count, first problems).

    Every listed ID must be exactly once a record or a rejection.
    """
    seen: dict[str, Counter] = {}
    for kind, _, image_id, _, _ in entries:
        seen.setdefault(image_id, Counter())[kind] += 1
    listed_total, problems = 0, []
    for image_id, count in seen.items():
        listed, written, rejected = count[LISTED], count[RECORD], count[REJECTED_ID]
        listed_total += listed
        if listed == 1 and written + rejected == 1:
            continue
        if not listed:
            problems.append(f"not listed but written/rejected: {image_id}")
        elif listed > 1:
            problems.append(f"listed {listed} times: {image_id}")
        elif not written and not rejected:
            problems.append(f"lost (neither written nor rejected): {image_id}")
        else:
            problems.append(f"doubled ({written} records, {rejected} rejections): {image_id}")
    return listed_total, len(problems), sorted(problems)[:_MAX_PROBLEMS_SHOWN]


def _with_payloads(items: list[tuple]) -> list[tuple]:
    """Record entries with parked payloads (sizes, see local_pool.park) taken back."""
    parked: dict[str, bytes] = {}
    out = []
    for kind, key, image_id, label, payload in items:
        if isinstance(payload, int):
            if image_id not in parked:  # a doubled record (the books fail it) parks once
                parked[image_id] = local_pool.unpark(image_id)
            payload = parked[image_id]
        out.append((kind, key, image_id, label, payload))
    return out


class _WriteShardFn(beam.DoFn):
    """((split, hash range), [entry]) -> ShardInfo dict of a temp file; books on ``books``.

    Holds one shard's records in memory (to sort them), never a whole split.
    """

    def __init__(self, output: str, index_files: bool = False):
        self._output = output
        self._index_files = index_files
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._bytes = Metrics.counter(NAMESPACE, "shard_bytes_written")

    def process(self, element):
        (split, shard), entries = element
        entries = list(entries)
        yield TaggedOutput(BOOKS, (split, *balance(entries)))
        # Sorting by (key, id) makes the shard's bytes independent of bundle order.
        items = sorted((e for e in entries if e[0] == RECORD), key=lambda e: (e[1], e[2]))
        items = _with_payloads(items)
        if items:  # a range with only rejections gets no file
            yield self._write(split, shard, items)

    def _write(self, split, shard, items) -> dict:
        # A unique temporary name per attempt: a retried bundle never collides
        # with, or leaves, a partial file under a final name. Finalize renames
        # the reported files into place once the books balance (dense numbers:
        # hash ranges that hold no record get no file).
        temp = _output_path(self._output, f"{TMP_DIR}/{split}-{shard:05d}.{uuid.uuid4().hex}")
        digest = hashlib.sha256()
        size = 0
        index: list[str] = []
        class_counts: Counter[int] = Counter()
        with FileSystems.create(temp, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
            for _, _, _, label, payload in items:
                framed = records.frame_record(payload)
                stream.write(framed)
                digest.update(framed)
                index.append(f"{size} {len(framed)}\n")
                size += len(framed)
                class_counts[label] += 1
        info = {}
        if self._index_files:
            info["temp_index"] = temp + ".idx"
            with FileSystems.create(
                info["temp_index"], compression_type=CompressionTypes.UNCOMPRESSED
            ) as stream:
                stream.write("".join(index).encode())
        self._shards.inc()
        self._bytes.inc(size)
        return {
            **info,
            "split": split,
            "range": shard,
            "temp": temp,
            "num_examples": len(items),
            "num_bytes": size,
            "sha256": digest.hexdigest(),
            "class_counts": {str(k): v for k, v in sorted(class_counts.items())},
        }


class WriteShards(beam.PTransform):
    """{records, listed, rejected} -> ShardInfo dicts, plus books per range on ``books``.

    Listed and rejected IDs travel through the same GroupByKey as the records,
    so the books are checked range by range with no second shuffle of all IDs.
    """

    def __init__(self, config: JobConfig):
        super().__init__()
        self._config = config

    def expand(self, pcolls):
        seed = self._config.seed
        target, minimum = self._config.target_shard_bytes, self._config.min_shards
        recs = pcolls["records"]
        shard_counts = (
            recs
            # Record -> (split, framed size)
            | "RecordSizes"
            >> beam.Map(lambda r: (r.split, payload_size(r.payload) + records.FRAME_OVERHEAD))
            | "BytesPerSplit" >> beam.CombinePerKey(sum)
            # (split, bytes) -> (split, shard count)
            | "ShardsPerSplit"
            >> beam.MapTuple(lambda split, size: (split, keys.num_shards(size, target, minimum)))
        )
        entries = (
            recs | "RecordEntries" >> beam.Map(_entry_of_record),
            pcolls["listed"] | "ListedEntries" >> beam.Map(_entry_of_id, LISTED, seed),
            pcolls["rejected"] | "RejectedEntries" >> beam.Map(_entry_of_id, REJECTED_ID, seed),
        ) | "AllEntries" >> beam.Flatten()
        groups = (
            entries
            # (split, key, kind, id, label, payload) -> ((split, range), (kind, key, id, label, payload))
            | "AssignShard" >> beam.Map(_assign_shard, shard_counts=AsDict(shard_counts))
            | "GroupByShard" >> beam.GroupByKey()
        )
        writer = _WriteShardFn(self._config.output, self._config.index_files)
        return groups | "WriteShard" >> beam.ParDo(writer).with_outputs(BOOKS, main="shards")


# ---------------------------------------------------------------- bookkeeping


class _Finalize(beam.DoFn):
    def __init__(self, config: JobConfig):
        self._config = config

    def process(self, _, shards, rejects, books, skipped):
        config = self._config
        listed: Counter[str] = Counter()
        problem_count, problems = 0, []
        for split, listed_count, range_problem_count, range_problems in books:
            listed[split] += listed_count
            problem_count += range_problem_count
            problems += range_problems
        output = config.output
        _write_atomically(
            _output_path(output, metadata.REJECTS_FILE),
            metadata.rejects_jsonl(
                {"path": r.path, "id": r.image_id, "split": r.split, "reason": r.reason}
                for r in rejects
            ),
        )
        _write_atomically(
            _output_path(output, metadata.LABELS_FILE), metadata.labels_text(config.layout.classes)
        )
        skipped = list(skipped) + [
            listing.Skipped(path, listing.NOT_IN_CLASS_FOLDER) for path in config.layout.loose_files
        ]
        _write_atomically(
            _output_path(output, metadata.SKIPPED_FILE),
            metadata.skipped_jsonl({"path": s.path, "reason": s.reason} for s in skipped),
        )
        total_listed = sum(listed.values())
        if problem_count:
            raise BooksDoNotBalance(
                f"the job's books do not balance: {problem_count} image IDs were lost or "
                f"doubled; dataset_info.json was not written. First: "
                + "; ".join(sorted(problems)[:_MAX_PROBLEMS_SHOWN])
            )
        if not total_listed:
            raise BooksDoNotBalance("no images were found in the input; nothing was written")
        written = sum(s["num_examples"] for s in shards)
        if written + len(rejects) != total_listed:
            raise BooksDoNotBalance(
                f"the job's books do not balance: listed {total_listed}, wrote {written}, "
                f"rejected {len(rejects)}; dataset_info.json was not written"
            )
        if len(rejects) / total_listed > config.max_reject_fraction:
            raise errors.too_many_rejects(
                (r.reason for r in rejects),
                total_listed,
                config.max_reject_fraction,
                _output_path(output, metadata.REJECTS_FILE),
            )
        shards = _move_into_place(shards, output)
        rejected_by_split = Counter(r.split for r in rejects)
        splits = metadata.split_order(
            config.split_names, [s["split"] for s in shards] + list(rejected_by_split)
        )
        spec = config.image
        info = metadata.build_info(
            source=config.layout.manifest or config.layout.root,
            seed=config.seed,
            classes=config.layout.classes,
            image={
                "resize": spec.resize,
                "size": spec.size,
                "upscale": spec.upscale,
                "jpeg_quality": spec.jpeg_quality,
                "format": "jpeg",
                "channels": 3,
            },
            splits=splits,
            shards=shards,
            rejected_by_split=rejected_by_split,
            skipped_reasons=[s.reason for s in skipped],
            config={
                "layout": config.layout.kind,
                "splits": config.splits if config.layout.kind != "presplit" else None,
                "target_shard_mb": config.target_shard_bytes / 2**20,
                "min_shards": config.min_shards,
                "max_reject_fraction": config.max_reject_fraction,
            },
        )
        _delete_tree(_output_path(output, TMP_DIR))
        # Written last: its presence means the dataset is complete.
        _write_atomically(_output_path(output, metadata.INFO_FILE), metadata.dumps(info))
        yield json.dumps({s: info["splits"][s]["num_examples"] for s in splits})


def _move_into_place(shards: list[dict], output: str) -> list[dict]:
    """Renames the written temp files to their final, densely numbered names.

    Idempotent, so a retried Finalize completes the renames the first try began.
    """
    placed = []
    for split in sorted({s["split"] for s in shards}):
        of_split = [s for s in shards if s["split"] == split]
        numbering = keys.dense_shard_numbers([s["range"] for s in of_split])
        for shard in of_split:
            name = keys.shard_filename(split, numbering[shard["range"]], len(numbering))
            placed.append({**shard, "file": name, "final": _output_path(output, name)})
            if "temp_index" in shard:
                placed[-1]["index"] = name + ".idx"
    moves = [(s["temp"], s["final"]) for s in placed]
    moves += [(s["temp_index"], s["final"] + ".idx") for s in placed if "temp_index" in s]
    # One listing instead of an existence check per file (thousands on GCS).
    existing = {m.path for m in listing.files_under(_output_path(output, TMP_DIR))}
    pending = [(src, dst) for src, dst in moves if src in existing]
    if pending:
        FileSystems.rename([src for src, _ in pending], [dst for _, dst in pending])
    return placed


def _delete_tree(path: str) -> None:
    matches = listing.files_under(path)
    if matches:
        FileSystems.delete([m.path for m in matches])
    if listing.is_local(path) and FileSystems.exists(path):
        FileSystems.delete([path])


# ----------------------------------------------------------------------- graph


def build(pipeline: beam.Pipeline, config: JobConfig):
    """Adds the whole conversion to ``pipeline``; returns the final summary PCollection."""
    listed = pipeline | "ListImages" >> ListImages(config)
    refs = listed["refs"]
    converted = refs | "ConvertImages" >> ConvertImages(config)
    rejects = converted[REJECTED]
    written = {
        "records": converted.records,
        "listed": refs,
        "rejected": rejects,
    } | "WriteShards" >> WriteShards(config)
    return (
        pipeline
        | "Start" >> beam.Create([None], reshuffle=False)
        | "Finalize"
        >> beam.ParDo(
            _Finalize(config),
            shards=AsList(written.shards),
            rejects=AsList(rejects),
            books=AsList(written[BOOKS]),
            skipped=AsList(listed[SKIPPED]),
        )
    )
