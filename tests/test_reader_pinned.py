"""The reader's batches, pinned: a digest of the first batches of each decode path.

The digests were computed before the decode paths moved into
``reader.parser.Parser`` and must not move with any refactor or speed-up: a
seeded pipeline gives the same bytes, whichever path (native op, stock ops,
decoded cache, decode before batching) and whichever output dtype. A change
that is *meant* to change pixels updates them here, says so in its commit
and in docs/reader.md.

The digests depend on the JPEG bytes of the fixture (Pillow's encoder) and on
TensorFlow's decoder and kernels, so they are pinned per TensorFlow version and
per fixture digest; elsewhere the test skips and says how to pin the new ones
(``python -m tests.test_reader_pinned`` prints them).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

import reader
from tests.shard_fixtures import write_dataset

pytestmark = pytest.mark.e2e

SIZE = (40, 48)  # not square: a swapped height and width would show (mostly upscaling)
BATCH = 8
BATCHES = 3

# name -> (split, make_dataset keywords). Training is seeded and deterministic.
_TRAIN = dict(training=True, seed=7, deterministic=True)
_EVAL = dict(training=False)
CASES = {
    "train-f32-native": ("train", dict(_TRAIN, native_ops=True)),
    "train-f32-stock": ("train", dict(_TRAIN, native_ops=False)),
    "train-u8-native": ("train", dict(_TRAIN, native_ops=True, dtype=tf.uint8)),
    "train-u8-stock": ("train", dict(_TRAIN, native_ops=False, dtype=tf.uint8)),
    "train-bf16-imagenet-onehot-dict": (
        "train",
        dict(_TRAIN, dtype=tf.bfloat16, value_range="imagenet", one_hot=True, return_dict=True),
    ),
    "train-noflip-narrow": (
        "train",
        dict(_TRAIN, horizontal_flip=False, crop_area_range=(0.3, 0.6)),
    ),
    "train-flip-only": ("train", dict(_TRAIN, random_crop=False, native_ops=False)),
    "train-flip-only-native": ("train", dict(_TRAIN, random_crop=False, native_ops=True)),
    "train-bicubic": ("train", dict(_TRAIN, resize_method="bicubic")),
    "train-decode-before-batching": ("train", dict(_TRAIN, decode_before_batching=True)),
    "train-cache-decoded-native": ("train", dict(_TRAIN, cache="decoded", native_ops=True)),
    "train-cache-decoded-stock": ("train", dict(_TRAIN, cache="decoded", native_ops=False)),
    "train-small-native": ("train", dict(_TRAIN, native_ops=True, image_size=(16, 20))),
    "train-small-u8-stock": (
        "train",
        dict(_TRAIN, native_ops=False, image_size=(16, 20), dtype=tf.uint8),
    ),
    "eval-small-native": ("val", dict(_EVAL, native_ops=True, image_size=(16, 20))),
    "eval-f32-native": ("val", dict(_EVAL, native_ops=True)),
    "eval-f32-stock": ("val", dict(_EVAL, native_ops=False)),
    "eval-u8-native": ("val", dict(_EVAL, native_ops=True, dtype=tf.uint8)),
    "eval-u8-stock": ("val", dict(_EVAL, native_ops=False, dtype=tf.uint8)),
    "eval-resize-native": ("val", dict(_EVAL, eval_crop="resize", native_ops=True)),
    "eval-resize-stock": ("val", dict(_EVAL, eval_crop="resize", native_ops=False)),
    "eval-fraction-0_1": ("val", dict(_EVAL, center_crop_fraction=0.6, value_range="0_1")),
    "eval-pad-dict": ("val", dict(_EVAL, pad_to_batch=True, return_dict=True)),
    "eval-cache-decoded-native": ("val", dict(_EVAL, cache="decoded", native_ops=True)),
    "eval-cache-decoded-stock": ("val", dict(_EVAL, cache="decoded", native_ops=False)),
}

# TensorFlow version -> (fixture digest, {case: digest of its first batches}). The fixture
# digest moves with the near scheme too: every record stores its fingerprint.
PINNED = {
    "2.21.0": (
        "d1e3a2c14a28589d",
        {
            "eval-cache-decoded-native": "a714ce3f0cb6fe6b",
            "eval-cache-decoded-stock": "a714ce3f0cb6fe6b",
            "eval-f32-native": "a714ce3f0cb6fe6b",
            "eval-f32-stock": "a714ce3f0cb6fe6b",
            "eval-fraction-0_1": "8d041eabad2d0334",
            "eval-pad-dict": "8d0287593ab6f365",
            "eval-resize-native": "ddcf8ad9066329a3",
            "eval-resize-stock": "ddcf8ad9066329a3",
            "eval-small-native": "c11ad5a269d8a2ce",
            "eval-u8-native": "6a17b5cd8f9b8d02",
            "eval-u8-stock": "6a17b5cd8f9b8d02",
            "train-bf16-imagenet-onehot-dict": "e28c3d4c5e3b320d",
            "train-bicubic": "c99c9fb698301dda",
            "train-cache-decoded-native": "bf56103e70dac95d",
            "train-cache-decoded-stock": "bf56103e70dac95d",
            "train-decode-before-batching": "5afa9866deb7ec8e",
            "train-f32-native": "7946c639d7b457e9",
            "train-f32-stock": "7946c639d7b457e9",
            "train-flip-only": "45fda70409588693",
            "train-flip-only-native": "45fda70409588693",
            "train-noflip-narrow": "1c149c8ce92b3ad6",
            "train-small-native": "9e1f9cf72a418007",
            "train-small-u8-stock": "18950661b821bb6b",
            "train-u8-native": "754a5a6ce77d8435",
            "train-u8-stock": "754a5a6ce77d8435",
        },
    ),
}


def write_fixture(path) -> str:
    """The pinned dataset; returns a digest of its shard files (the JPEG bytes)."""
    data = write_dataset(path, per_class=16, min_side=24, max_side=120, seed=3)
    digest = hashlib.sha256()
    for shard in sorted(os.listdir(data.path)):
        if shard.endswith(".tfrecord"):
            with open(os.path.join(data.path, shard), "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:16]


def batches_digest(path: str, split: str, kwargs: dict) -> str:
    """sha256 of the first ``BATCHES`` batches: every tensor's dtype, shape and bytes."""
    kwargs = dict(kwargs)
    size = kwargs.pop("image_size", SIZE)
    ds = reader.make_dataset(path, split, BATCH, size, **kwargs)
    digest = hashlib.sha256()
    for batch in ds.take(BATCHES):
        for tensor in tf.nest.flatten(batch):
            array = tensor.numpy()
            digest.update(f"{array.dtype}{array.shape}".encode())
            if array.dtype == object:  # strings: their bytes, not the object pointers
                digest.update(b"\0".join(array.reshape(-1).tolist()))
            else:
                digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    if tf.__version__ not in PINNED:
        pytest.skip(f"digests are pinned for TensorFlow {sorted(PINNED)}, not {tf.__version__}")
    path = tmp_path_factory.mktemp("pinned") / "ds"
    fixture_digest = write_fixture(path)
    want_fixture, digests = PINNED[tf.__version__]
    if fixture_digest != want_fixture:
        pytest.skip(f"the fixture's JPEG bytes differ here (Pillow's encoder): {fixture_digest}")
    return str(path), digests


@pytest.mark.parametrize("case", sorted(CASES))
def test_batches_are_the_pinned_ones(pinned, case):
    split, kwargs = CASES[case]
    if kwargs.get("native_ops") and shutil.which(os.environ.get("CXX") or "c++") is None:
        pytest.skip("no C++ compiler: the native op cannot be built here")
    path, digests = pinned
    assert batches_digest(path, split, kwargs) == digests[case]


def main(out_dir: str) -> None:
    """Prints the ``PINNED`` entry for this TensorFlow (run on the commit that pins them)."""
    fixture_digest = write_fixture(os.path.join(out_dir, "ds"))
    path = os.path.join(out_dir, "ds")
    print(f'    "{tf.__version__}": (\n        "{fixture_digest}",\n        {{')
    for case in sorted(CASES):
        split, kwargs = CASES[case]
        print(f'            "{case}": "{batches_digest(path, split, kwargs)}",')
    print("        },\n    ),")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        main(sys.argv[1] if len(sys.argv) > 1 else tmp)
