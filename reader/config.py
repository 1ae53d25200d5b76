"""The reader's two frozen configs: :class:`ReaderConfig` (the pipeline) and :class:`AugmentConfig`.

Both check their own values when built, so a config made by hand gets the same
errors as one ``make_dataset`` makes from its keywords.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import tensorflow as tf

from reader import decode

AUTOTUNE = tf.data.AUTOTUNE
DECODED = "decoded"


def derive_seed(seed: int, purpose: str) -> int:
    """A 63-bit seed for one purpose, from a config's seed (stdlib hash, stable across processes)."""
    digest = hashlib.blake2b(f"{seed}\0{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _range(name: str, value, upper: float | None) -> tuple[float, float]:
    """``value`` as a ``(low, high)`` float pair with ``0 < low <= high (<= upper)``."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair of numbers, got {value!r}") from None
    if not 0 < low <= high or (upper is not None and high > upper):
        bound = f" <= {upper:g}" if upper is not None else ""
        raise ValueError(f"{name} must satisfy 0 < low <= high{bound}, got {value!r}")
    return low, high


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    """How each image is cropped, flipped and resized (``reader.parser.Parser`` runs it).

    Training applies the random crop and flip; evaluation (and training with
    both off) the evaluation crop. Every image is then resized to the output
    size with ``resize_method``.

    Attributes:
        random_crop: Training: Inception-style random resized crop, decoding only
            the crop. Off: the evaluation transform.
        horizontal_flip: Training: random left-right flip.
        crop_area_range: Fraction of the image area the random crop covers,
            ``0 < low <= high <= 1``.
        crop_aspect_ratio_range: Width/height range of the random crop,
            ``0 < low <= high``.
        eval_crop: Evaluation: ``"center"`` (centre crop of
            ``center_crop_fraction`` at the output's aspect ratio, decoding only
            the crop, then resize) or ``"resize"`` (squash the whole image).
        center_crop_fraction: See ``eval_crop``, in ``(0, 1]``; 0.875 is the
            ImageNet 224/256 crop.
        resize_method: A ``tf.image.ResizeMethod`` name (``"bilinear"``,
            ``"bicubic"``, ``"area"``, ...).
    """

    random_crop: bool = True
    horizontal_flip: bool = True
    crop_area_range: tuple[float, float] = (0.08, 1.0)
    crop_aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3)
    eval_crop: str = "center"
    center_crop_fraction: float = 0.875
    resize_method: str = "bilinear"

    def __post_init__(self):
        object.__setattr__(
            self, "crop_area_range", _range("crop_area_range", self.crop_area_range, 1.0)
        )
        object.__setattr__(
            self,
            "crop_aspect_ratio_range",
            _range("crop_aspect_ratio_range", self.crop_aspect_ratio_range, None),
        )
        if self.eval_crop not in decode.EVAL_CROPS:
            raise ValueError(
                f"eval_crop must be one of {decode.EVAL_CROPS}, got {self.eval_crop!r}"
            )
        if not 0 < self.center_crop_fraction <= 1:
            raise ValueError(
                f"center_crop_fraction must be in (0, 1], got {self.center_crop_fraction!r}"
            )
        if self.resize_method not in decode.RESIZE_METHODS:
            raise ValueError(
                f"resize_method must be one of {decode.RESIZE_METHODS}, got {self.resize_method!r}"
            )


AUGMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(AugmentConfig))


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    """Everything that shapes a reader pipeline. ``make_dataset`` builds one from its arguments,
    or takes one as ``config=``.

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
        augment: Crop, flip and resize (:class:`AugmentConfig`); ``make_dataset``
            builds it from its keywords of the same names.
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
    augment: AugmentConfig = dataclasses.field(default_factory=lambda: AugmentConfig())
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
        if not isinstance(self.augment, AugmentConfig):
            raise TypeError(f"augment must be an AugmentConfig, got {self.augment!r}")
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
        """Training with a random crop or flip: each image needs a seed of its own."""
        return self.training and (self.augment.random_crop or self.augment.horizontal_flip)

    @property
    def caches_decoded(self) -> bool:
        return self.cache == DECODED

    @property
    def native_resize_applies(self) -> bool:
        """The pipeline has the per-batch step the native op replaces."""
        return (
            (self.caches_decoded or not self.decode_before_batching)
            and self.image_fn is None
            and self.augment.resize_method == "bilinear"
        )
