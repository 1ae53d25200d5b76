"""``make_dataset`` and ``distributed_dataset``: imagerecords shards -> batches for training.

A chain of small private steps on a frozen :class:`ReaderConfig`, after TF Model
Garden's ``input_reader.py``: this module caches, shuffles, batches and finishes; the
decoding is a :class:`~reader.parser.Parser`'s (the chain: docs/architecture.md,
"The reader's pipeline").
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Callable

import tensorflow as tf

from reader import decode, native
from reader.config import AUGMENT_FIELDS, AugmentConfig, ReaderConfig, derive_seed
from reader.info import DatasetInfo, load_info
from reader.parser import Parser
from reader.sharding import SplitShards

_LOG = logging.getLogger(__name__)

# cache="decoded": the memory estimate (see decoded_cache_bytes). Images stored
# with resize="shorter" are assumed 1.5x as long as they are wide (3:2 photos; 4:3
# and squares need less), "longer" ones square (an upper bound). When
# imagerecords.json gives no stored size, decoded pixels are assumed
# _ASSUMED_JPEG_RATIO times the shard bytes (JPEG at quality ~90).
_ASSUMED_ASPECT = 1.5
_ASSUMED_JPEG_RATIO = 10


def _physical_memory_bytes() -> int | None:
    """Physical RAM of this machine, or ``None`` where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def decoded_cache_bytes(info: DatasetInfo, split: str, num_records: int | None = None):
    """Estimated memory of ``cache="decoded"``: ``(bytes, how it was estimated)``.

    ``num_records`` (default: the whole split) decoded uint8 images at the size the
    converter stored them (``info.image``): ``size x size x 3`` for ``crop`` and
    ``pad``, ``size x 1.5 size x 3`` for ``shorter`` (3:2 photos; 4:3 need less),
    ``size x size x 3`` for ``longer`` (an upper bound). Without a stored size
    (``none``), 10x the split's shard bytes (JPEG ~ 1/10 of its pixels). ``bytes``
    is ``None`` when nothing tells.
    """
    split_info = info.split(split)
    n = split_info.num_examples if num_records is None else num_records
    resize, size = info.image.resize, info.image.size
    if size and resize == "shorter":
        per_image = size * math.ceil(_ASSUMED_ASPECT * size) * 3
        how = f"{n} images x {size} x ~{math.ceil(_ASSUMED_ASPECT * size)} x 3 (resize=shorter)"
    elif size and resize in ("longer", "crop", "pad"):
        per_image = size * size * 3
        how = f"{n} images x {size} x {size} x 3 (resize={resize})"
    elif split_info.num_bytes and split_info.num_examples:
        per_image = _ASSUMED_JPEG_RATIO * split_info.num_bytes / split_info.num_examples
        how = f"{n} images x ~{_ASSUMED_JPEG_RATIO}x their JPEG bytes (stored size unknown)"
    else:
        return None, "unknown: imagerecords.json gives neither the stored size nor the bytes"
    return int(n * per_image), how


def _use_native_ops(config: ReaderConfig) -> bool:
    """Whether this pipeline flips + resizes with the native op (see ``native_ops``)."""
    if config.native_ops is False:
        return False
    if not config.native_resize_applies:
        if config.native_ops:
            raise ValueError(
                "native_ops=True needs resize_method='bilinear', no image_fn, and no "
                "decode_before_batching (unless cache='decoded')"
            )
        return False
    if config.native_ops is None and native.disabled_by_environment():
        return False
    if native.ops() is not None:
        return True
    if config.native_ops:
        raise native.NativeOpsError(
            f"native_ops=True but the native op is unavailable: {native.unavailable_reason()}"
        )
    _warn_native_unavailable()
    return False


_warned_native = False


def _warn_native_unavailable() -> None:
    global _warned_native
    if not _warned_native:
        _warned_native = True
        _LOG.warning(
            "The reader's native resize op is unavailable, so stock TensorFlow ops flip and "
            "resize each image (same pixels, ~40%% more CPU per image): %s. Pass "
            "native_ops=False or set %s=0 to silence this.",
            native.unavailable_reason(),
            native.ENV_DISABLE,
        )


class InputReader:
    """Builds the ``tf.data`` pipeline of one split for one input pipeline.

    Args:
        info: The dataset (from :func:`reader.load_info`).
        config: The pipeline's settings.
    """

    def __init__(self, info: DatasetInfo, config: ReaderConfig):
        info.split(config.split)  # UnknownSplitError, naming the splits there are.
        self._info = info
        self._config = config
        self._shards = SplitShards(info, config)
        native_dtype = None
        if _use_native_ops(config):
            # uint8 batches come out of the op rounded; float ones are normalised after it.
            native_dtype = tf.uint8 if config.dtype == tf.uint8 else tf.float32
        self._parser = Parser(
            config.augment,
            config.image_size,
            native_dtype=native_dtype,
            with_metadata=config.return_dict,
            image_fn=config.image_fn,
            image_fn_keeps_shape=not (config.decode_before_batching or config.caches_decoded),
            parallel_iterations=config.batch_size,
        )
        self._native = native_dtype is not None
        # One base seed per build. Without a user seed it is fresh each run, so
        # unseeded training differs run to run as users expect.
        self._seed = config.seed if config.seed is not None else random.getrandbits(62)

    def read(self, input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
        """The batched dataset for ``input_context``'s share of the split (all of it if None)."""
        cfg = self._config
        num_pipelines = input_context.num_input_pipelines if input_context else 1
        pipeline_id = input_context.input_pipeline_id if input_context else 0
        # Per-pipeline seeds: each pipeline shuffles its records and augments its
        # images differently; the *file* shuffle seed is shared (see reader/sharding.py).
        seed = derive_seed(self._seed, f"pipeline{pipeline_id}")
        if cfg.drops_remainder:
            self._shards.check_one_full_batch(num_pipelines, pipeline_id)
        parser = self._parser

        ds = self._shards.records(num_pipelines, pipeline_id)
        if cfg.caches_decoded:
            self._check_decoded_cache_memory(num_pipelines, pipeline_id)
            ds = self._map(ds, parser.cache_train_record, parser.cache_eval_record).cache()
            ds = self._maybe_shuffle(ds, seed)
            ds = self._maybe_repeat(ds)
            ds = self._map(ds, parser.crop_train_cached, parser.crop_eval_cached, seed)
            if self._native:
                # Each window travels flat; padded_batch puts the windows of a batch
                # in the rows of one uint8 tensor, which the op reads row by row: no
                # float32 image per record and no copy into the batch. (ragged_batch
                # would pack them end to end, but its variant encoding costs more CPU
                # per image than the whole rest of this pipeline.)
                ds = ds.padded_batch(cfg.batch_size, drop_remainder=cfg.drops_remainder)
                ds = self._map(ds, parser.resize_cached_batch, parser.resize_cached_batch)
            else:
                ds = ds.batch(cfg.batch_size, drop_remainder=cfg.drops_remainder)
        elif cfg.decode_before_batching:
            ds = self._maybe_cache(ds, num_pipelines, pipeline_id)
            ds = self._maybe_shuffle(ds, seed)
            ds = self._maybe_repeat(ds)
            ds = self._map(ds, parser.parse_train_record, parser.parse_eval_record, seed)
            ds = ds.batch(cfg.batch_size, drop_remainder=cfg.drops_remainder)
        else:
            ds = self._maybe_cache(ds, num_pipelines, pipeline_id)
            ds = self._maybe_shuffle(ds, seed)
            ds = self._maybe_repeat(ds)
            ds = ds.batch(cfg.batch_size, drop_remainder=cfg.drops_remainder)
            ds = self._map(ds, parser.parse_train_batch, parser.parse_eval_batch, seed)
        ds = self._maybe_pad(ds)
        ds = self._shards.assert_cardinality(ds, num_pipelines, pipeline_id)
        ds = self._shards.pad_to_common_length(ds, num_pipelines)
        ds = ds.map(
            self._finish_batch,
            num_parallel_calls=cfg.num_parallel_calls,
            deterministic=cfg.is_deterministic,
        )
        ds = ds.prefetch(cfg.prefetch)
        return ds.with_options(self._options(input_context is not None))

    def _maybe_cache(self, ds, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        cache = self._config.cache
        if cache is None or cache is False:
            return ds
        if cache is True or cache == "memory":
            return ds.cache()
        # Pipelines of one host would otherwise write the same cache files.
        suffix = f".{pipeline_id}-of-{num_pipelines}" if num_pipelines > 1 else ""
        return ds.cache(f"{cache}{suffix}")

    def _check_decoded_cache_memory(self, num_pipelines: int, pipeline_id: int) -> None:
        """Warns when the decoded cache is likely to need more than half of the RAM.

        A warning, not a refusal: the estimate assumes an aspect ratio, and the
        caller may know the images are smaller (or the machine has swap).
        """
        records = self._shards.expected_records(num_pipelines, pipeline_id)
        if records is None:
            records = -(-self._info.num_examples(self._config.split) // num_pipelines)
        estimate, how = decoded_cache_bytes(self._info, self._config.split, records)
        ram = _physical_memory_bytes()
        if estimate is None or not ram:
            _LOG.info("cache='decoded': memory needed unknown (%s)", how)
            return
        budget = ram // 2
        if estimate > budget:
            _LOG.warning(
                "cache='decoded' on split %r of %s needs about %.1f GiB of memory (%s), more "
                "than half of this machine's %.1f GiB of RAM; the process may run out of "
                "memory. Use cache=None (decode every epoch) or cache='memory' (keep the "
                "JPEG records, ~1/10 of the size) instead.",
                self._config.split,
                self._info.path,
                estimate / 2**30,
                how,
                ram / 2**30,
            )
        else:
            _LOG.info("cache='decoded': about %.2f GiB (%s)", estimate / 2**30, how)

    def _maybe_shuffle(self, ds: tf.data.Dataset, seed: int) -> tf.data.Dataset:
        cfg = self._config
        if not cfg.shuffles_records:
            return ds
        return ds.shuffle(
            cfg.shuffle_buffer_size,
            seed=derive_seed(seed, "records"),
            reshuffle_each_iteration=True,
        )

    def _maybe_repeat(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        # After the shuffle: an epoch's records are all used before the next epoch
        # starts, and re-iterating the shuffles above gives each epoch a new order.
        return ds.repeat() if self._config.repeat_forever else ds

    # Decoding ------------------------------------------------------------------------
    @staticmethod
    def _seeds(seed: int) -> tf.data.Dataset:
        """One stateless seed ``[2]`` per element, zipped on in element order.

        ``Dataset.random`` with ``rerandomize_each_iteration`` (rather than a
        counter) gives a new, still reproducible, sequence each time the dataset
        is iterated again, so a loop that makes one iterator per epoch does not
        get the same crops at the same positions every epoch.

        Args:
            seed: The input pipeline's seed.
        """
        base = tf.constant(derive_seed(seed, "augment"), tf.int64)
        draws = tf.data.Dataset.random(
            seed=derive_seed(seed, "augment-stream") % (1 << 31),
            rerandomize_each_iteration=True,
        )
        return draws.map(lambda draw: tf.stack([base, draw]))

    def _map(
        self,
        ds: tf.data.Dataset,
        train_fn: Callable,
        eval_fn: Callable,
        seed: int | None = None,
    ) -> tf.data.Dataset:
        """A parallel ``map`` of one of the parser's steps: ``train_fn`` or ``eval_fn``.

        ``train_fn(element, seed)`` when this pipeline augments (each element gets
        a stateless seed from :meth:`_seeds`), else ``eval_fn(element)``: without
        augmentation nothing random is drawn, so no seed stream is zipped on.
        ``seed`` is needed only by steps that draw (``None`` for those that do not).
        """
        cfg = self._config
        if cfg.augments and seed is not None:
            ds = tf.data.Dataset.zip((ds, self._seeds(seed)))
            fn = train_fn
        elif cfg.augments:
            fn = train_fn
        else:
            fn = eval_fn
        return ds.map(
            fn, num_parallel_calls=cfg.num_parallel_calls, deterministic=cfg.is_deterministic
        )

    # Batch-level steps ---------------------------------------------------------------
    def _maybe_pad(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """Pads every batch to ``batch_size`` (only the last one is short) and adds weights."""
        cfg = self._config
        if not cfg.pad_to_batch:
            return ds
        batch_size = cfg.batch_size

        def pad(batch: dict) -> dict:
            real = tf.shape(batch["label"])[0]
            out = {}
            for key, value in batch.items():
                paddings = [[0, batch_size - real]] + [[0, 0]] * (value.shape.rank - 1)
                value = tf.pad(value, paddings)
                value.set_shape([batch_size, *value.shape[1:]])
                out[key] = value
            # Padding rows are zeros (label 0, a valid class id, so no loss sees an
            # out-of-range label); the weight is what excludes them.
            out["weight"] = tf.cast(tf.range(batch_size) < real, tf.float32)
            return out

        return ds.map(
            pad, num_parallel_calls=cfg.num_parallel_calls, deterministic=cfg.is_deterministic
        )

    def _finish_batch(self, batch: dict):
        """Normalise + cast the whole batch, one-hot, the user's batch_fn, output structure."""
        cfg = self._config
        images = decode.normalize(batch["image"], cfg.value_range, cfg.dtype, cfg.mean, cfg.std)
        labels = batch["label"]
        if cfg.one_hot:
            labels = tf.one_hot(labels, self._info.num_classes, dtype=tf.float32)
        if cfg.batch_fn is not None:
            images, labels = cfg.batch_fn(images, labels)
        if cfg.return_dict:
            out = dict(batch, image=images, label=labels)
            return out
        if cfg.pad_to_batch:
            # (x, y, sample_weight): Keras fit/evaluate use the weight as the mask.
            return images, labels, batch["weight"]
        return images, labels

    def _options(self, sharded_here: bool) -> tf.data.Options:
        cfg = self._config
        options = tf.data.Options()
        options.deterministic = cfg.is_deterministic
        if cfg.threadpool_size is not None:
            options.threading.private_threadpool_size = cfg.threadpool_size
        if cfg.max_intra_op_parallelism is not None:
            options.threading.max_intra_op_parallelism = cfg.max_intra_op_parallelism
        if sharded_here:
            # Already sharded by InputContext; tf.distribute must not shard again.
            options.experimental_distribute.auto_shard_policy = (
                tf.data.experimental.AutoShardPolicy.OFF
            )
        if cfg.options is not None:
            options = options.merge(cfg.options)
        return options


def make_dataset(
    path: str | DatasetInfo,
    split: str | None = None,
    batch_size: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    training: bool | None = None,
    input_context: tf.distribute.InputContext | None = None,
    dtype: tf.DType | None = None,
    seed: int | None = None,
    *,
    config: ReaderConfig | None = None,
    **options,
) -> tf.data.Dataset:
    """A batched ``tf.data.Dataset`` of one split of an imagerecords dataset.

    Either the keywords (``split``, ``batch_size``, ``image_size`` and
    ``training`` required) or a whole ``config``; not both.

    Args:
        path: The dataset folder (local or ``gs://``), or a :class:`DatasetInfo`.
        split: Split name, e.g. ``"train"`` or ``"val"``.
        batch_size: Batch size of this input pipeline (per replica under
            ``tf.distribute``).
        image_size: Output ``(height, width)``, or one int for squares.
        training: Shuffle, repeat and augment (``True``), or read every record
            once in shard order (``False``).
        input_context: A ``tf.distribute.InputContext``: read only this input
            pipeline's share of the split.
        dtype: ``tf.float32`` (default), ``tf.bfloat16``, or ``tf.uint8`` (raw
            0..255 pixels for a model that normalises on the accelerator;
            ``value_range="0_255"``).
        seed: Seed for shuffles and augmentation; with ``deterministic=True`` the
            batches are the same run after run.
        config: A :class:`ReaderConfig` holding all of the above but ``path`` and
            ``input_context``.
        **options: Any other :class:`ReaderConfig` field (``deterministic``,
            ``drop_remainder``, ``pad_to_batch``, ``value_range``, ``one_hot``,
            ``cache``, ``shuffle_buffer_size``, ``cycle_length``, ``image_fn``,
            ``batch_fn``, ``return_dict``, ...) or :class:`AugmentConfig` field
            (``random_crop``, ``horizontal_flip``, ``crop_area_range``,
            ``crop_aspect_ratio_range``, ``eval_crop``, ``center_crop_fraction``,
            ``resize_method``).

    Returns:
        Batches ``(images [B, H, W, 3], labels [B])``; ``(images, labels, weights)``
        with ``pad_to_batch``; a dict with ``return_dict``. ``B`` is static when the
        remainder is dropped (training default) or padded.

    Raises:
        IncompleteDatasetError, DatasetInfoError: see :func:`reader.load_info`.
        UnknownSplitError: ``split`` is not in the dataset (the message lists the splits).
        ValueError: a bad value, or ``config`` together with other settings.
        TypeError: a keyword that is no setting.
    """
    given = dict(
        split=split,
        batch_size=batch_size,
        image_size=image_size,
        training=training,
        dtype=dtype,
        seed=seed,
    )
    if config is None:
        config = config_from_keywords(**given, **options)
    else:
        clash = sorted(name for name, value in given.items() if value is not None) + sorted(options)
        if clash:
            raise ValueError(
                "make_dataset takes either config=ReaderConfig(...) or keywords, not both; "
                f"got config and {', '.join(clash)} (use dataclasses.replace(config, ...))"
            )
        if not isinstance(config, ReaderConfig):
            raise TypeError(f"config must be a ReaderConfig, got {type(config).__name__}")
    info = path if isinstance(path, DatasetInfo) else load_info(path)
    return InputReader(info, config).read(input_context)


def config_from_keywords(**keywords) -> ReaderConfig:
    """``make_dataset``'s keywords as a :class:`ReaderConfig` (augmentation ones nested).

    Raises:
        TypeError: a required keyword is missing, or a keyword is no setting.
        ValueError: a bad value, or ``augment=`` together with its own fields.
    """
    missing = [
        name
        for name in ("split", "batch_size", "image_size", "training")
        if keywords.get(name) is None
    ]
    if missing:
        raise TypeError(f"make_dataset() needs {', '.join(missing)} (or config=ReaderConfig(...))")
    if keywords.get("dtype") is None:
        keywords["dtype"] = tf.float32
    augment = {name: keywords.pop(name) for name in list(keywords) if name in AUGMENT_FIELDS}
    if augment:
        if "augment" in keywords:
            raise ValueError(
                f"pass either augment=AugmentConfig(...) or {', '.join(sorted(augment))}, not both"
            )
        keywords["augment"] = AugmentConfig(**augment)
    return ReaderConfig(**keywords)


def distributed_dataset(
    strategy: tf.distribute.Strategy,
    path: str | DatasetInfo,
    split: str,
    global_batch_size: int,
    image_size: int | tuple[int, int],
    training: bool,
    input_options: tf.distribute.InputOptions | None = None,
    **kwargs,
) -> tf.distribute.DistributedDataset:
    """``make_dataset`` under ``strategy``: one input pipeline per worker, sharded by file.

    Uses ``strategy.distribute_datasets_from_function``: each input pipeline
    reads its own shards with the per-replica batch size, so no host reads and
    throws away other hosts' data.

    Args:
        strategy: Any ``tf.distribute.Strategy`` (Mirrored, MultiWorkerMirrored, TPU).
        path: The dataset folder or a :class:`DatasetInfo` (read once, here).
        split: Split name.
        global_batch_size: Examples per step over all replicas; must divide by
            the number of replicas.
        image_size, training: As for :func:`make_dataset`.
        input_options: ``tf.distribute.InputOptions`` (e.g. prefetch to device).
        **kwargs: Any other :func:`make_dataset` argument (``dtype``, ``seed``, ...).

    Returns:
        A distributed dataset; iterate it inside ``strategy.run`` loops or pass it
        to Keras ``fit``.
    """
    info = path if isinstance(path, DatasetInfo) else load_info(path)
    tpu_types = tuple(
        t
        for t in (
            getattr(tf.distribute, "TPUStrategy", None),
            getattr(tf.distribute.experimental, "TPUStrategy", None),
        )
        if t
    )
    if isinstance(strategy, tpu_types) and not training:
        if not kwargs.get("pad_to_batch") and not kwargs.get("drop_remainder"):
            raise ValueError(
                "TPUs need static batch shapes: evaluate with pad_to_batch=True (keeps every "
                "example, with weights) or drop_remainder=True (drops the last partial batch)"
            )

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return make_dataset(
            info,
            split,
            batch_size=input_context.get_per_replica_batch_size(global_batch_size),
            image_size=image_size,
            training=training,
            input_context=input_context,
            **kwargs,
        )

    return strategy.distribute_datasets_from_function(dataset_fn, options=input_options)
