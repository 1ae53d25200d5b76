"""The reader's TensorFlow primitives: parse, crop windows, resize, flip draw, normalise.

Graph code only, with stateless seeded randomness, so a seeded pipeline gives the same
augmentation however ``tf.data`` schedules its parallel calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

# The record keys of docs/format.md section 6 the reader needs.
ENCODED = "image/encoded"
LABEL = "image/class/label"
FILENAME = "image/filename"
SHA256 = "image/key/sha256"

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

VALUE_RANGES = ("0_255", "0_1", "imagenet")
EVAL_CROPS = ("center", "resize")
# tf.image.ResizeMethod values.
RESIZE_METHODS = (
    "bilinear",
    "nearest",
    "bicubic",
    "area",
    "lanczos3",
    "lanczos5",
    "gaussian",
    "mitchellcubic",
)


def feature_spec(with_metadata: bool) -> dict[str, tf.io.FixedLenFeature]:
    """The ``parse_example`` spec: only the keys we use, so parsing stays cheap."""
    spec = {
        ENCODED: tf.io.FixedLenFeature([], tf.string),
        LABEL: tf.io.FixedLenFeature([], tf.int64),
    }
    if with_metadata:
        spec[FILENAME] = tf.io.FixedLenFeature([], tf.string, default_value="")
        spec[SHA256] = tf.io.FixedLenFeature([], tf.string, default_value="")
    return spec


def parse_batch(serialized: tf.Tensor, with_metadata: bool = False) -> dict[str, tf.Tensor]:
    """``tf.io.parse_example`` over a whole batch of serialized records.

    One vectorised op per batch instead of one ``parse_single_example`` per
    record: the per-call overhead is paid once per batch.

    Returns:
        ``{"image/encoded": string [B], "label": int32 [B]}`` plus ``filename`` and
        ``sha256`` (string [B]) when ``with_metadata``.
    """
    parsed = tf.io.parse_example(serialized, feature_spec(with_metadata))
    out = {ENCODED: parsed[ENCODED], "label": tf.cast(parsed[LABEL], tf.int32)}
    if with_metadata:
        out["filename"] = parsed[FILENAME]
        out["sha256"] = parsed[SHA256]
    return out


def parse_single(serialized: tf.Tensor, with_metadata: bool = False) -> dict[str, tf.Tensor]:
    """Like :func:`parse_batch` for one scalar record (the decode-before-batching path)."""
    parsed = tf.io.parse_single_example(serialized, feature_spec(with_metadata))
    out = {ENCODED: parsed[ENCODED], "label": tf.cast(parsed[LABEL], tf.int32)}
    if with_metadata:
        out["filename"] = parsed[FILENAME]
        out["sha256"] = parsed[SHA256]
    return out


# Resize methods whose CPU kernels are faster on float32 input than on uint8, so
# the decoded pixels are cast first. ResizeBilinear's inner loop loads a float
# pixel with one SSE load but converts uint8 channel by channel, so the cast
# plus the float resize is cheaper than the uint8 resize (bilinear gains most,
# bicubic a little; area, lanczos and nearest do not gain, so they keep their
# uint8 input; numbers in docs/performance.md). The values are the same up to
# float rounding: both kernels compute in float32.
_FLOAT_INPUT_METHODS = frozenset({"bilinear", "bicubic"})


def resize(
    image: tf.Tensor, size: Sequence[int], method: str, often_same_size: bool = False
) -> tf.Tensor:
    """Resizes a decoded uint8 image to ``size``: float32 ``[height, width, 3]`` in 0..255.

    Args:
        image: uint8 ``[h, w, 3]``.
        size: ``(height, width)`` of the output.
        method: A ``tf.image.ResizeMethod`` name.
        often_same_size: The image often already has the output size (the
            evaluation centre crop: 224 x 224 out of 256 px records). Then a
            float-input resize checks for it and only casts, since the kernel's
            no-op path would copy the cast pixels once more (eval 0.65 -> 0.59 CPU
            ms per image). Random crops almost never match, and the check costs a
            ``tf.cond`` per image inside the batch loop, so training skips it.
    """
    if method in _FLOAT_INPUT_METHODS:
        if often_same_size:
            same_size = tf.reduce_all(tf.shape(image)[:2] == tf.constant(size, tf.int32))
            image = tf.cond(
                same_size,
                lambda: tf.cast(image, tf.float32),
                lambda: tf.image.resize(tf.cast(image, tf.float32), size, method=method),
            )
        else:
            image = tf.image.resize(tf.cast(image, tf.float32), size, method=method)
    else:
        # tf.image.resize returns float32 for every method but "nearest"; cast so
        # the output spec is the same whatever the method.
        image = tf.cast(tf.image.resize(image, size, method=method), tf.float32)
    image.set_shape([size[0], size[1], 3])
    return image


def random_crop_window(
    image_shape: tf.Tensor,
    seed: tf.Tensor,
    area_range: Sequence[float],
    aspect_ratio_range: Sequence[float],
    max_attempts: int = 10,
    min_object_covered: float = 0.1,
) -> tf.Tensor:
    """An Inception-style random crop ``[y, x, height, width]`` of an image of ``image_shape``.

    ``sample_distorted_bounding_box`` falls back to the whole image when no
    attempt fits, so the window is always valid.
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_size=image_shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        seed=seed,
        min_object_covered=min_object_covered,
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=max_attempts,
        use_image_if_no_bounding_boxes=True,
    )
    # begin is [y, x, 0] and size [height, width, -1]: two slices and a concat
    # rather than four scalar slices and a stack (this runs once per image).
    return tf.concat([begin[:2], size[:2]], 0)


def center_crop_window(image_shape: tf.Tensor, size: Sequence[int], fraction: float) -> tf.Tensor:
    """The largest centred window of ``size``'s aspect ratio, scaled by ``fraction``.

    ``fraction=0.875`` is the classic ImageNet evaluation crop (224 out of 256).

    Args:
        image_shape: int32 ``[3]`` (``extract_jpeg_shape``'s), or ``[B, 3]`` for a
            whole batch at once: the same elementwise float32 arithmetic, so the
            same windows as one image at a time.

    Returns:
        int32 ``[y, x, height, width]``, or ``[B, 4]``.
    """
    height = tf.cast(image_shape[..., 0], tf.float32)
    width = tf.cast(image_shape[..., 1], tf.float32)
    scale = fraction * tf.minimum(height / size[0], width / size[1])
    crop_h = tf.clip_by_value(tf.cast(tf.round(scale * size[0]), tf.int32), 1, image_shape[..., 0])
    crop_w = tf.clip_by_value(tf.cast(tf.round(scale * size[1]), tf.int32), 1, image_shape[..., 1])
    offset_y = (image_shape[..., 0] - crop_h) // 2
    offset_x = (image_shape[..., 1] - crop_w) // 2
    return tf.stack([offset_y, offset_x, crop_h, crop_w], axis=-1)


def flip_draw(seed: tf.Tensor) -> tf.Tensor:
    """``stateless_random_flip_left_right``'s own draw: mirror when uniform(seed) < 0.5."""
    return tf.random.stateless_uniform([], seed=seed, minval=0.0, maxval=1.0) < 0.5


def normalize(
    images: tf.Tensor,
    value_range: str,
    dtype: tf.DType,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> tf.Tensor:
    """Maps float32 0..255 images to the requested range and dtype, on the whole batch.

    Done once per batch (one fused elementwise op over ``[B, H, W, 3]``), not per
    image. The arithmetic stays in float32 and the cast to ``dtype`` comes last,
    so bfloat16 output loses precision only once.

    Args:
        images: float32 (uint8 from the native op when ``dtype`` is uint8), values in 0..255.
        value_range: ``"0_255"`` (raw; Keras EfficientNet/ConvNeXt expect this),
            ``"0_1"``, or ``"imagenet"`` (``(x/255 - mean) / std``).
        dtype: ``tf.float32`` or ``tf.bfloat16`` (any float dtype works), or
            ``tf.uint8`` (with ``"0_255"``): rounded half to even and saturated.
        mean, std: Per-channel statistics for ``"imagenet"``, on the 0..1 scale.
    """
    if dtype == tf.uint8:
        # Raw pixels (ReaderConfig allows uint8 only with "0_255"); the native op
        # already rounded them, the stock path's float32 values are rounded here.
        if images.dtype == tf.uint8:
            return images
        return tf.saturate_cast(tf.round(images), tf.uint8)
    if value_range == "0_255":
        pass
    elif value_range == "0_1":
        images = images * (1.0 / 255.0)
    elif value_range == "imagenet":
        scale = tf.constant([1.0 / (255.0 * s) for s in std], tf.float32)
        offset = tf.constant([m / s for m, s in zip(mean, std, strict=True)], tf.float32)
        images = images * scale - offset
    else:
        raise ValueError(f"value_range must be one of {VALUE_RANGES}, got {value_range!r}")
    return tf.cast(images, dtype)
