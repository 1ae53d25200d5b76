"""Sizes of a full and a ``--quick`` run, and where things go.

Everything the benchmark generates lives under ``bench/.cache/`` (gitignored);
only ``bench/results/`` is committed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

# This module lives in bench/common/: the bench package is the folder above.
BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent
CACHE_DIR = BENCH_DIR / ".cache"
RESULTS_DIR = BENCH_DIR / "results"

# The converter's output size (docs/format.md section 4 defaults) and the reader's
# batch and image size (a typical ResNet-50 input). Every converter in the benchmark produces the
# same thing: shorter side 256, never upscaled, JPEG quality 90.
TARGET_SHORTER_SIDE = 256
JPEG_QUALITY = 90
READ_IMAGE_SIZE = 224


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much work one run does.

    Attributes:
        name: "full" or "quick"; also names the cache folders, so a quick run
            never reuses (or clobbers) the full data set.
        web_images: images in the "web" set (split evenly over 10 classes).
        phone_images: images in the "phone" set (split over 5 classes).
        read_batch_size: reader batch size (128 in a full run; smaller in a quick
            run so the tiny train split still fills a few whole batches).
        read_warmup_epochs: reader epochs run before timing (file cache, AUTOTUNE).
        read_epochs: timed reader epochs.
        timeout_s: limit for any one subprocess (a hung Beam job must not hang
            ``make bench``).
        codec_web_images, codec_phone_images: images of each set the codec
            study (``bench.convert.codecs``) converts per pass (the first ones, sorted).
    """

    name: str
    web_images: int
    phone_images: int
    read_batch_size: int
    read_warmup_epochs: int
    read_epochs: int
    timeout_s: int
    codec_web_images: int = 400
    codec_phone_images: int = 60


FULL = Sizes(
    name="full",
    web_images=2000,
    phone_images=200,
    read_batch_size=128,
    read_warmup_epochs=1,
    read_epochs=3,
    timeout_s=900,
)
QUICK = Sizes(
    name="quick",
    web_images=48,
    phone_images=6,
    read_batch_size=16,
    read_warmup_epochs=1,
    # Six epochs of 3 batches: at one, the loaders with worker processes had the whole
    # timed epoch made during the warm-up, and a round measured 0.00-2.29 CPU ms an
    # image (0.66-0.80 at six); bench.train.pipelines.batches_ahead() is their depth.
    read_epochs=6,
    timeout_s=300,
    codec_web_images=12,
    codec_phone_images=3,
)
