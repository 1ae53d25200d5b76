"""Converter baseline (b), the tutorial loop: ``python -m bench.convert.naive --input D --output O``.

What most "images to TFRecord" tutorials teach, made correct (EXIF
orientation, any mode to RGB) but otherwise left as written: one Python
process, files shuffled in memory, then for each file
``ImageOps.exif_transpose(Image.open(path)).convert("RGB")`` -> ``resize``
(shorter side 256, bicubic, no upscale; *no* ``Image.draft``) -> JPEG quality 90
into a ``BytesIO`` -> ``tf.train.Example`` -> ``tf.io.TFRecordWriter``, one
output file. Transparent images are not composited onto white (``convert``
drops alpha), as in the tutorials.

Prints one JSON line like ``bench.convert.floor``.
"""

from __future__ import annotations

import argparse
import io
import random
import time
from pathlib import Path

from PIL import Image, ImageOps

from bench.common.data import list_images
from bench.common.settings import JPEG_QUALITY, TARGET_SHORTER_SIDE
from bench.convert.converters import print_work_summary
from bench.convert.imageops import shorter_side_size


def main(argv: list[str] | None = None) -> None:
    """Runs the naive loop over ``--input`` and prints its JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args(argv)

    import tensorflow as tf  # inside main: the import (seconds) is part of the measured run

    def bytes_feature(value: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def int64_feature(value: int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    files = list_images(args.input)
    classes = sorted({p.relative_to(args.input).parts[0] for p in files})
    random.Random(42).shuffle(files)
    args.output.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    in_bytes = out_bytes = 0
    with tf.io.TFRecordWriter(str(args.output / "train.tfrecord")) as writer:
        for path in files:
            in_bytes += path.stat().st_size
            image = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
            size = shorter_side_size(image.width, image.height, TARGET_SHORTER_SIDE)
            if size != image.size:
                image = image.resize(size, Image.Resampling.BICUBIC)
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
            encoded = buffer.getvalue()
            out_bytes += len(encoded)
            class_name = path.relative_to(args.input).parts[0]
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image/encoded": bytes_feature(encoded),
                        "image/format": bytes_feature(b"jpeg"),
                        "image/height": int64_feature(image.height),
                        "image/width": int64_feature(image.width),
                        "image/class/label": int64_feature(classes.index(class_name)),
                        "image/class/text": bytes_feature(class_name.encode()),
                        "image/filename": bytes_feature(str(path.relative_to(args.input)).encode()),
                    }
                )
            )
            writer.write(example.SerializeToString())
    work_s = time.perf_counter() - start
    print_work_summary(len(files), in_bytes, out_bytes, work_s, 1)


if __name__ == "__main__":
    main()
