"""``make_dataset`` and ``distributed_dataset``: imagerecords shards -> batches for training.

The pipeline is a chain of small private steps on a frozen :class:`ReaderConfig`,
in the manner of TF Model Garden's ``official/core/input_reader.py``::

    training:   shard list -(seeded shuffle each epoch)-> shard by InputContext
                -> interleave(TFRecordDataset, AUTOTUNE, deterministic=False)
                -> [cache] -> shuffle -> repeat -> batch -> parse_example (whole batch)
                -> decode + random crop while decoding (per image)
                -> flip + resize into the batch (native op, whole batch; stock ops per
                image where it cannot be built) -> normalise / cast / one-hot
                (whole batch) -> prefetch(AUTOTUNE)
    evaluation: shards in order -> shard by InputContext -> TFRecordDataset
                -> [cache] -> batch -> parse_example -> decode + centre crop / resize
                -> [pad the last batch + weights] -> normalise -> prefetch
    cache="decoded": ... -> TFRecordDataset / interleave -> parse + decode whole (uint8)
                -> cache in memory -> [shuffle -> repeat] -> per image: crop (a slice
                of the cached pixels) + resize + flip -> batch -> [pad] -> normalise

No Python runs per element: every step is a TensorFlow op inside ``tf.data``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import random
from collections.abc import Callable

import tensorflow as tf

from reader import decode, native
from reader.info import DatasetInfo, load_info, too_few_for_a_batch

_LOG = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE

# How the per-image step runs after batching (see _decode_batch): tf.map_fn over
# the batch inside a parallel map. It cost less CPU per image than decoding
# before batching; tf.vectorized_map cannot be used (the JPEG ops have no pfor
# rule, and its while_loop fallback cannot stack variable-size decoded crops).
# parallel_iterations does not change the CPU cost per image but lets one batch
# use several cores, which matters when fewer batches are in flight than there
# are cores; it is the batch size, so a batch never waits on a fixed-size window
# of iterations. Numbers: docs/performance.md, "Measurements behind code choices".

# cache="decoded": the memory estimate (see decoded_cache_bytes). Images stored
# with resize="shorter" are assumed 1.5x as long as they are wide (3:2 photos; 4:3
# and squares need less), "longer" ones square (an upper bound). When
# dataset_info.json gives no stored size, decoded pixels are assumed
# _ASSUMED_JPEG_RATIO times the shard bytes (JPEG at quality ~90).
_ASSUMED_ASPECT = 1.5
_ASSUMED_JPEG_RATIO = 10
DECODED = "decoded"

# TFRecordDataset's read buffer. The default (256 KiB) means many small reads;
# on gs:// each read is an HTTP range request, so read in larger pieces.
_READ_BUFFER_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    """Everything that shapes a reader pipeline. ``make_dataset`` builds one from its arguments.

    ``None`` means "the right default for ``training``" wherever it is allowed.

    Attributes:
        split: Split name, e.g. ``"train"``.
        batch_size: Batch size of *this* input pipeline (per replica under
            ``tf.distribute``: ``ctx.get_per_replica_batch_size(global)``).
        image_size: Output ``(height, width)``; an int means a square.
        training: Training (shuffle, repeat, augment) or evaluation (every record
            once, in shard order).
        dtype: Image dtype: ``tf.float32``, ``tf.bfloat16`` (TPU), or ``tf.uint8``:
            the float32 values rounded (half to even), a quarter of the bytes for
            the host to write and move; the model normalises on the accelerator.
            Needs ``value_range="0_255"``.
        seed: Seed for the file shuffle, the record shuffle and augmentation.
            ``None``: fresh randomness each run.
        deterministic: Produce elements in a fixed order (``tf.data``'s
            ``deterministic``). Default: ``False`` for training (faster: a slow
            file or image does not stall the others), ``True`` for evaluation.
            With ``seed``, ``True`` repeats the same batches run after run.
        drop_remainder: Drop the last partial batch, giving static batch shapes.
            Default: ``True`` for training, ``False`` for evaluation.
        pad_to_batch: Evaluation on static shapes (TPU): pad the last batch to
            ``batch_size`` and add a float32 ``weight`` per example (1 real, 0 pad).
        repeat: Repeat forever. Default: ``training``.
        shuffle: Shuffle records with a buffer. Default: ``training``.
        shuffle_files: Shuffle the shard list each epoch. Default: ``training``.
        shuffle_buffer_size: Records in the shuffle buffer. The shards are already
            a global permutation, so this only has to mix the interleaved shards
            and make epochs differ, not undo any class order.
        cycle_length: Shards read at once in training. Default: the pipeline's
            shard count, at most 16.
        block_length: Consecutive records taken from one shard per turn.
        num_parallel_calls: Parallelism of interleave and of the decode map.
        cache: ``None``; ``"memory"`` (or ``True``) to keep the serialized records
            in memory after the first pass; ``"decoded"`` to decode every record
            once (uint8, stored size, no augmentation) and keep the pixels in
            memory, so later epochs only crop, resize and flip (see
            :func:`decoded_cache_bytes` for the memory it needs); any other string
            is a file-name prefix for an on-disk cache of the records. Augmentation
            differs per epoch whatever is cached.
        random_crop: Training: Inception-style random resized crop, decoding only
            the crop. Off: the evaluation transform.
        horizontal_flip: Training: random left-right flip.
        crop_area_range: Fraction of the image area the random crop covers.
        crop_aspect_ratio_range: Width/height range of the random crop.
        eval_crop: Evaluation: ``"center"`` (centre crop of
            ``center_crop_fraction`` at the output's aspect ratio, decoding only
            the crop, then resize) or ``"resize"`` (squash the whole image).
        center_crop_fraction: See ``eval_crop``; 0.875 is the ImageNet 224/256 crop.
        resize_method: A ``tf.image.ResizeMethod`` name.
        value_range: ``"0_255"`` (raw; Keras EfficientNet expects it), ``"0_1"``, or
            ``"imagenet"`` (``(x/255 - mean) / std``).
        mean, std: Per-channel statistics (0..1 scale) for ``"imagenet"``.
        one_hot: Labels as float32 one-hot ``[B, num_classes]`` instead of int32 ``[B]``.
        return_dict: Yield dicts ``{"image", "label", "filename", "sha256"[, "weight"]}``
            instead of tuples (to trace predictions back to files).
        image_fn: ``f(image, label) -> (image, label)`` per image, after decode and
            crop, before batching; ``image`` is float32 ``[H, W, 3]`` in 0..255,
            ``label`` an int32 scalar. Unless ``decode_before_batching``, it runs
            inside the per-batch step and must keep the shape and dtypes.
        batch_fn: ``f(images, labels) -> (images, labels)`` per batch, last (after
            normalisation, dtype and one-hot): e.g. MixUp / CutMix.
        decode_before_batching: Parse and decode each record before batching
            (``parse_single_example`` path). Needed when ``image_fn`` changes the
            image shape; it costs one function call per record instead of per
            batch and copies decoded pixels into the batch.
        native_ops: Flip and resize each batch with the reader's native op
            (``reader.native``, compiled on first use; the same pixels as the
            stock ops, ~30% less CPU per image in training). ``None``: where it
            can be built, else stock ops with one warning. ``True``: required
            (an error if it cannot be built or does not apply). ``False``:
            stock ops. It applies with ``resize_method="bilinear"``, no
            ``image_fn`` (which needs each image as a tensor of its own) and no
            ``decode_before_batching`` (``cache="decoded"`` is served).
        threadpool_size: ``tf.data.Options.threading.private_threadpool_size``.
        max_intra_op_parallelism: ``tf.data.Options.threading.max_intra_op_parallelism``.
        options: Extra ``tf.data.Options``, merged over the reader's own.
        prefetch: Batches to prefetch (default AUTOTUNE).
    """

    split: str
    batch_size: int
    image_size: int | tuple[int, int]
    training: bool
    dtype: tf.DType = tf.float32
    seed: int | None = None
    deterministic: bool | None = None
    drop_remainder: bool | None = None
    pad_to_batch: bool = False
    repeat: bool | None = None
    shuffle: bool | None = None
    shuffle_files: bool | None = None
    shuffle_buffer_size: int = 2048
    cycle_length: int | None = None
    block_length: int = 1
    num_parallel_calls: int = AUTOTUNE
    cache: bool | str | None = None
    random_crop: bool = True
    horizontal_flip: bool = True
    crop_area_range: tuple[float, float] = (0.08, 1.0)
    crop_aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3)
    eval_crop: str = "center"
    center_crop_fraction: float = 0.875
    resize_method: str = "bilinear"
    value_range: str = "0_255"
    mean: tuple[float, float, float] = decode.IMAGENET_MEAN
    std: tuple[float, float, float] = decode.IMAGENET_STD
    one_hot: bool = False
    return_dict: bool = False
    image_fn: Callable | None = None
    batch_fn: Callable | None = None
    decode_before_batching: bool = False
    native_ops: bool | None = None
    threadpool_size: int | None = None
    max_intra_op_parallelism: int | None = None
    options: tf.data.Options | None = None
    prefetch: int = AUTOTUNE

    def __post_init__(self):
        size = self.image_size
        if isinstance(size, int):
            size = (size, size)
        size = tuple(int(s) for s in size)
        if len(size) != 2 or min(size) <= 0:
            raise ValueError(f"image_size must be a positive int or (height, width), got {size}")
        object.__setattr__(self, "image_size", size)
        object.__setattr__(self, "dtype", tf.as_dtype(self.dtype))
        if self.dtype == tf.uint8:
            if self.value_range != "0_255":
                raise ValueError(
                    "dtype=tf.uint8 gives raw 0..255 pixels (the model normalises them): "
                    f"value_range must be '0_255', got {self.value_range!r}"
                )
        elif not self.dtype.is_floating:
            raise ValueError(
                f"dtype must be a float type (float32, bfloat16) or uint8, got {self.dtype}"
            )
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if self.value_range not in decode.VALUE_RANGES:
            raise ValueError(
                f"value_range must be one of {decode.VALUE_RANGES}, got {self.value_range!r}"
            )
        if self.eval_crop not in decode.EVAL_CROPS:
            raise ValueError(
                f"eval_crop must be one of {decode.EVAL_CROPS}, got {self.eval_crop!r}"
            )
        if self.pad_to_batch and self.drop_remainder:
            raise ValueError(
                "pad_to_batch pads the last batch; it cannot be combined with drop_remainder=True"
            )
        if self.pad_to_batch and self.repeat_forever:
            raise ValueError("pad_to_batch needs a finite dataset: pass repeat=False")
        if self.shuffle_buffer_size <= 0:
            raise ValueError("shuffle_buffer_size must be positive")
        if self.cache is not None and not isinstance(self.cache, bool | str):
            raise ValueError(
                f"cache must be None, True, 'memory', 'decoded' or a file prefix, got {self.cache!r}"
            )

    # Resolved defaults ---------------------------------------------------------------
    @property
    def is_deterministic(self) -> bool:
        return (not self.training) if self.deterministic is None else self.deterministic

    @property
    def drops_remainder(self) -> bool:
        if self.drop_remainder is None:
            return self.training and not self.pad_to_batch
        return self.drop_remainder

    @property
    def repeat_forever(self) -> bool:
        return self.training if self.repeat is None else self.repeat

    @property
    def shuffles_records(self) -> bool:
        return self.training if self.shuffle is None else self.shuffle

    @property
    def shuffles_files(self) -> bool:
        return self.training if self.shuffle_files is None else self.shuffle_files

    @property
    def augments(self) -> bool:
        return self.training and (self.random_crop or self.horizontal_flip)

    @property
    def caches_decoded(self) -> bool:
        return self.cache == DECODED

    @property
    def native_resize_applies(self) -> bool:
        """The pipeline has the per-batch step the native op replaces."""
        return (
            (self.caches_decoded or not self.decode_before_batching)
            and self.image_fn is None
            and self.resize_method == "bilinear"
        )


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
        return None, "unknown: dataset_info.json gives neither the stored size nor the bytes"
    return int(n * per_image), how


def _interleave_parallelism(num_parallel_calls: int, cycle_length: int) -> int:
    """``num_parallel_calls`` for ``interleave``: AUTOTUNE, or at most ``cycle_length``.

    ``interleave`` refuses a fixed parallelism above its cycle length (e.g.
    ``num_parallel_calls=2`` on a split of one shard); the same number still
    applies to the decode map.
    """
    if num_parallel_calls == AUTOTUNE:
        return num_parallel_calls
    return max(1, min(num_parallel_calls, cycle_length))


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


def _derive_seed(seed: int, purpose: str) -> int:
    """A 63-bit seed for one purpose (stdlib hash, stable across processes)."""
    digest = hashlib.blake2b(f"{seed}\0{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


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
        self._files = list(info.files(config.split))
        if not self._files:
            raise ValueError(f"split {config.split!r} of {info.path} has no shards")
        self._native = _use_native_ops(config)
        # uint8 batches come out of the op rounded; float ones are normalised after it.
        self._native_dtype = tf.uint8 if config.dtype == tf.uint8 else tf.float32
        # One base seed per build. Without a user seed it is fresh each run, so
        # unseeded training differs run to run as users expect.
        self._seed = config.seed if config.seed is not None else random.getrandbits(62)

    def read(self, input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
        """The batched dataset for ``input_context``'s share of the split (all of it if None)."""
        cfg = self._config
        num_pipelines = input_context.num_input_pipelines if input_context else 1
        pipeline_id = input_context.input_pipeline_id if input_context else 0
        # Per-pipeline seeds: each pipeline shuffles its records and augments its
        # images differently; the *file* shuffle seed is shared (see _read_records).
        self._pipeline_seed = _derive_seed(self._seed, f"pipeline{pipeline_id}")
        if cfg.drops_remainder:
            self._check_one_full_batch(num_pipelines, pipeline_id)

        ds = self._read_records(num_pipelines, pipeline_id)
        if cfg.caches_decoded:
            self._check_decoded_cache_memory(num_pipelines, pipeline_id)
            ds = self._decode_and_cache(ds)
            ds = self._maybe_shuffle(ds)
            ds = self._maybe_repeat(ds)
            if self._native:
                ds = self._crop_decoded_native(ds)
            else:
                ds = self._transform_decoded(ds)
                ds = ds.batch(cfg.batch_size, drop_remainder=cfg.drops_remainder)
        elif cfg.decode_before_batching:
            ds = self._maybe_cache(ds, num_pipelines, pipeline_id)
            ds = self._maybe_shuffle(ds)
            ds = self._maybe_repeat(ds)
            ds = self._decode_each(ds)
            ds = ds.batch(cfg.batch_size, drop_remainder=cfg.drops_remainder)
        else:
            ds = self._maybe_cache(ds, num_pipelines, pipeline_id)
            ds = self._maybe_shuffle(ds)
            ds = self._maybe_repeat(ds)
            ds = ds.batch(cfg.batch_size, drop_remainder=cfg.drops_remainder)
            ds = self._decode_batches(ds)
        ds = self._maybe_pad(ds)
        ds = self._maybe_assert_cardinality(ds, num_pipelines, pipeline_id)
        ds = self._pad_to_common_length(ds, num_pipelines)
        ds = ds.map(
            self._finish_batch,
            num_parallel_calls=cfg.num_parallel_calls,
            deterministic=cfg.is_deterministic,
        )
        ds = ds.prefetch(cfg.prefetch)
        return ds.with_options(self._options(input_context is not None))

    # Reading -------------------------------------------------------------------------
    def _read_records(self, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        if num_pipelines > 1 and len(self._files) < num_pipelines:
            return self._read_then_shard(num_pipelines, pipeline_id)
        return self._shard_then_read(num_pipelines, pipeline_id)

    def _shard_then_read(self, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        """Each pipeline reads a disjoint set of shard files (the cheap, normal case)."""
        cfg = self._config
        files = tf.data.Dataset.from_tensor_slices(self._files)
        if cfg.shuffles_files and cfg.seed is not None:
            # Every pipeline draws the *same* permutation (same seed, same number of
            # epochs) and then takes every n-th file: the pipelines stay disjoint in
            # every epoch, and over epochs each one sees different files.
            files = files.shuffle(
                len(self._files),
                seed=_derive_seed(cfg.seed, "files"),
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
            # reading, is the bottleneck, and it runs in parallel downstream.
            return tf.data.TFRecordDataset(files, buffer_size=_READ_BUFFER_BYTES)
        per_pipeline = -(-len(self._files) // num_pipelines)
        cycle_length = cfg.cycle_length or min(per_pipeline, 16)
        return files.interleave(
            lambda f: tf.data.TFRecordDataset(f, buffer_size=_READ_BUFFER_BYTES),
            cycle_length=cycle_length,
            block_length=cfg.block_length,
            num_parallel_calls=_interleave_parallelism(cfg.num_parallel_calls, cycle_length),
            deterministic=cfg.is_deterministic,
        )

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
        files = tf.data.Dataset.from_tensor_slices(self._files)
        if cfg.training:
            cycle_length = cfg.cycle_length or min(len(self._files), 16)
            ds = files.interleave(
                lambda f: tf.data.TFRecordDataset(f, buffer_size=_READ_BUFFER_BYTES),
                cycle_length=cycle_length,
                block_length=cfg.block_length,
                num_parallel_calls=_interleave_parallelism(cfg.num_parallel_calls, cycle_length),
                deterministic=True,
            )
        else:
            ds = tf.data.TFRecordDataset(files, buffer_size=_READ_BUFFER_BYTES)
        return ds.shard(num_pipelines, pipeline_id)

    def _expected_records(self, num_pipelines: int, pipeline_id: int) -> int | None:
        """Records this pipeline reads in one pass, when dataset_info.json tells."""
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

    def _check_one_full_batch(self, num_pipelines: int, pipeline_id: int) -> None:
        """Refuses to drop the remainder of a split (or share) smaller than one batch."""
        cfg = self._config
        records = self._expected_records(num_pipelines, pipeline_id)
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

    def _pad_to_common_length(self, ds: tf.data.Dataset, num_pipelines: int) -> tf.data.Dataset:
        """With ``pad_to_batch``, every input pipeline yields the same number of batches.

        Shards differ in size, so pipelines reading different shards would end
        after different numbers of batches; on a TPU pod, where hosts step
        together, the host that ends first leaves the others waiting forever.
        Each pipeline therefore adds all-padding batches (weight 0) up to the
        largest pipeline's count, computed from dataset_info.json's per-shard
        counts; real examples are untouched, each still read exactly once.
        """
        cfg = self._config
        if not cfg.pad_to_batch or num_pipelines == 1:
            return ds
        counts = [self._expected_records(num_pipelines, i) for i in range(num_pipelines)]
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

    def _maybe_assert_cardinality(self, ds, num_pipelines: int, pipeline_id: int):
        """Gives a finite dataset its known length, and checks it while reading.

        Keras then knows the number of steps (progress bar, no "ran out of data"
        warning), and a shard that holds fewer or more records than
        dataset_info.json says fails loudly instead of skewing an evaluation.
        """
        cfg = self._config
        records = None if cfg.repeat_forever else self._expected_records(num_pipelines, pipeline_id)
        if records is None:
            return ds
        batches = (
            records // cfg.batch_size if cfg.drops_remainder else -(-records // cfg.batch_size)
        )
        return ds.apply(tf.data.experimental.assert_cardinality(batches))

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
        records = self._expected_records(num_pipelines, pipeline_id)
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

    def _decode_and_cache(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """cache="decoded": parse + decode each record once (whole, or its eval window), cache it."""
        cfg = self._config

        def decode_record(serialized):
            features = decode.parse_single(serialized, with_metadata=cfg.return_dict)
            features["image"] = decode.decode_for_cache(
                features.pop(decode.ENCODED),
                cfg.image_size,
                random_crop=cfg.training and cfg.random_crop,
                eval_crop=cfg.eval_crop,
                center_crop_fraction=cfg.center_crop_fraction,
            )
            return features

        ds = ds.map(
            decode_record,
            num_parallel_calls=cfg.num_parallel_calls,
            deterministic=cfg.is_deterministic,
        )
        return ds.cache()

    def _transform_decoded(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """cache="decoded": per image crop (+ flip) + resize of the cached pixels, before batching."""

        def transform(features, seed):
            features = dict(features)
            seeds = tf.random.stateless_uniform(
                [2, 2], seed=seed, minval=None, maxval=None, dtype=tf.int64
            )
            features["image"], features["label"] = self._decode_one(
                features["image"], features["label"], seeds, decoded=True
            )
            return features

        return self._map_with_seeds(ds, transform)

    def _crop_decoded_native(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """cache="decoded" with the native op: crop per image, then flip + resize per batch.

        Each image's window (a slice of the cached pixels) travels flat, and
        ``padded_batch`` puts the windows of a batch in the rows of one uint8
        tensor, which the op reads row by row: no float32 image per record and
        no copy into the batch. (``ragged_batch`` would pack them end to end,
        but its variant encoding costs more CPU per image than the whole rest
        of this pipeline; docs/performance.md has the numbers.)
        """
        cfg = self._config

        def crop(features, seed):
            features = dict(features)
            seeds = tf.random.stateless_uniform(
                [2, 2], seed=seed, minval=None, maxval=None, dtype=tf.int64
            )
            image, flip = decode.crop_decoded(
                features.pop("image"),
                seeds,
                random_crop=cfg.training and cfg.random_crop,
                horizontal_flip=cfg.training and cfg.horizontal_flip,
                area_range=cfg.crop_area_range,
                aspect_ratio_range=cfg.crop_aspect_ratio_range,
            )
            features["pixels"] = tf.reshape(image, [-1])
            features["window"] = tf.shape(image)[:2]
            features["flip"] = flip
            return features

        ds = self._map_with_seeds(ds, crop)
        ds = ds.padded_batch(cfg.batch_size, drop_remainder=cfg.drops_remainder)

        def resize(features):
            features = dict(features)
            pixels = features.pop("pixels")
            images = native.resize_crops(
                pixels,
                features.pop("window"),
                features.pop("flip"),
                cfg.image_size,
                self._native_dtype,
            )
            images.set_shape(pixels.shape[:1].concatenate([*cfg.image_size, 3]))
            features["image"] = images
            return features

        return ds.map(
            resize, num_parallel_calls=cfg.num_parallel_calls, deterministic=cfg.is_deterministic
        )

    def _maybe_shuffle(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        cfg = self._config
        if not cfg.shuffles_records:
            return ds
        return ds.shuffle(
            cfg.shuffle_buffer_size,
            seed=_derive_seed(self._pipeline_seed, "records"),
            reshuffle_each_iteration=True,
        )

    def _maybe_repeat(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        # After the shuffle: an epoch's records are all used before the next epoch
        # starts, and re-iterating the shuffles above gives each epoch a new order.
        return ds.repeat() if self._config.repeat_forever else ds

    # Decoding ------------------------------------------------------------------------
    def _seeds(self) -> tf.data.Dataset:
        """One stateless seed ``[2]`` per element, zipped on in element order.

        ``Dataset.random`` with ``rerandomize_each_iteration`` (rather than a
        counter) gives a new, still reproducible, sequence each time the dataset
        is iterated again, so a loop that makes one iterator per epoch does not
        get the same crops at the same positions every epoch.
        """
        base = tf.constant(_derive_seed(self._pipeline_seed, "augment"), tf.int64)
        draws = tf.data.Dataset.random(
            seed=_derive_seed(self._pipeline_seed, "augment-stream") % (1 << 31),
            rerandomize_each_iteration=True,
        )
        return draws.map(lambda draw: tf.stack([base, draw]))

    def _decode_one(self, encoded, label, seeds=None, decoded: bool = False):
        """One image: decode (+ crop + flip) + resize, then the user's ``image_fn``.

        ``decoded``: ``encoded`` is already a uint8 image from the decoded cache
        (``decode.decode_for_cache``); the crop is sliced out of its pixels.
        """
        cfg = self._config
        if decoded:
            image = decode.transform_decoded(
                encoded,
                seeds,
                cfg.image_size,
                random_crop=cfg.training and cfg.random_crop,
                horizontal_flip=cfg.training and cfg.horizontal_flip,
                area_range=cfg.crop_area_range,
                aspect_ratio_range=cfg.crop_aspect_ratio_range,
                resize_method=cfg.resize_method,
            )
        elif cfg.augments:
            image = decode.decode_train(
                encoded,
                seeds,
                cfg.image_size,
                random_crop=cfg.random_crop,
                horizontal_flip=cfg.horizontal_flip,
                area_range=cfg.crop_area_range,
                aspect_ratio_range=cfg.crop_aspect_ratio_range,
                eval_crop=cfg.eval_crop,
                center_crop_fraction=cfg.center_crop_fraction,
                resize_method=cfg.resize_method,
            )
        else:
            image = decode.decode_eval(
                encoded,
                cfg.image_size,
                cfg.eval_crop,
                cfg.center_crop_fraction,
                cfg.resize_method,
            )
        if cfg.image_fn is not None:
            image, label = cfg.image_fn(image, label)
            if not (cfg.decode_before_batching or decoded):
                self._check_image_fn_output(image, label)
        return image, label

    def _check_image_fn_output(self, image, label) -> None:
        """In the batched path image_fn runs inside map_fn, whose output spec is fixed."""
        expected = tf.TensorShape([*self._config.image_size, 3])
        image, label = tf.convert_to_tensor(image), tf.convert_to_tensor(label)
        if (
            image.dtype != tf.float32
            or not image.shape.is_compatible_with(expected)
            or label.dtype != tf.int32
            or not label.shape.is_compatible_with([])
        ):
            raise ValueError(
                f"image_fn must return a float32 image of shape {expected} and an int32 scalar "
                f"label when it runs after batching; it returned {image.dtype} {image.shape} "
                f"and {label.dtype} {label.shape}. Pass decode_before_batching=True to let it "
                "change the shape (see docs/reader.md, 'Augmentation and hooks')."
            )

    def _decode_batches(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """parse_example on each batch, then the per-image step over the batch."""
        return self._map_with_seeds(ds, self._decode_batch)

    def _decode_batch(self, serialized: tf.Tensor, batch_seed: tf.Tensor) -> dict:
        cfg = self._config
        features = decode.parse_batch(serialized, with_metadata=cfg.return_dict)
        encoded = features.pop(decode.ENCODED)
        size = tf.shape(encoded)[0]
        # [B, 2, 2]: a crop seed and a flip seed per image, derived from the batch's.
        seeds = tf.random.stateless_uniform(
            tf.stack([size, 2, 2]), seed=batch_seed, minval=None, maxval=None, dtype=tf.int64
        )
        if self._native:
            features["image"] = self._decode_batch_native(encoded, seeds)
            return features
        # Decoding after batching needs a per-image step. map_fn (a while_loop with
        # parallel_iterations = the batch size) measured fastest: see the top of the module.
        # tf.vectorized_map fails on the variable-size decoded images, and
        # unbatch -> map -> batch would give up the batched parse.
        images, labels = tf.map_fn(
            lambda args: self._decode_one(*args),
            (encoded, features["label"], seeds),
            fn_output_signature=(
                tf.TensorSpec([*cfg.image_size, 3], tf.float32),
                tf.TensorSpec([], tf.int32),
            ),
            parallel_iterations=cfg.batch_size,
        )
        features["image"] = images
        features["label"] = labels
        return features

    def _decode_batch_native(self, encoded: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
        """Decodes each image's window (uint8), then flips + resizes all into the batch at once.

        The windows go to the op as one flat uint8 tensor plus their shapes: the
        concatenation copies ~100 KB per image, where the stock path copies the
        600 KB float32 result into the batch.
        """
        cfg = self._config
        count = tf.shape(encoded)[0]
        augments = cfg.augments

        def step(i, pixels, shapes, flips):
            image, flip = decode.decode_window(
                encoded[i],
                seeds[i],
                cfg.image_size,
                random_crop=augments and cfg.random_crop,
                horizontal_flip=augments and cfg.horizontal_flip,
                area_range=cfg.crop_area_range,
                aspect_ratio_range=cfg.crop_aspect_ratio_range,
                eval_crop=cfg.eval_crop,
                center_crop_fraction=cfg.center_crop_fraction,
            )
            return (
                i + 1,
                pixels.write(i, tf.reshape(image, [-1])),
                shapes.write(i, tf.shape(image)[:2]),
                flips.write(i, flip),
            )

        arrays = (
            tf.TensorArray(tf.uint8, size=count, infer_shape=False, element_shape=[None]),
            tf.TensorArray(tf.int32, size=count, element_shape=[2]),
            tf.TensorArray(tf.bool, size=count, element_shape=[]),
        )
        _, pixels, shapes, flips = tf.while_loop(
            lambda i, *_: i < count,
            step,
            (tf.constant(0), *arrays),
            parallel_iterations=cfg.batch_size,
        )
        # concat() of an empty array has no element shape to go by.
        flat = tf.cond(count > 0, lambda: pixels.concat(), lambda: tf.zeros([0], tf.uint8))
        images = native.resize_crops(
            flat, shapes.stack(), flips.stack(), cfg.image_size, self._native_dtype
        )
        # The batch dimension is static when the remainder is dropped; the loop hides it.
        images.set_shape(encoded.shape[:1].concatenate([*cfg.image_size, 3]))
        return images

    def _decode_each(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """The decode-before-batching path: parse and decode each record on its own."""
        cfg = self._config

        def decode_record(serialized, seeds):
            features = decode.parse_single(serialized, with_metadata=cfg.return_dict)
            encoded = features.pop(decode.ENCODED)
            seeds = tf.random.stateless_uniform(
                [2, 2], seed=seeds, minval=None, maxval=None, dtype=tf.int64
            )
            features["image"], features["label"] = self._decode_one(
                encoded, features["label"], seeds
            )
            return features

        return self._map_with_seeds(ds, decode_record)

    def _map_with_seeds(self, ds: tf.data.Dataset, fn: Callable) -> tf.data.Dataset:
        """``ds.map(fn(element, seed))``, parallel: one augmentation seed per element, or zeros.

        Without augmentation nothing random is drawn, so no seed stream is zipped on.
        """
        cfg = self._config
        if cfg.augments:
            ds = tf.data.Dataset.zip((ds, self._seeds()))
            mapped = fn
        else:

            def mapped(element):
                return fn(element, tf.zeros([2], tf.int64))

        return ds.map(
            mapped, num_parallel_calls=cfg.num_parallel_calls, deterministic=cfg.is_deterministic
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
    split: str,
    batch_size: int,
    image_size: int | tuple[int, int],
    training: bool,
    input_context: tf.distribute.InputContext | None = None,
    dtype: tf.DType = tf.float32,
    seed: int | None = None,
    **options,
) -> tf.data.Dataset:
    """A batched ``tf.data.Dataset`` of one split of an imagerecords dataset.

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
        dtype: ``tf.float32``, ``tf.bfloat16``, or ``tf.uint8`` (raw 0..255 pixels
            for a model that normalises on the accelerator; ``value_range="0_255"``).
        seed: Seed for shuffles and augmentation; with ``deterministic=True`` the
            batches are the same run after run.
        **options: Any other :class:`ReaderConfig` field (``deterministic``,
            ``drop_remainder``, ``pad_to_batch``, ``value_range``, ``one_hot``,
            ``cache``, ``shuffle_buffer_size``, ``cycle_length``, ``image_fn``,
            ``batch_fn``, ``return_dict``, ...).

    Returns:
        Batches ``(images [B, H, W, 3], labels [B])``; ``(images, labels, weights)``
        with ``pad_to_batch``; a dict with ``return_dict``. ``B`` is static when the
        remainder is dropped (training default) or padded.

    Raises:
        IncompleteDatasetError, DatasetInfoError: see :func:`reader.load_info`.
        UnknownSplitError: ``split`` is not in the dataset (the message lists the splits).
    """
    info = path if isinstance(path, DatasetInfo) else load_info(path)
    config = ReaderConfig(
        split=split,
        batch_size=batch_size,
        image_size=image_size,
        training=training,
        dtype=dtype,
        seed=seed,
        **options,
    )
    return InputReader(info, config).read(input_context)


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
