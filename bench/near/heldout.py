"""The held-out near-duplicate set: other photos, other tiles, other copies.

Kept apart from tuning: nothing in features/near/hashes.py was chosen on it.
``calibration.py`` tiles scikit-image's and matplotlib's photos; this set
tiles the photos other packages ship (scikit-learn's ``china.jpg`` and
``flower.jpg``, PyWavelets' ``aero`` and ``ascent``, imgaug's
``quokka.jpg``, mahotas' ``DepartmentStore.jpg`` and ``luispedro.jpg``),
found where they are installed (``pip install --no-deps scikit-learn
pywavelets imgaug mahotas`` is enough: only their files are read), into
non-overlapping tiles of ``TILE`` pixels (not calibration's 128), flat
ones left out as there (``calibration.MIN_STD``).

Every ``COPY_EVERY``-th tile gets one copy of a kind of ``KINDS``, most of
them the hard case: cropped by 2-10% of each side combined with a
brightness change of 3-10% (either way), then resized (Lanczos or
bilinear, 60-100%) and re-encoded (JPEG quality 40-90); and plain
re-encodes and resizes. Cached under ``bench/.cache/data/near-heldout``.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

from bench.near import calibration

RECIPE_VERSION = 2
SEED = 20261203
TILE = 96
COPY_EVERY = 1
KINDS = ("crop_brightness", "crop_brightness_resize_jpeg", "resize_jpeg", "crop_brightness")
# (package, file inside it)
SOURCES = (
    ("sklearn", "datasets/images/china.jpg"),
    ("sklearn", "datasets/images/flower.jpg"),
    ("pywt", "data/aero.npz"),
    ("pywt", "data/ascent.npz"),
    ("imgaug", "quokka.jpg"),
    ("mahotas", "demos/data/DepartmentStore.jpg"),
    ("mahotas", "demos/data/luispedro.jpg"),
)


def source_paths() -> list[Path]:
    """The photos of ``SOURCES`` that are installed (a package's spec is found,
    never imported)."""
    found = []
    for package, name in SOURCES:
        spec = importlib.util.find_spec(package)
        if spec and spec.submodule_search_locations:
            path = Path(next(iter(spec.submodule_search_locations))) / name
            if path.exists():
                found.append(path)
    return found


def _open(path: Path) -> Image.Image:
    if path.suffix == ".npz":
        with np.load(path) as data:
            return Image.fromarray(data["data"]).convert("RGB")
    with Image.open(path) as im:
        return im.convert("RGB")


def tiles() -> list[tuple[str, Image.Image]]:
    found = []
    for path in source_paths():
        photo = _open(path)
        for y in range(0, photo.height - TILE + 1, TILE):
            for x in range(0, photo.width - TILE + 1, TILE):
                tile = photo.crop((x, y, x + TILE, y + TILE))
                if np.asarray(tile.convert("L"), np.float32).std() >= calibration.MIN_STD:
                    found.append((f"{path.stem}_{x}_{y}", tile))
    return found


def transform(rng: np.random.Generator, img: Image.Image, kind: str) -> Image.Image:
    if "crop" in kind:
        w, h = img.size
        cut_w, cut_h = rng.uniform(0.02, 0.10) * w, rng.uniform(0.02, 0.10) * h
        left, top = rng.uniform(0, cut_w), rng.uniform(0, cut_h)
        img = img.crop((round(left), round(top), round(w - cut_w + left), round(h - cut_h + top)))
    if "brightness" in kind:
        sign = 1 if rng.random() < 0.5 else -1
        img = ImageEnhance.Brightness(img).enhance(1 + sign * rng.uniform(0.03, 0.10))
    if "resize" in kind:
        scale = rng.uniform(0.6, 1.0)
        resample = Image.Resampling.LANCZOS if rng.random() < 0.5 else Image.Resampling.BILINEAR
        img = img.resize((round(img.width * scale), round(img.height * scale)), resample)
    if "jpeg" in kind:
        buffer = io.BytesIO()
        img.save(buffer, "JPEG", quality=int(rng.integers(40, 91)))
        buffer.seek(0)
        with Image.open(buffer) as out:
            img = out.convert("RGB")
    return img


def _generate(out_dir: Path) -> dict:
    out_dir.mkdir(parents=True)
    originals, copies = [], []
    for index, (name, tile) in enumerate(tiles()):
        tile.save(out_dir / f"{name}.png")
        originals.append(name)
        if index % COPY_EVERY:
            continue
        kind = KINDS[(index // COPY_EVERY) % len(KINDS)]
        copy_name = f"{name}~{kind}"
        transform(np.random.default_rng([SEED, index]), tile, kind).save(
            out_dir / f"{copy_name}.png"
        )
        copies.append((copy_name, name, kind))
    return {"originals": originals, "copies": copies}


def ensure_heldout_set(cache_dir: Path) -> calibration.NearSet:
    """The cached set, generated first if missing or of another recipe."""
    wanted = {"recipe": RECIPE_VERSION, "seed": SEED, "tile": TILE, "sources": len(source_paths())}

    def check() -> None:
        if not wanted["sources"]:
            raise RuntimeError(
                "no held-out photos installed: pip install --no-deps scikit-learn ..."
            )

    return calibration.cached_set(cache_dir / "data", "near-heldout", wanted, _generate, check)
