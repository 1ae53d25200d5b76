"""The near-duplicate calibration set: distinct real photos and known near copies of some.

The distinct photos are **non-overlapping tiles** of the real photos the
venv ships (scikit-image's and matplotlib's ``grace_hopper.jpg``): about 20
photos are too few to calibrate a false-pair rate, and random crops of them
overlap, so two "distinct" images would share pixels. Tiles share none, but
tiles of one photo share its light and texture, which makes the false-pair
count harder than a set of unrelated photos would. Flat tiles (grey standard
deviation below ``MIN_STD``: sky, black background) are left out, since two
of them are near copies by any perceptual measure. ``motorcycle_right.png``
is left out: it is the other half of a stereo pair with
``motorcycle_left.png``.

The copies, of every ``COPY_EVERY``-th tile (and a second copy of every
other one of those), cycle through ``KINDS``: resized to 50-90%, re-encoded
as JPEG at quality 50-95, cropped by up to 10% of each side's length,
brightness +-10%, and a combination of all four. Deterministic (each image
its own seeded generator) and cached under
``bench/.cache/data/near-<tag>/`` with a stamp, like ``bench/common/data.py``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

from bench.common import data

RECIPE_VERSION = 1
SEED = 20261201
TILE = 128
MIN_STD = 12.0
COPY_EVERY = 2
KINDS = ("resize", "jpeg", "crop", "brightness", "combined")
_LEFT_OUT = {
    "motorcycle_right.png",
    "logo.png",
    "text.png",
    "page.png",
    "color.png",
    "chessboard_GRAY.png",
    "chessboard_RGB.png",
    "phantom.png",
    "horse.png",
}


def _sources() -> list[Path]:
    sources = [
        p
        for p in sorted(data.skimage_data_dir().iterdir())
        if p.suffix in (".png", ".jpg") and p.name not in _LEFT_OUT
    ]
    import matplotlib  # a bench dependency already; only for the path of its sample photo

    hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    return sources + ([hopper] if hopper.exists() else [])


def tiles() -> list[tuple[str, Image.Image]]:
    """``(name, tile)`` of every non-flat, non-overlapping tile, in a fixed order."""
    found = []
    for path in _sources():
        with Image.open(path) as im:
            if im.mode not in ("RGB", "L"):
                im = im.convert("RGB")
            photo = im.copy()
        if min(photo.size) < 64:
            continue  # the small sample images are icons, not photos
        for y in range(0, photo.height - TILE + 1, TILE):
            for x in range(0, photo.width - TILE + 1, TILE):
                tile = photo.crop((x, y, x + TILE, y + TILE))
                if np.asarray(tile.convert("L"), dtype=np.float32).std() >= MIN_STD:
                    found.append((f"{path.stem}_{x}_{y}", tile.convert("RGB")))
    return found


def _jpeg(img: Image.Image, quality: int) -> Image.Image:
    buffer = io.BytesIO()
    img.save(buffer, "JPEG", quality=quality)
    buffer.seek(0)
    with Image.open(buffer) as out:
        return out.convert("RGB")


def _crop(rng: np.random.Generator, img: Image.Image) -> Image.Image:
    # Up to 10% of each side's length removed, split at random between its two ends.
    w, h = img.size
    cut_w, cut_h = rng.uniform(0.02, 0.10) * w, rng.uniform(0.02, 0.10) * h
    left, top = rng.uniform(0, cut_w), rng.uniform(0, cut_h)
    box = (round(left), round(top), round(w - (cut_w - left)), round(h - (cut_h - top)))
    return img.crop(box)


def transform(rng: np.random.Generator, img: Image.Image, kind: str) -> Image.Image:
    """One near copy of ``img`` of the given kind (see the module docstring)."""
    if kind in ("crop", "combined"):
        img = _crop(rng, img)
    if kind in ("resize", "combined"):
        scale = rng.uniform(0.5, 0.9)
        img = img.resize(
            (max(8, round(img.width * scale)), max(8, round(img.height * scale))),
            Image.Resampling.BICUBIC,
        )
    if kind in ("brightness", "combined"):
        sign = 1 if rng.random() < 0.5 else -1
        img = ImageEnhance.Brightness(img).enhance(1 + sign * rng.uniform(0.03, 0.10))
    if kind in ("jpeg", "combined"):
        img = _jpeg(img, int(rng.integers(50, 96)))
    return img


@dataclasses.dataclass(frozen=True)
class NearSet:
    """The calibration set on disk.

    Attributes:
        path: folder of PNG files.
        originals: names (file stems) of the distinct tiles.
        copies: ``(copy name, original name, kind)``.
    """

    path: Path
    originals: tuple[str, ...]
    copies: tuple[tuple[str, str, str], ...]

    def image_path(self, name: str) -> Path:
        return self.path / f"{name}.png"

    @property
    def names(self) -> list[str]:
        return list(self.originals) + [c[0] for c in self.copies]


def _generate(out_dir: Path) -> dict:
    out_dir.mkdir(parents=True)
    originals, copies = [], []
    for index, (name, tile) in enumerate(tiles()):
        tile.save(out_dir / f"{name}.png")
        originals.append(name)
        if index % COPY_EVERY:
            continue
        count = 2 if index % (2 * COPY_EVERY) == 0 else 1
        for c in range(count):
            rng = np.random.default_rng([SEED, index, c])
            kind = KINDS[(index // COPY_EVERY + 2 * c) % len(KINDS)]
            copy_name = f"{name}~{kind}{c}"
            transform(rng, tile, kind).save(out_dir / f"{copy_name}.png")
            copies.append((copy_name, name, kind))
    return {"originals": originals, "copies": copies}


def ensure_near_set(cache_dir: Path) -> NearSet:
    """The cached set, generated first if missing or of another recipe."""
    wanted = {"recipe": RECIPE_VERSION, "seed": SEED, "tile": TILE, "min_std": MIN_STD}
    return cached_set(cache_dir / "data", "near", wanted, _generate)


def cached_set(root: Path, name: str, wanted: dict, generate, check=None) -> NearSet:
    """``root/name``, generated by ``generate(folder)`` first unless its stamp
    ``root/name.json`` records ``wanted``; ``check()`` runs before generating."""
    out_dir, stamp_path = root / name, root / f"{name}.json"
    if stamp_path.exists() and out_dir.is_dir():
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("params") == wanted:
            return load_near_set(out_dir, stamp)
    if check is not None:
        check()
    tmp_dir = root / f".{name}.tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    print(f"[bench] generating the near-duplicate set in {out_dir} ...", flush=True)
    stamp = {"params": wanted, **generate(tmp_dir)}
    tmp_dir.rename(out_dir)  # a half-written set is never mistaken for a finished one
    stamp_path.write_text(json.dumps(stamp, indent=1))
    return load_near_set(out_dir, stamp)


def load_near_set(path: Path, stamp: dict) -> NearSet:
    return NearSet(
        path=path,
        originals=tuple(stamp["originals"]),
        copies=tuple(tuple(c) for c in stamp["copies"]),
    )
