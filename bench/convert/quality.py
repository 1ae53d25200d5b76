"""How sharp a converter's output is: the quality figure printed next to its speed.

Each stored JPEG is decoded and compared with a reference made from the same
source by Pillow at its best (full decode, no draft, EXIF orientation, alpha on
white, Lanczos straight to the stored size): median PSNR (dB) and median SSIM
over the first JPEG sources of the set (non-JPEG sources are the same in every
path and would only dilute the difference).

Where the stored JPEGs come from:

* the codec floor writes nothing, so its exact operations
  (``bench.convert.imageops.convert_to_jpeg``) are run again here on the sample;
* the naive loop and imagerecords write TFRecords whose ``image/filename`` is
  the source's path relative to the input folder; they are read with
  ``imagerecords.codec`` (no TensorFlow).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from bench.common.data import ImageSet, list_images

SAMPLE_IMAGES = 100
_JPEG_MAGIC = b"\xff\xd8\xff"


def reference(path: Path, size: tuple[int, int]) -> np.ndarray:
    """The source at its best: full decode, upright, RGB on white, Lanczos to ``size``."""
    with Image.open(path) as image:
        image = ImageOps.exif_transpose(image)
        if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
            rgba = image.convert("RGBA")
            image = Image.new("RGB", rgba.size, (255, 255, 255))
            image.paste(rgba, mask=rgba.getchannel("A"))
        image = image.convert("RGB").resize(size, Image.Resampling.LANCZOS)
        return np.asarray(image, dtype=np.float64)


def psnr(reference: np.ndarray, test: np.ndarray) -> float:
    """PSNR in dB of two same-shape 0..255 arrays (inf when identical)."""
    mse = float(np.mean((reference.astype(np.float64) - test.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def sample_sources(image_set: ImageSet, limit: int = SAMPLE_IMAGES) -> list[Path]:
    """The first ``limit`` JPEG sources of the set, in the benchmark's file order."""
    found = []
    for path in list_images(image_set.path):
        with open(path, "rb") as f:
            if f.read(3) == _JPEG_MAGIC:
                found.append(path)
        if len(found) == limit:
            break
    return found


def median_quality(pairs, cache: dict | None = None) -> tuple[float, float]:
    """(median PSNR, median SSIM) of ``(source path, stored JPEG bytes)`` pairs.

    Args:
        pairs: Iterable of (source file, the converter's JPEG for it).
        cache: Optional dict keeping references between calls (keyed by source
            and size), so several converters of one set decode each source once.

    Returns:
        The medians; NaN for both when there are no pairs.
    """
    import io

    from skimage.metrics import structural_similarity

    cache = {} if cache is None else cache
    psnrs, ssims = [], []
    for source, stored in pairs:
        with Image.open(io.BytesIO(stored)) as image:
            test = np.asarray(image.convert("RGB"), dtype=np.float64)
        key = (source, test.shape)
        if key not in cache:
            cache[key] = reference(source, (test.shape[1], test.shape[0]))
        ref = cache[key]
        psnrs.append(psnr(ref, test))
        ssims.append(structural_similarity(ref, test, channel_axis=2, data_range=255.0))
    if not psnrs:
        return float("nan"), float("nan")
    return statistics.median(psnrs), statistics.median(ssims)


def stored_jpegs(out_dir: Path, names: set[str]) -> dict[str, bytes]:
    """``image/filename`` -> ``image/encoded`` for the wanted names, from every TFRecord file.

    Raises:
        ValueError: a file under ``out_dir`` named like a TFRecord is not one.
    """
    from imagerecords import codec

    found: dict[str, bytes] = {}
    for path in sorted(out_dir.glob("*.tfrecord*")):
        with open(path, "rb") as stream:
            for data in codec.iter_records(stream):
                example = codec.parse_example(data)
                name = example.get("image/filename", b"").decode("utf-8")
                if name in names:
                    found[name] = example["image/encoded"]
    return found


def converter_quality(
    converter: str, image_set: ImageSet, out_dir: Path | None, cache: dict | None = None
) -> tuple[float, float]:
    """(median PSNR, median SSIM) of one converter's output on the sample of ``image_set``.

    Args:
        converter: "floor", "naive", "imagerecords" or "imagerecords_beam" (``bench.convert.converters.CONVERTERS``).
        image_set: The input set.
        out_dir: Where the converter wrote its TFRecords (unused for the floor).
        cache: See :func:`median_quality`.

    Returns:
        The medians, or NaN when no sampled image is found in the output.
    """
    sources = sample_sources(image_set)
    if converter == "floor":
        from bench.convert.imageops import convert_to_jpeg

        pairs = [(s, convert_to_jpeg(s.read_bytes())) for s in sources]
        return median_quality(pairs, cache)
    if out_dir is None or not out_dir.is_dir():
        return float("nan"), float("nan")
    names = {str(s.relative_to(image_set.path)): s for s in sources}
    stored = stored_jpegs(out_dir, set(names))
    return median_quality([(names[n], data) for n, data in sorted(stored.items())], cache)
