"""What each step of ``imagerecords.transforms.train_crop`` costs, and the resizes it could use.

One process, the benchmark's converted web set (``python -m bench --only
trainers`` makes it), every train record once per pass, best of ``--passes``
of CPU time (this process, all threads) per image. The windows are the
reader's, drawn once, so every row resizes the same pixels:

* ``decode``: simplejpeg, the whole image (``train_crop``'s decode, windows
  under twice the output size), and at 7/8 scale (simplejpeg's pick when asked
  for ``min_height`` alone: the non-power-of-two scales cost more than a full decode);
* resizes of the decoded window to 224 x 224: OpenCV bilinear on uint8 (what
  ``train_crop`` uses: 11-bit fixed-point weights), on float32 (TensorFlow's
  arithmetic), Pillow's bilinear
  (antialiased when it shrinks: not the reader's pixels), with and without
  ``reducing_gap``, and the same arithmetic in plain NumPy;
* ``train_crop``: the whole transform.

``python -m bench.tools.crop_costs`` prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from bench.common.settings import CACHE_DIR, FULL, READ_IMAGE_SIZE


def numpy_bilinear(window: np.ndarray, size: int) -> np.ndarray:
    """``tf.image.resize(..., "bilinear")`` in NumPy: half-pixel centres, float32, rounded."""

    def taps(length: int):
        centre = (np.arange(size, dtype=np.float32) + 0.5) * np.float32(length / size) - 0.5
        low = np.floor(centre)
        high = np.minimum(np.ceil(centre), length - 1).astype(np.intp)
        return np.maximum(low, 0).astype(np.intp), high, (centre - low)[:, None]

    y0, y1, wy = taps(window.shape[0])
    x0, x1, wx = taps(window.shape[1])
    pixels = window.astype(np.float32)
    top, bottom = pixels[y0], pixels[y1]
    top = top[:, x0] + (top[:, x1] - top[:, x0]) * wx
    bottom = bottom[:, x0] + (bottom[:, x1] - bottom[:, x0]) * wx
    out = top + (bottom - top) * wy[:, :, None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def best_ms(step: Callable[[int], object], count: int, passes: int) -> float:
    """The fastest pass's CPU milliseconds per call of ``step(i)`` for ``i < count``."""
    best = float("inf")
    for _ in range(passes):
        start = time.process_time()
        for i in range(count):
            step(i)
        best = min(best, (time.process_time() - start) / count * 1000)
    return best


def measure(records_dir, passes: int, size: int = READ_IMAGE_SIZE) -> list[tuple[str, float]]:
    import cv2
    import simplejpeg
    from PIL import Image

    from imagerecords import RecordSource
    from imagerecords import transforms as t

    source = RecordSource(str(records_dir), "train")
    records = [source[i] for i in range(len(source))]
    encoded = [r["image"] for r in records]
    rng = np.random.default_rng(0)
    shapes = [t.jpeg_shape(e) for e in encoded]
    windows = [t.random_window(*shape, rng) for shape in shapes]
    decoded = [simplejpeg.decode_jpeg(e, "RGB", fastdct=True) for e in encoded]
    crops = [
        p[w.y : w.y + w.height, w.x : w.x + w.width] for p, w in zip(decoded, windows, strict=True)
    ]
    images = [Image.fromarray(p) for p in decoded]
    boxes = [(w.x, w.y, w.x + w.width, w.y + w.height) for w in windows]
    out = (size, size)

    def cv2_float(i):
        return cv2.convertScaleAbs(cv2.resize(np.float32(crops[i]), out))

    rows = [
        ("decode: simplejpeg, whole image", lambda i: simplejpeg.decode_jpeg(encoded[i], "RGB", fastdct=True)),
        ("decode: simplejpeg, 7/8 scale (min_height = 0.85 x height)",
         lambda i: simplejpeg.decode_jpeg(encoded[i], "RGB", fastdct=True, min_height=int(0.85 * shapes[i][0]))),
        ("resize: OpenCV bilinear, uint8 (train_crop's)", lambda i: cv2.resize(crops[i], out)),
        ("resize: OpenCV bilinear, float32, rounded", cv2_float),
        ("resize: Pillow BILINEAR, box", lambda i: images[i].resize(out, Image.BILINEAR, box=boxes[i])),
        ("resize: Pillow BILINEAR, box, reducing_gap=2", lambda i: images[i].resize(out, Image.BILINEAR, box=boxes[i], reducing_gap=2.0)),
        ("resize: NumPy, the same arithmetic", lambda i: numpy_bilinear(crops[i], size)),
        ("train_crop: header, window, decode, resize, flip", lambda i: t.train_crop(records[i], rng, size)),
    ]  # fmt: skip
    return [(name, best_ms(step, len(records), passes)) for name, step in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.crop_costs", description=__doc__.splitlines()[0]
    )
    default = CACHE_DIR / "out" / FULL.name / "imagerecords" / "web"
    parser.add_argument(
        "--records", default=default, help=f"a converted dataset (default {default})"
    )
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args(argv)
    print("| step | CPU ms per image (best pass) |\n|---|---:|")
    for name, ms in measure(args.records, args.passes):
        print(f"| {name} | {ms:.3f} |")


if __name__ == "__main__":
    main()
