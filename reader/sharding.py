"""A split's shards shared out among input pipelines: which records each reads, and how many.

By file when there are enough shards, else by record (docs/reader.md,
"tf.distribute"); :class:`SplitShards` also counts each pipeline's batches.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from reader.config import AUTOTUNE, ReaderConfig, derive_seed
from reader.counting import shard_records
from reader.info import DatasetInfo, is_url, too_few_for_a_batch

_LOG = logging.getLogger(__name__)


def _interleave_parallelism(num_parallel_calls: int, cycle_length: int) -> int:
    """``num_parallel_calls`` for ``interleave``: AUTOTUNE, or at most ``cycle_length``.

    ``interleave`` refuses a fixed parallelism above its cycle length (e.g.
    ``num_parallel_calls=2`` on a split of one shard); the same number still
    applies to the decode map.
    """
    if num_parallel_calls == AUTOTUNE:
        return num_parallel_calls
    return max(1, min(num_parallel_calls, cycle_length))


class SplitShards:
    """The shards of one split and each input pipeline's share of them.

    Args:
        info: The dataset.
        config: The pipeline's settings (its ``split`` must be in ``info``).

    Raises:
        ValueError: the split has no shards.
    """

    def __init__(self, info: DatasetInfo, config: ReaderConfig):
        self._info = info
        self._config = config
        self._files = list(info.files(config.split))
        if not self._files:
            raise ValueError(f"split {config.split!r} of {info.path} has no shards")
        # Every shard's records are counted as they are read (shard_records),
        # when imagerecords.json gives every shard's count (the converter does).
        counts = [shard.num_examples for shard in info.split(config.split).shards]
        self._counts = None if None in counts else counts
        # Shards live in the dataset folder: on gs:// every read buffer refill is a
        # network round trip, worth a thread that reads ahead (_shard_then_read).
        self._remote = is_url(info.path)

    # Reading -------------------------------------------------------------------------
    def records(self, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        """The serialized records input pipeline ``pipeline_id`` of ``num_pipelines`` reads."""
        if num_pipelines > 1 and len(self._files) < num_pipelines:
            return self._read_then_shard(num_pipelines, pipeline_id)
        return self._shard_then_read(num_pipelines, pipeline_id)

    def _shard_then_read(self, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        """Each pipeline reads a disjoint set of shard files (the cheap, normal case)."""
        cfg = self._config
        files = self._shard_list()
        if cfg.shuffles_files and cfg.seed is not None:
            # Every pipeline draws the *same* permutation (same seed, same number of
            # epochs) and then takes every n-th file: the pipelines stay disjoint in
            # every epoch, and over epochs each one sees different files.
            files = files.shuffle(
                len(self._files),
                seed=derive_seed(cfg.seed, "files"),
                reshuffle_each_iteration=True,
            )
            files = files.shard(num_pipelines, pipeline_id)
        elif cfg.shuffles_files:
            # Unseeded pipelines would draw different permutations and overlap, so
            # fix the assignment first and shuffle only the pipeline's own files.
            files = files.shard(num_pipelines, pipeline_id)
            files = files.shuffle(len(self._files), reshuffle_each_iteration=True)
        else:
            files = files.shard(num_pipelines, pipeline_id)
        if not cfg.training:
            # Evaluation reads the shards one after the other, so records come in
            # shard order (the converter's permutation). The decode step, not the
            # reading, is the bottleneck, and it runs in parallel downstream. On
            # gs:// a one-file, deterministic interleave reads the same order on
            # its own thread, ahead of the consumer (see below).
            if self._remote:
                return self._read_ahead(files, cycle_length=1, deterministic=True)
            return files.flat_map(self._shard_records)
        per_pipeline = -(-len(self._files) // num_pipelines)
        cycle_length = cfg.cycle_length or min(per_pipeline, 16)
        if cycle_length == 1 and not self._remote:
            # One local shard per cycle (a pipeline with one shard: small splits,
            # many hosts, the benchmark's sets): the shards one after the other,
            # exactly the interleave's order, read on the consumer's thread. The
            # parallel interleave hands every record between threads, several
            # times this one's CPU per record (docs/performance.md, "Measurements
            # behind code choices"). On gs:// the interleave stays even for one shard: each 8 MB
            # refill is a network round trip, which its thread overlaps with the
            # decoding instead of stalling the batches behind it.
            return files.flat_map(self._shard_records)
        return self._read_ahead(files, cycle_length, cfg.is_deterministic)

    def _read_ahead(
        self, files: tf.data.Dataset, cycle_length: int, deterministic: bool
    ) -> tf.data.Dataset:
        """``cycle_length`` shards at a time, read by the interleave's threads."""
        cfg = self._config
        return files.interleave(
            self._shard_records,
            cycle_length=cycle_length,
            block_length=cfg.block_length,
            num_parallel_calls=_interleave_parallelism(cfg.num_parallel_calls, cycle_length),
            deterministic=deterministic,
        )

    def _shard_records(self, path: tf.Tensor, expected: tf.Tensor | None = None):
        return shard_records(
            path, expected, dataset=self._info.path, listed_in=self._info.metadata_file
        )

    def _shard_list(self) -> tf.data.Dataset:
        """The split's shards in shard order: ``(path, record count)``, or paths alone."""
        if self._counts is None:
            return tf.data.Dataset.from_tensor_slices(self._files)
        counts = tf.constant(self._counts, tf.int64)
        return tf.data.Dataset.from_tensor_slices((self._files, counts))

    def _read_then_shard(self, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        """Fewer files than pipelines: every pipeline reads everything, keeps every n-th record.

        Correct but wasteful (each pipeline reads n times its share), hence the
        warning. The read order must be identical in all pipelines for the
        record-level shard to be disjoint, so files are read in shard order and
        the interleave is deterministic, whatever ``deterministic`` says.
        """
        cfg = self._config
        _LOG.warning(
            "Split %r of %s has %d shard file(s) for %d input pipelines: sharding by record "
            "instead of by file, so every pipeline reads the whole split and keeps 1/%d of it. "
            "Convert with more shards (--min_shards %d) to avoid this.",
            cfg.split,
            self._info.path,
            len(self._files),
            num_pipelines,
            num_pipelines,
            num_pipelines,
        )
        files = self._shard_list()
        if cfg.training:
            cycle_length = cfg.cycle_length or min(len(self._files), 16)
            ds = files.interleave(
                self._shard_records,
                cycle_length=cycle_length,
                block_length=cfg.block_length,
                num_parallel_calls=_interleave_parallelism(cfg.num_parallel_calls, cycle_length),
                deterministic=True,
            )
        else:
            ds = files.flat_map(self._shard_records)
        return ds.shard(num_pipelines, pipeline_id)

    # Counting ------------------------------------------------------------------------
    def expected_records(self, num_pipelines: int, pipeline_id: int) -> int | None:
        """Records this pipeline reads in one pass, when imagerecords.json tells."""
        split = self._info.split(self._config.split)
        if num_pipelines == 1:
            return split.num_examples
        if len(self._files) < num_pipelines:  # by record: ids pipeline_id, +n, +2n, ...
            return len(range(pipeline_id, split.num_examples, num_pipelines))
        if self._config.shuffles_files and self._config.seed is not None:
            return None  # the files a pipeline reads change from epoch to epoch
        counts = [shard.num_examples for shard in split.shards[pipeline_id::num_pipelines]]
        return None if None in counts else sum(counts)

    def _records_bounds(self, num_pipelines: int) -> tuple[int, int] | None:
        """Fewest and most records any one pipeline can read in a pass, from the shard counts.

        For when the pipelines' files change from epoch to epoch (seeded file
        shuffle): a pipeline reads ``len(files) // n`` or one more of the shards.
        """
        counts = [shard.num_examples for shard in self._info.split(self._config.split).shards]
        if None in counts:
            return None
        counts.sort()
        fewest, most = len(counts) // num_pipelines, -(-len(counts) // num_pipelines)
        return sum(counts[:fewest]), sum(counts[len(counts) - most :])

    def check_one_full_batch(self, num_pipelines: int, pipeline_id: int) -> None:
        """Refuses to drop the remainder of a split (or share) smaller than one batch."""
        cfg = self._config
        records = self.expected_records(num_pipelines, pipeline_id)
        if records is None:
            bounds = self._records_bounds(num_pipelines)
            records = bounds[0] if bounds else None
        if records is not None and records < cfg.batch_size:
            where = (
                f" for input pipeline {pipeline_id} of {num_pipelines}"
                if num_pipelines > 1
                else f" in {self._info.path}"
            )
            raise ValueError(too_few_for_a_batch(cfg.split, records, cfg.batch_size, where))

    # Batch-level steps ---------------------------------------------------------------
    def pad_to_common_length(self, ds: tf.data.Dataset, num_pipelines: int) -> tf.data.Dataset:
        """With ``pad_to_batch``, every input pipeline yields the same number of batches.

        Shards differ in size, so pipelines reading different shards would end
        after different numbers of batches; on a TPU pod, where hosts step
        together, the host that ends first leaves the others waiting forever.
        Each pipeline therefore adds all-padding batches (weight 0) up to the
        largest pipeline's count, computed from imagerecords.json's per-shard
        counts; real examples are untouched, each still read exactly once.
        """
        cfg = self._config
        if not cfg.pad_to_batch or num_pipelines == 1:
            return ds
        counts = [self.expected_records(num_pipelines, i) for i in range(num_pipelines)]
        if None in counts:
            bounds = self._records_bounds(num_pipelines)
            most = bounds[1] if bounds else self._info.num_examples(cfg.split)
        else:
            most = max(counts)
        batches = -(-most // cfg.batch_size)

        def empty(spec: tf.TensorSpec) -> tf.Tensor:
            shape = [1 if d is None else d for d in spec.shape.as_list()]
            if spec.dtype == tf.string:
                return tf.fill(shape, tf.constant("", tf.string))
            return tf.zeros(shape, spec.dtype)  # weight 0: counts for nothing

        padding = tf.data.Dataset.from_tensors(tf.nest.map_structure(empty, ds.element_spec))
        return ds.concatenate(padding.repeat()).take(batches)

    def assert_cardinality(self, ds: tf.data.Dataset, num_pipelines: int, pipeline_id: int):
        """Gives a finite dataset its known length (in batches).

        Keras then knows the number of steps (progress bar, no "ran out of data"
        warning). The records themselves are counted per shard as they are read
        (:func:`~reader.counting.shard_records`): one record too many or too few
        fails there, naming the shard, before the number of batches could tell
        (it often cannot: 470 or 472 records make as many batches of 8 as 471).
        """
        cfg = self._config
        records = None if cfg.repeat_forever else self.expected_records(num_pipelines, pipeline_id)
        if records is None:
            return ds
        batches = (
            records // cfg.batch_size if cfg.drops_remainder else -(-records // cfg.batch_size)
        )
        return ds.apply(tf.data.experimental.assert_cardinality(batches))
