"""reader.make_dataset in training mode: shuffling, epochs, determinism, augmentation, hooks."""

from __future__ import annotations

import collections
import dataclasses
import logging

import numpy as np
import pytest
import tensorflow as tf

import reader
from tests.shard_fixtures import write_dataset

SIZE = 24


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("train") / "ds", per_class=32)


@pytest.fixture(scope="module")
def class_sorted(tmp_path_factory):
    """Shards whose records are sorted by class: only the reader's shuffle can mix them."""
    return write_dataset(
        tmp_path_factory.mktemp("sorted") / "ds",
        per_class=32,
        shards={"train": 2},
        class_sorted_shards=True,
    )


def train_dataset(fixture, batch_size=8, **kwargs):
    kwargs.setdefault("image_size", SIZE)
    return reader.make_dataset(
        fixture.path, "train", batch_size, training=True, return_dict=True, **kwargs
    )


def stream(ds, batches: int) -> dict[str, np.ndarray]:
    parts = collections.defaultdict(list)
    for batch in ds.take(batches):
        for key, value in batch.items():
            parts[key].append(value.numpy())
    return {key: np.concatenate(values) for key, values in parts.items()}


def epoch_batch_size(fixture) -> int:
    """A batch size that divides the split, so epochs start on batch boundaries."""
    n = len(fixture.records["train"])
    return next(b for b in range(16, 1, -1) if n % b == 0)


def order_correlation(labels) -> float:
    """Correlation of label and position: near 1 for a class-sorted stream, near 0 mixed."""
    return float(np.corrcoef(np.arange(len(labels)), labels)[0, 1])


@pytest.mark.e2e
def test_training_shapes_are_static(fixture):
    for dtype in (tf.float32, tf.bfloat16):
        ds = reader.make_dataset(fixture.path, "train", 8, (SIZE, 20), training=True, dtype=dtype)
        images, labels = ds.element_spec
        assert images.shape.as_list() == [8, SIZE, 20, 3] and images.dtype == dtype
        assert labels.shape.as_list() == [8] and labels.dtype == tf.int32
        x, y = next(iter(ds))
        assert x.shape == (8, SIZE, 20, 3) and x.dtype == dtype and y.shape == (8,)


@pytest.mark.e2e
def test_shuffles_across_classes(class_sorted):
    n = len(class_sorted.records["train"])
    # deterministic: a non-deterministic interleave of the two shards may, on a
    # busy machine, take long runs from one shard, which is not the point here.
    unshuffled = train_dataset(
        class_sorted, shuffle=False, shuffle_files=False, repeat=False, deterministic=True
    )
    labels = np.concatenate([b["label"].numpy() for b in unshuffled])
    # Sanity: without the reader's shuffle the stream really is ordered by class.
    assert order_correlation(labels) > 0.7
    # The reader's shuffle, seeded, and its interleave in a fixed order too: what
    # is measured is the shuffle, not the order busy threads finished in.
    shuffled = stream(train_dataset(class_sorted, seed=1, deterministic=True), n // 8)["label"]
    assert abs(order_correlation(shuffled)) < 0.35
    # Every class shows up early, in proportion, not after the others are used up.
    first_quarter = collections.Counter(shuffled[: n // 4])
    assert all(first_quarter[c] >= n // 4 // 6 for c in range(3)), first_quarter
    # Most batches hold more than one class.
    per_batch = [len(set(b)) for b in shuffled[: n // 8 * 8].reshape(-1, 8)]
    assert sum(k > 1 for k in per_batch) >= 0.8 * len(per_batch)


@pytest.mark.e2e
def test_epochs_differ_and_each_is_the_whole_split(fixture):
    batch = epoch_batch_size(fixture)
    n = len(fixture.records["train"])
    # deterministic: with parallel non-deterministic decoding a batch of epoch 2 may
    # come out before the last batch of epoch 1 (seen once in a parallel test run).
    out = stream(train_dataset(fixture, batch, seed=5, deterministic=True), 3 * n // batch)
    epochs = [list(out["filename"][i * n : (i + 1) * n]) for i in range(3)]
    for epoch in epochs:
        assert sorted(x.decode() for x in epoch) == sorted(fixture.filenames("train"))
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    # And none of them is the on-disk order.
    assert [x.decode() for x in epochs[0]] != fixture.filenames("train")


@pytest.mark.e2e
def test_deterministic_with_a_seed_repeats_exactly(fixture):
    def first_batches(seed):
        ds = reader.make_dataset(
            fixture.path, "train", 8, SIZE, training=True, seed=seed, deterministic=True
        )
        return [(x.numpy(), y.numpy()) for x, y in ds.take(4)]

    a, b, other = first_batches(7), first_batches(7), first_batches(8)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert any(not np.array_equal(xa, xo) for (xa, _), (xo, _) in zip(a, other, strict=True))


def _by_name(out) -> dict[str, np.ndarray]:
    return {n.decode(): image for n, image in zip(out["filename"], out["image"], strict=True)}


@pytest.mark.e2e
def test_augmentation_switches(fixture):
    n = len(fixture.records["train"])
    batch = epoch_batch_size(fixture)
    eval_images = _by_name(
        stream(
            reader.make_dataset(
                fixture.path, "train", batch, SIZE, training=False, return_dict=True
            ),
            n // batch,
        )
    )

    # deterministic: with parallel, unordered decoding a batch of the next epoch
    # may overtake the last one of this epoch, and the comparison needs whole epochs.
    off = _by_name(
        stream(
            train_dataset(
                fixture, batch, random_crop=False, horizontal_flip=False, deterministic=True
            ),
            n // batch,
        )
    )
    assert off.keys() == eval_images.keys()
    for name, image in off.items():
        np.testing.assert_allclose(image, eval_images[name], atol=1e-3)

    # deterministic: each epoch whole, as above (a name seen twice would hide another).
    flip = _by_name(
        stream(
            train_dataset(fixture, batch, random_crop=False, seed=3, deterministic=True),
            n // batch,
        )
    )
    flipped = 0
    for name, image in flip.items():
        if np.allclose(image, eval_images[name], atol=1e-3):
            continue
        np.testing.assert_allclose(image, eval_images[name][:, ::-1], atol=1e-3)
        flipped += 1
    assert 0.2 * n < flipped < 0.8 * n

    # Random crops: the same file looks different from one epoch to the next.
    two_epochs = stream(
        train_dataset(fixture, batch, horizontal_flip=False, seed=3, deterministic=True),
        2 * n // batch,
    )
    first = _by_name({k: v[:n] for k, v in two_epochs.items()})
    second = _by_name({k: v[n:] for k, v in two_epochs.items()})
    differ = sum(not np.allclose(first[k], second[k], atol=1) for k in first)
    assert differ > 0.8 * n


def test_hooks(fixture):
    def image_fn(image, label):
        return tf.fill(tf.shape(image), tf.cast(label, tf.float32) * 10.0 + 1.0), label

    def batch_fn(images, labels):
        return images * 2.0, labels + 100

    out = stream(train_dataset(fixture, image_fn=image_fn, batch_fn=batch_fn, seed=1), 3)
    labels = out["label"] - 100
    assert set(labels) <= {0, 1, 2} and len(set(labels)) > 1
    expected = (labels.astype(np.float32) * 10 + 1) * 2
    np.testing.assert_array_equal(
        out["image"], np.broadcast_to(expected[:, None, None, None], out["image"].shape)
    )


@pytest.mark.e2e
def test_decode_before_batching_lets_image_fn_change_the_shape(fixture):
    def image_fn(image, label):
        return image[::2, ::2], label

    ds = reader.make_dataset(
        fixture.path,
        "train",
        8,
        SIZE,
        training=True,
        image_fn=image_fn,
        decode_before_batching=True,
        seed=2,
    )
    assert ds.element_spec[0].shape.as_list() == [8, SIZE // 2, SIZE // 2, 3]
    # The same pipeline, batched path, the same seed: the same images.
    kwargs = dict(training=True, seed=2, deterministic=True, return_dict=True)
    before = stream(
        reader.make_dataset(fixture.path, "train", 8, SIZE, decode_before_batching=True, **kwargs),
        4,
    )
    after = stream(reader.make_dataset(fixture.path, "train", 8, SIZE, **kwargs), 4)
    np.testing.assert_array_equal(before["filename"], after["filename"])
    assert before["image"].shape == after["image"].shape
    assert np.abs(before["image"] - after["image"]).mean() < 20


@pytest.mark.e2e
@pytest.mark.parametrize("seed", [11, None])
def test_training_input_pipelines_cover_an_epoch_exactly_once(fixture, seed):
    contexts = [tf.distribute.InputContext(2, i, 2) for i in range(2)]
    parts = []
    for context in contexts:
        ds = train_dataset(
            fixture, 4, seed=seed, repeat=False, drop_remainder=False, input_context=context
        )
        parts.append([n.decode() for b in ds for n in b["filename"].numpy()])
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(fixture.filenames("train"))


@pytest.mark.e2e
def test_training_fallback_by_record_covers_once(fixture, caplog):
    assert len(reader.load_info(fixture.path).files("val")) == 1
    parts = []
    with caplog.at_level(logging.WARNING):
        for i in range(2):
            ds = reader.make_dataset(
                fixture.path,
                "val",
                4,
                SIZE,
                training=True,
                seed=4,
                repeat=False,
                drop_remainder=False,
                return_dict=True,
                input_context=tf.distribute.InputContext(2, i, 2),
            )
            parts.append([n.decode() for b in ds for n in b["filename"].numpy()])
    assert any("sharding by record" in r.getMessage() for r in caplog.records)
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(fixture.filenames("val"))


@pytest.mark.e2e
def test_options_reach_tf_data(fixture):
    extra = tf.data.Options()
    extra.autotune.ram_budget = 1 << 30
    ds = reader.make_dataset(
        fixture.path,
        "train",
        8,
        SIZE,
        training=True,
        threadpool_size=3,
        max_intra_op_parallelism=1,
        options=extra,
        cycle_length=2,
        shuffle_buffer_size=16,
        num_parallel_calls=2,
    )
    options = ds.options()
    assert options.threading.private_threadpool_size == 3
    assert options.threading.max_intra_op_parallelism == 1
    assert options.autotune.ram_budget == 1 << 30
    assert options.deterministic is False
    assert (
        reader.make_dataset(fixture.path, "train", 8, SIZE, training=False).options().deterministic
    )
    x, _ = next(iter(ds))
    assert x.shape == (8, SIZE, SIZE, 3)


@pytest.mark.e2e
def test_fixed_parallelism_above_the_shard_count(tmp_path):
    """num_parallel_calls=3 on a one-shard split: interleave gets at most its cycle length."""
    one_shard = write_dataset(tmp_path / "ds", per_class=8, shards={"train": 1})
    assert len(reader.load_info(one_shard.path).files("train")) == 1
    for context in (None, tf.distribute.InputContext(2, 1, 2)):
        ds = reader.make_dataset(
            one_shard.path,
            "train",
            4,
            SIZE,
            training=True,
            num_parallel_calls=3,
            input_context=context,
        )
        x, _ = next(iter(ds))
        assert x.shape == (4, SIZE, SIZE, 3)


@pytest.fixture
def global_seed_zero():
    """Keras' global seeds for one test, then none again.

    TensorFlow combines a seeded shuffle's seed with its global seed, so a global
    seed left behind changes every later test's seeded batches (the pinned
    digests of test_reader_pinned.py, when pytest runs both files in one process).
    """
    tf.keras.utils.set_random_seed(0)
    yield
    tf.random.set_seed(None)


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:`shuffle=True` was passed")
def test_keras_model_learns_from_make_dataset(fixture, global_seed_zero):
    info = reader.load_info(fixture.path)
    # deterministic=True: the same batches every run, so the loss curve cannot
    # depend on thread scheduling when the machine is loaded (seen once in CI-like runs).
    ds = reader.make_dataset(
        fixture.path, "train", 16, 16, training=True, seed=0, value_range="0_1", deterministic=True
    )
    model = tf.keras.Sequential(
        [
            tf.keras.Input((16, 16, 3)),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(info.num_classes),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.1),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # Weighted: the val batches' padding (weight 0) must not count, or a
        # model that always answers one class scores 0.7 on them.
        weighted_metrics=["accuracy"],
    )
    steps = info.steps_per_epoch("train", 16)
    history = model.fit(ds, steps_per_epoch=steps, epochs=8, verbose=0).history
    val = reader.make_dataset(
        fixture.path, "val", 16, 16, training=False, value_range="0_1", pad_to_batch=True
    )
    # (images, labels, weights): Keras takes the weights as sample weights.
    _, accuracy = model.evaluate(val, verbose=0)
    # Each class is one far-apart colour, so the right images with the right
    # labels are told apart on any machine's arithmetic (1.0 here from the
    # third epoch on); garbage, constant or mismatched labels score about 1/3.
    assert history["accuracy"][-1] >= 0.9, history
    assert accuracy >= 0.9, accuracy


@pytest.mark.e2e
def test_a_new_iterator_gets_new_crops_but_a_new_dataset_the_same(fixture):
    """Loops that make one iterator per epoch still get fresh augmentation each epoch."""
    kwargs = dict(training=True, seed=3, deterministic=True, shuffle=False, shuffle_files=False)
    ds = reader.make_dataset(fixture.path, "train", 8, SIZE, **kwargs)
    first = [x.numpy() for x, _ in ds.take(2)]
    again = [x.numpy() for x, _ in ds.take(2)]
    rebuilt = [
        x.numpy() for x, _ in reader.make_dataset(fixture.path, "train", 8, SIZE, **kwargs).take(2)
    ]
    assert not any(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    for a, b in zip(first, rebuilt, strict=True):
        np.testing.assert_array_equal(a, b)


def test_image_fn_that_changes_the_shape_needs_decode_before_batching(fixture):
    with pytest.raises(ValueError, match="decode_before_batching=True"):
        reader.make_dataset(
            fixture.path,
            "train",
            8,
            SIZE,
            training=True,
            image_fn=lambda image, label: (image[::2], label),
        )


def _photo_like_jpeg(height: int = 60, width: int = 84) -> tf.Tensor:
    """A JPEG with smooth gradients and texture, so resize and flip errors would show."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rng = np.random.default_rng(0)
    image = np.stack(
        [255 * x / width, 255 * y / height, 127 + 100 * np.sin(x / 3) * np.cos(y / 5)], axis=-1
    )
    image = np.clip(image + rng.normal(0, 12, image.shape), 0, 255).astype(np.uint8)
    return tf.io.encode_jpeg(image, quality=90)


@pytest.mark.parametrize("method", ["bilinear", "bicubic", "area", "nearest"])
def test_resize_gives_the_uint8_kernels_values(method):
    """Bilinear and bicubic resize float32 input (faster kernels), or only cast when the
    image already has the output size; the values do not change."""
    from reader import decode

    image = tf.io.decode_jpeg(_photo_like_jpeg(), channels=3)
    for size in ((24, 24), (224, 224), (31, 50), (60, 84)):  # (60, 84): no resize
        reference = tf.cast(tf.image.resize(image, size, method=method), tf.float32)
        for often_same_size in (False, True):
            ours = decode.resize(image, size, method, often_same_size=often_same_size)
            assert ours.dtype == tf.float32 and ours.shape == (*size, 3)
            np.testing.assert_allclose(ours.numpy(), reference.numpy(), atol=1e-3)


def test_flip_before_resize_equals_flip_after():
    """The crop is flipped before the resize: the same images as flipping the float result."""
    from reader import decode
    from reader.parser import Parser

    encoded = _photo_like_jpeg()
    parser = Parser(reader.AugmentConfig(), (SIZE, SIZE))
    flipped = 0
    for i in range(16):
        seeds = tf.constant([[i, 1], [i, 2]], tf.int64)
        ours = parser.train_image(encoded, seeds)
        # What the reader did before: crop, resize to float, then flip the result.
        shape = tf.io.extract_jpeg_shape(encoded)
        window = decode.random_crop_window(shape, seeds[0], (0.08, 1.0), (3 / 4, 4 / 3))
        crop = tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
        resized = tf.image.resize(crop, (SIZE, SIZE))
        reference = tf.image.stateless_random_flip_left_right(resized, seeds[1])
        np.testing.assert_allclose(ours.numpy(), reference.numpy(), atol=1e-3)
        flipped += not np.allclose(reference.numpy(), resized.numpy(), atol=1e-3)
    assert 0 < flipped < 16  # both outcomes were checked


def _read_ops(ds: tf.data.Dataset) -> set[str]:
    """The reading ops in a dataset's graph (which files are read, and how)."""
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    ops = {node.op for node in graph.node} | {
        node.op for function in graph.library.function for node in function.node_def
    }
    return {op for op in ops if "Interleave" in op or op.startswith("TFRecordDataset")}


@pytest.mark.e2e
def test_shards_are_read_in_the_background_only_on_gs(tmp_path):
    """One local shard, or evaluation: read on the consumer's thread; on gs://, an interleave.

    On gs:// every refill of the read buffer is a network round trip; the
    interleave's own thread overlaps it with the decoding. (Evaluation's order
    over gs:// is checked against the emulator in test_gcs_tensorflow.py.)
    """
    one_shard = write_dataset(tmp_path / "ds", per_class=8, shards={"train": 1})
    local = reader.load_info(one_shard.path)
    split = local.split("train")
    remote_shards = tuple(
        dataclasses.replace(s, path="gs://bucket/ds/" + s.file) for s in split.shards
    )
    remote = dataclasses.replace(
        local,
        path="gs://bucket/ds",
        splits={**local.splits, "train": dataclasses.replace(split, shards=remote_shards)},
    )
    assert remote.files("train")[0].startswith("gs://")

    for training in (True, False):

        def read_ops(info, training=training):
            return _read_ops(reader.make_dataset(info, "train", 4, SIZE, training=training))

        assert not any("Interleave" in op for op in read_ops(local)), training
        assert any("ParallelInterleave" in op for op in read_ops(remote)), training
