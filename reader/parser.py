"""The Parser: serialized records in, decoded, cropped, flipped and resized images out.

Built once from a frozen :class:`~reader.config.AugmentConfig`, after TF Model Garden's
parsers: one ``parse_train_*`` / ``parse_eval_*`` pair per place decoding can happen
(``*_batch``, ``*_record``, ``cache_*``); each image's seeds from :func:`image_seeds`.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from reader import decode, native
from reader.config import AugmentConfig


def image_seeds(seed: tf.Tensor, count: tf.Tensor | None = None) -> tf.Tensor:
    """A crop seed and a flip seed per image: int64 ``[2, 2]``, or ``[count, 2, 2]``."""
    shape = [2, 2] if count is None else tf.stack([count, 2, 2])
    return tf.random.stateless_uniform(shape, seed=seed, minval=None, maxval=None, dtype=tf.int64)


class Parser:
    """Decodes, crops, flips and resizes images as one :class:`AugmentConfig` says.

    Args:
        augment: The crop, flip and resize settings.
        output_size: ``(height, width)`` of every output image.
        native_dtype: Flip and resize each batch with the native op
            (``reader.native``), giving this dtype (``tf.float32``, or
            ``tf.uint8``: rounded); ``None``: stock TensorFlow ops, float32.
        with_metadata: Also parse ``filename`` and ``sha256``.
        image_fn: The user's ``f(image, label) -> (image, label)`` per image (stock
            ops only), after the resize.
        image_fn_keeps_shape: ``image_fn`` runs in the per-batch step, whose output
            signature is fixed: check what it returns.
        parallel_iterations: Images of one batch decoded at once (the per-image
            loop's ``parallel_iterations``): the batch size. The CPU cost per
            image does not change with it, but one batch may use several cores,
            which matters when fewer batches are in flight than there are cores.
    """

    def __init__(
        self,
        augment: AugmentConfig,
        output_size: tuple[int, int],
        *,
        native_dtype: tf.DType | None = None,
        with_metadata: bool = False,
        image_fn: Callable | None = None,
        image_fn_keeps_shape: bool = True,
        parallel_iterations: int = 10,
    ):
        if native_dtype is not None and (
            image_fn is not None or augment.resize_method != "bilinear"
        ):
            raise ValueError("the native op resizes bilinearly and runs no image_fn")
        self._augment = augment
        self._size = tuple(output_size)
        self._native_dtype = native_dtype
        self._with_metadata = with_metadata
        self._image_fn = image_fn
        self._image_fn_keeps_shape = image_fn_keeps_shape
        self._parallel_iterations = parallel_iterations

    # Batches of serialized records ------------------------------------------------------
    def parse_train_batch(self, serialized: tf.Tensor, seed: tf.Tensor) -> dict:
        """Training: ``parse_example``, then per image random crop while decoding, flip, resize.

        Args:
            serialized: string ``[B]``.
            seed: int64 ``[2]``, the batch's stateless seed.

        Returns:
            ``{"image": [B, H, W, 3], "label": int32 [B]}`` (+ ``filename``, ``sha256``).
        """
        return self._parse_batch(serialized, seed, train=True)

    def parse_eval_batch(self, serialized: tf.Tensor) -> dict:
        """Evaluation: :meth:`parse_train_batch` with the evaluation crop and no flip."""
        return self._parse_batch(serialized, None, train=False)

    # One serialized record (decode before batching) -------------------------------------
    def parse_train_record(self, serialized: tf.Tensor, seed: tf.Tensor) -> dict:
        """Training, one scalar record: ``{"image": float32 [H, W, 3], "label": int32}``."""
        return self._parse_record(serialized, image_seeds(seed), train=True)

    def parse_eval_record(self, serialized: tf.Tensor) -> dict:
        """Evaluation, one scalar record."""
        return self._parse_record(serialized, None, train=False)

    # cache="decoded" --------------------------------------------------------------------
    def cache_train_record(self, serialized: tf.Tensor) -> dict:
        """What the training cache keeps of a record: the whole image decoded (uint8).

        Every epoch crops it differently. Without ``random_crop`` the evaluation
        window, as :meth:`cache_eval_record`.
        """
        return self._cache_record(serialized, whole=self._augment.random_crop)

    def cache_eval_record(self, serialized: tf.Tensor) -> dict:
        """What the evaluation cache keeps: the evaluation window, decoded as the JPEG path does.

        ``decode_and_crop_jpeg``'s pixels at the window's edges differ slightly
        from slicing a fully decoded image, so a cached evaluation is pixel-equal
        to an uncached one only this way (and the cache is smaller).
        """
        return self._cache_record(serialized, whole=False)

    def crop_train_cached(self, features: dict, seed: tf.Tensor) -> dict:
        """Training on a cached image: random crop (a slice), flip, resize.

        The window is drawn exactly as in :meth:`parse_train_batch` (same
        stateless sampler, same seed use), then sliced out of the cached pixels.
        With the native op the window stays uint8 and flat, as ``pixels``
        (+ ``window``: its ``(h, w)``, ``flip``) for ``padded_batch`` and
        :meth:`resize_cached_batch`.
        """
        return self._crop_cached(features, image_seeds(seed), train=True)

    def crop_eval_cached(self, features: dict) -> dict:
        """Evaluation on a cached image (already the evaluation window): resize."""
        return self._crop_cached(features, None, train=False)

    def resize_cached_batch(self, features: dict) -> dict:
        """Native op: flip + resize a ``padded_batch`` of :meth:`crop_train_cached` windows."""
        features = dict(features)
        pixels = features.pop("pixels")
        images = native.resize_crops(
            pixels, features.pop("window"), features.pop("flip"), self._size, self._native_dtype
        )
        images.set_shape(pixels.shape[:1].concatenate([*self._size, 3]))
        features["image"] = images
        return features

    # One image ---------------------------------------------------------------------------
    def train_image(self, encoded: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
        """One JPEG for training with stock ops: float32 ``[H, W, 3]`` in 0..255.

        ``decode_and_crop_jpeg`` runs the inverse DCT, upsampling and colour
        conversion only for the rows and columns of the crop window (the entropy
        decoding still reads the whole file), and never materialises the full
        image: the random crop's average area is about half the image.

        Args:
            encoded: Scalar string, the JPEG bytes.
            seeds: int64 ``[2, 2]``: the crop's stateless seed and the flip's.
        """
        image, flip = self._window(encoded, seeds, train=True)
        return self._flip_and_resize(image, flip, train=True)

    def eval_image(self, encoded: tf.Tensor) -> tf.Tensor:
        """One JPEG for evaluation with stock ops: centre crop (decoding only it) or squash."""
        image, flip = self._window(encoded, None, train=False)
        return self._flip_and_resize(image, flip, train=False)

    # Internals ---------------------------------------------------------------------------
    def _random_crop(self, train: bool) -> bool:
        return train and self._augment.random_crop

    def _flips(self, train: bool) -> bool:
        return train and self._augment.horizontal_flip

    def _flip(self, seeds: tf.Tensor | None, train: bool) -> tf.Tensor:
        return decode.flip_draw(seeds[1]) if self._flips(train) else tf.constant(False)

    def _eval_window(self, encoded: tf.Tensor) -> tf.Tensor:
        """The evaluation window of one JPEG, decoded (uint8), not yet resized."""
        aug = self._augment
        if aug.eval_crop == "center":
            shape = tf.io.extract_jpeg_shape(encoded)
            window = decode.center_crop_window(shape, self._size, aug.center_crop_fraction)
            return tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
        return tf.io.decode_jpeg(encoded, channels=3)  # "resize": the whole image

    def _random_crop_window(
        self, encoded: tf.Tensor, seed: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """``(uint8 [h, w, 3] decoded random window, int32 [y, x, h, w] window)`` of one JPEG."""
        window = decode.random_crop_window(
            tf.io.extract_jpeg_shape(encoded),
            seed,
            self._augment.crop_area_range,
            self._augment.crop_aspect_ratio_range,
        )
        return tf.io.decode_and_crop_jpeg(encoded, window, channels=3), window

    def _window(
        self, encoded: tf.Tensor, seeds: tf.Tensor | None, train: bool
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """``(uint8 [h, w, 3] decoded window, bool scalar: mirror it)`` of one JPEG."""
        if self._random_crop(train):
            image, _ = self._random_crop_window(encoded, seeds[0])
        else:
            image = self._eval_window(encoded)
        return image, self._flip(seeds, train)

    def _flip_and_resize(self, image: tf.Tensor, flip: tf.Tensor, train: bool) -> tf.Tensor:
        """The stock-ops tail of every path: mirror the window if drawn so, then resize it.

        The uint8 window is mirrored *before* the resize: a half-pixel-centred
        resize commutes with a horizontal flip, so the result is the flipped
        resize up to float rounding, while this moves the small uint8 window
        instead of the four-times-larger float32 result.
        """
        if self._flips(train):
            image = tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)
        # A random crop almost never has the output size; evaluation windows often do.
        return decode.resize(
            image,
            self._size,
            self._augment.resize_method,
            often_same_size=not self._random_crop(train),
        )

    def _apply_image_fn(self, image: tf.Tensor, label: tf.Tensor, check: bool):
        if self._image_fn is None:
            return image, label
        image, label = self._image_fn(image, label)
        if check:
            self._check_image_fn_output(image, label)
        return image, label

    def _check_image_fn_output(self, image, label) -> None:
        """In the batched path image_fn runs inside map_fn, whose output spec is fixed."""
        expected = tf.TensorShape([*self._size, 3])
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

    def _parse_batch(self, serialized: tf.Tensor, seed: tf.Tensor | None, train: bool) -> dict:
        features = decode.parse_batch(serialized, with_metadata=self._with_metadata)
        encoded = features.pop(decode.ENCODED)
        count = tf.shape(encoded)[0]
        seeds = image_seeds(seed, count) if train else None
        if self._native_dtype is not None:
            features["image"] = self._decode_batch_native(encoded, seeds, train)
            return features

        # Decoding after batching needs a per-image step: map_fn (a while_loop)
        # measured fastest (docs/performance.md). tf.vectorized_map fails on the
        # variable-size decoded images, and unbatch -> map -> batch would give up
        # the batched parse.
        def one(args):
            if train:
                encoded, label, seeds = args
                image = self.train_image(encoded, seeds)
            else:
                encoded, label = args
                image = self.eval_image(encoded)
            return self._apply_image_fn(image, label, check=self._image_fn_keeps_shape)

        elems = (encoded, features["label"], seeds) if train else (encoded, features["label"])
        images, labels = tf.map_fn(
            one,
            elems,
            fn_output_signature=(
                tf.TensorSpec([*self._size, 3], tf.float32),
                tf.TensorSpec([], tf.int32),
            ),
            parallel_iterations=self._parallel_iterations,
        )
        features["image"] = images
        features["label"] = labels
        return features

    def _decode_batch_native(
        self, encoded: tf.Tensor, seeds: tf.Tensor | None, train: bool
    ) -> tf.Tensor:
        """Decodes each image's window (uint8), then flips + resizes all into the batch at once.

        The windows go to the op as one flat uint8 tensor plus their shapes: the
        concatenation copies the small uint8 windows, where the stock path copies
        each float32 result into the batch.
        """
        count = tf.shape(encoded)[0]
        if not train and self._augment.eval_crop == "center":
            return self._decode_center_batch_native(encoded, count)
        # The flips of the whole batch in one op (the same draws as flip_draw per
        # image), so the loop only decodes: fewer ops and one array fewer per image.
        if self._flips(train):
            flips = native.flip_draws(seeds[:, 1])
        else:
            flips = tf.zeros([count], tf.bool)
        random_crop = self._random_crop(train)
        crop_seeds = seeds[:, 0] if random_crop else None

        def step(i, pixels, shapes):
            if random_crop:
                # decode_and_crop_jpeg returns exactly its window: the loop keeps the
                # window, whose last two values are the crop's shape.
                image, shape = self._random_crop_window(encoded[i], crop_seeds[i])
            else:
                image = self._eval_window(encoded[i])
                shape = tf.shape(image)[:2]
            return i + 1, pixels.write(i, tf.reshape(image, [-1])), shapes.write(i, shape)

        arrays = (
            tf.TensorArray(tf.uint8, size=count, infer_shape=False, element_shape=[None]),
            tf.TensorArray(tf.int32, size=count, element_shape=[4 if random_crop else 2]),
        )
        _, pixels, shapes = tf.while_loop(
            lambda i, *_: i < count,
            step,
            (tf.constant(0), *arrays),
            parallel_iterations=self._parallel_iterations,
        )
        shapes = shapes.stack()
        if random_crop:
            shapes = shapes[:, 2:]
        return self._resize_native(encoded, pixels, count, shapes, flips)

    def _decode_center_batch_native(self, encoded: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
        """Evaluation's centre crops: the windows of the whole batch at once, then decode each.

        A first loop reads each JPEG's header (``extract_jpeg_shape``), the
        windows are computed for the batch in one set of vector ops (the same
        float32 arithmetic as per image, so the same windows), and the decode
        loop only slices its window and decodes: ~20 small ops per image fewer
        than computing each window inside the loop. Nothing is mirrored, and
        ``decode_and_crop_jpeg`` returns exactly its window's size, so neither
        the flips nor the shapes need a loop.
        """

        def header(i, shapes):
            return i + 1, shapes.write(i, tf.io.extract_jpeg_shape(encoded[i]))

        _, shapes = tf.while_loop(
            lambda i, *_: i < count,
            header,
            (tf.constant(0), tf.TensorArray(tf.int32, size=count, element_shape=[3])),
            parallel_iterations=self._parallel_iterations,
        )
        windows = decode.center_crop_window(
            shapes.stack(), self._size, self._augment.center_crop_fraction
        )

        def step(i, pixels):
            image = tf.io.decode_and_crop_jpeg(encoded[i], windows[i], channels=3)
            return i + 1, pixels.write(i, tf.reshape(image, [-1]))

        _, pixels = tf.while_loop(
            lambda i, *_: i < count,
            step,
            (
                tf.constant(0),
                tf.TensorArray(tf.uint8, size=count, infer_shape=False, element_shape=[None]),
            ),
            parallel_iterations=self._parallel_iterations,
        )
        return self._resize_native(
            encoded, pixels, count, windows[:, 2:], tf.zeros([count], tf.bool)
        )

    def _resize_native(
        self,
        encoded: tf.Tensor,
        pixels: tf.TensorArray,
        count: tf.Tensor,
        shapes: tf.Tensor,
        flips: tf.Tensor,
    ) -> tf.Tensor:
        """The native op on a decode loop's windows: ``[B, H, W, 3]`` of the parser's dtype.

        In a ``tf.function`` (control flow v2, as in ``tf.data``) the array is a
        ``TensorList`` holding each decoded window's own buffer, which the op reads
        in place: no concatenation, i.e. no copy of every decoded byte.
        """
        if pixels.flow.dtype == tf.variant:
            images = native.resize_crop_list(
                pixels.flow, shapes, flips, self._size, self._native_dtype
            )
        else:
            # concat() of an empty array has no element shape to go by.
            flat = tf.cond(count > 0, lambda: pixels.concat(), lambda: tf.zeros([0], tf.uint8))
            images = native.resize_crops(flat, shapes, flips, self._size, self._native_dtype)
        # The batch dimension is static when the remainder is dropped; the loop hides it.
        images.set_shape(encoded.shape[:1].concatenate([*self._size, 3]))
        return images

    def _parse_record(self, serialized: tf.Tensor, seeds: tf.Tensor | None, train: bool) -> dict:
        features = decode.parse_single(serialized, with_metadata=self._with_metadata)
        encoded = features.pop(decode.ENCODED)
        image = self.train_image(encoded, seeds) if train else self.eval_image(encoded)
        features["image"], features["label"] = self._apply_image_fn(
            image, features["label"], check=False
        )
        return features

    def _cache_record(self, serialized: tf.Tensor, whole: bool) -> dict:
        features = decode.parse_single(serialized, with_metadata=self._with_metadata)
        encoded = features.pop(decode.ENCODED)
        if whole:
            image = tf.io.decode_jpeg(encoded, channels=3)
        else:
            image = self._eval_window(encoded)
        image.set_shape([None, None, 3])
        features["image"] = image
        return features

    def _crop_cached(self, features: dict, seeds: tf.Tensor | None, train: bool) -> dict:
        features = dict(features)
        image = features.pop("image")
        if self._random_crop(train):
            window = decode.random_crop_window(
                tf.shape(image),
                seeds[0],
                self._augment.crop_area_range,
                self._augment.crop_aspect_ratio_range,
            )
            image = tf.slice(
                image, tf.stack([window[0], window[1], 0]), tf.stack([window[2], window[3], 3])
            )
        flip = self._flip(seeds, train)
        if self._native_dtype is not None:
            features["pixels"] = tf.reshape(image, [-1])
            features["window"] = tf.shape(image)[:2]
            features["flip"] = flip
            return features
        image = self._flip_and_resize(image, flip, train)
        features["image"], features["label"] = self._apply_image_fn(
            image, features["label"], check=False
        )
        return features
