"""The benchmark's image sets, made from the real photos scikit-image ships.

Noise or flat colour would flatter every codec (it compresses to nothing or
costs nothing to decode), so the images are crops of real photographs with a
little sensor-like grain, which brings file sizes close to real ones.

* **web**: like Stanford Dogs / ImageNet. 10 class folders; mostly 500x375 (or
  375x500) baseline JPEGs of quality 75-95; about 3% each of PNG (a few with
  alpha), greyscale JPEG and progressive JPEG; other sizes between 320 and 640.
* **phone**: 5 class folders of 6-8 MP JPEGs (3000x2000, 2816x2112, 3264x2448),
  quality 88-95, stored landscape with an EXIF orientation tag like a phone
  camera writes (about a third say "rotate").

Generation is deterministic (every image has its own seeded generator, so the
pool's scheduling cannot change a byte), runs once, and is cached under
``bench/.cache/data/<set>-<size>/`` with a stamp file next to it; a changed
recipe (``RECIPE_VERSION``) or size regenerates it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import multiprocessing
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

RECIPE_VERSION = 1
SEED = 20240605

# class name -> source photos in skimage/data. Two classes come from greyscale
# photos (converted to RGB), as datasets often hold some near-grey images.
WEB_CLASSES: dict[str, tuple[str, ...]] = {
    "astronaut": ("astronaut.png",),
    "camera": ("camera.png",),
    "cat": ("chelsea.png",),
    "coffee": ("coffee.png",),
    "coins": ("coins.png", "moon.png"),
    "galaxy": ("hubble_deep_field.jpg",),
    "motorcycle": ("motorcycle_left.png", "motorcycle_right.png"),
    "retina": ("retina.jpg",),
    "rocket": ("rocket.jpg",),
    "tissue": ("ihc.png",),
}
PHONE_CLASSES: dict[str, tuple[str, ...]] = {
    "astronaut": ("astronaut.png",),
    "coffee": ("coffee.png",),
    "galaxy": ("hubble_deep_field.jpg",),
    "motorcycle": ("motorcycle_left.png", "motorcycle_right.png"),
    "retina": ("retina.jpg",),
}
PHONE_SIZES = ((3000, 2000), (3000, 2000), (3000, 2000), (2816, 2112), (3264, 2448))
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")

_NOISE_FIELD_SHAPE = (2600, 3400, 3)  # covers the largest phone image plus room to move


@dataclasses.dataclass(frozen=True)
class ImageSet:
    """A generated image set on disk.

    Attributes:
        name: "web" or "phone".
        path: folder with one sub-folder per class.
        num_images: number of image files.
        num_bytes: their total size (the "MB/s of input" denominator).
        megapixels: mean megapixels per image.
        formats: counts per kind, e.g. {"jpeg": 1820, "png": 60, ...}.
    """

    name: str
    path: Path
    num_images: int
    num_bytes: int
    megapixels: float
    formats: dict[str, int]


def list_images(root: Path) -> list[Path]:
    """All image files under ``root/<class>/``, sorted, hidden entries skipped."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS):
                files.append(Path(dirpath) / name)
    return files


def skimage_data_dir() -> Path:
    """Where scikit-image keeps its bundled photos (found without importing it)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "scikit-image is needed for the benchmark's photos: pip install -e .[bench]"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "data"


_SOURCES: dict[str, Image.Image] = {}
_NOISE: np.ndarray | None = None


def _source(name: str) -> Image.Image:
    # Cached per worker process: decoding the sources for every image would
    # dominate generation time.
    if name not in _SOURCES:
        with Image.open(skimage_data_dir() / name) as im:
            _SOURCES[name] = im.convert("RGB")
    return _SOURCES[name]


def _noise_field() -> np.ndarray:
    # One int8 Gaussian field per process, seeded identically everywhere, from
    # which every phone image takes a window at its own random offset: drawing
    # 20 M fresh normals per 6 MP image would triple the generation time.
    global _NOISE
    if _NOISE is None:
        rng = np.random.default_rng(SEED)
        field = rng.normal(0.0, 4.0, size=_NOISE_FIELD_SHAPE).round()
        _NOISE = np.clip(field, -127, 127).astype(np.int8)
    return _NOISE


def _random_crop(rng: np.random.Generator, src: Image.Image, out_size, min_area: float):
    """Resizes a random crop of ``src`` with the aspect ratio of ``out_size``."""
    width, height = src.size
    aspect = out_size[0] / out_size[1]
    area = rng.uniform(min_area, 1.0) * width * height
    crop_w = min(width, (area * aspect) ** 0.5)
    crop_h = min(height, crop_w / aspect)
    crop_w = crop_h * aspect
    # max(0, ...): float rounding can make the crop a hair wider than the source.
    x0 = rng.uniform(0, max(0.0, width - crop_w))
    y0 = rng.uniform(0, max(0.0, height - crop_h))
    box = (x0, y0, x0 + crop_w, y0 + crop_h)
    return src.resize(out_size, Image.Resampling.BICUBIC, box=box)


def _jitter(rng: np.random.Generator, img: Image.Image) -> Image.Image:
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    for enhancer in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        img = enhancer(img).enhance(rng.uniform(0.8, 1.2))
    return img


def _add_grain(img: Image.Image, noise: np.ndarray) -> Image.Image:
    arr = np.asarray(img, dtype=np.int16) + noise
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _web_size(rng: np.random.Generator) -> tuple[int, int]:
    r = rng.random()
    if r < 0.6:
        return (500, 375)
    if r < 0.8:
        return (375, 500)
    longer = int(rng.integers(320, 641))
    shorter = int(longer * rng.uniform(0.6, 1.0))
    return (longer, shorter) if rng.random() < 0.7 else (shorter, longer)


def _make_web(task):
    index, class_name, out_dir = task
    rng = np.random.default_rng([SEED, 1, index])
    sources = WEB_CLASSES[class_name]
    src = _source(sources[int(rng.integers(len(sources)))])
    img = _jitter(rng, _random_crop(rng, src, _web_size(rng), min_area=0.3))
    sigma = rng.uniform(1.0, 3.5)
    img = _add_grain(img, rng.normal(0.0, sigma, size=(img.height, img.width, 3)).round())

    kind = rng.random()
    quality = int(rng.integers(75, 96))
    stem = Path(out_dir) / class_name / f"{class_name}_{index:05d}"
    if kind < 0.03:
        if rng.random() < 0.3:  # some PNGs carry alpha, which must be composited onto white
            alpha = Image.linear_gradient("L").resize(img.size)
            img = img.convert("RGBA")
            img.putalpha(alpha)
        img.save(stem.with_suffix(".png"), optimize=False)
        return "png"
    suffix = ".JPEG" if rng.random() < 0.1 else ".jpg"  # ImageNet spells it .JPEG
    if kind < 0.06:
        img.convert("L").save(stem.with_suffix(suffix), quality=quality)
        return "jpeg-grey"
    if kind < 0.09:
        img.save(stem.with_suffix(suffix), quality=quality, progressive=True)
        return "jpeg-progressive"
    img.save(stem.with_suffix(suffix), quality=quality)
    return "jpeg"


def _make_phone(task):
    index, class_name, out_dir = task
    rng = np.random.default_rng([SEED, 2, index])
    sources = PHONE_CLASSES[class_name]
    src = _source(sources[int(rng.integers(len(sources)))])
    width, height = PHONE_SIZES[int(rng.integers(len(PHONE_SIZES)))]
    img = _jitter(rng, _random_crop(rng, src, (width, height), min_area=0.5))
    field = _noise_field()
    y0 = int(rng.integers(field.shape[0] - height + 1))
    x0 = int(rng.integers(field.shape[1] - width + 1))
    img = _add_grain(img, field[y0 : y0 + height, x0 : x0 + width])

    r = rng.random()
    orientation = 6 if r < 0.25 else 8 if r < 0.30 else 3 if r < 0.35 else 1
    exif = Image.Exif()
    exif[0x010F] = "BenchCam"  # Make
    exif[0x0112] = orientation  # Orientation
    path = Path(out_dir) / class_name / f"IMG_{index:05d}.jpg"
    img.save(path, quality=int(rng.integers(88, 96)), exif=exif.tobytes())
    return "jpeg-exif-rotated" if orientation != 1 else "jpeg"


def _classes_for(name: str) -> dict[str, tuple[str, ...]]:
    return {"web": WEB_CLASSES, "phone": PHONE_CLASSES}[name]


def _generate(name: str, count: int, out_dir: Path, processes: int) -> dict[str, int]:
    classes = sorted(_classes_for(name))
    for class_name in classes:
        (out_dir / class_name).mkdir(parents=True, exist_ok=True)
    tasks = [(i, classes[i % len(classes)], str(out_dir)) for i in range(count)]
    worker = _make_web if name == "web" else _make_phone
    formats: dict[str, int] = {}
    # Fresh processes (spawn) keep each worker's memory to its own sources.
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        for kind in pool.imap_unordered(worker, tasks, chunksize=4):
            formats[kind] = formats.get(kind, 0) + 1
    return dict(sorted(formats.items()))


def ensure_image_set(name: str, count: int, cache_dir: Path, tag: str) -> ImageSet:
    """Returns the cached image set, generating it first if needed.

    Args:
        name: "web" or "phone".
        count: number of images.
        cache_dir: the benchmark cache (``bench/.cache``).
        tag: size tag ("full" or "quick") so differently sized sets coexist.

    Returns:
        The set's description.
    """
    root = cache_dir / "data"
    out_dir = root / f"{name}-{tag}"
    stamp_path = root / f"{name}-{tag}.json"
    wanted = {"recipe": RECIPE_VERSION, "seed": SEED, "count": count}
    if stamp_path.exists() and out_dir.is_dir():
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("params") == wanted:
            return _image_set(name, out_dir, stamp)

    tmp_dir = root / f".{name}-{tag}.tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    processes = max(1, min(os.cpu_count() or 1, 4))
    print(f"[bench] generating the {name} set ({count} images) in {out_dir} ...", flush=True)
    formats = _generate(name, count, tmp_dir, processes)
    tmp_dir.rename(out_dir)  # a half-written set is never mistaken for a finished one
    files = list_images(out_dir)
    pixels = 0
    for path in files:
        with Image.open(path) as im:
            pixels += im.width * im.height
    stamp = {
        "params": wanted,
        "num_images": len(files),
        "num_bytes": sum(p.stat().st_size for p in files),
        "megapixels": pixels / len(files) / 1e6,
        "formats": formats,
    }
    stamp_path.write_text(json.dumps(stamp, indent=1))
    return _image_set(name, out_dir, stamp)


def _image_set(name: str, path: Path, stamp: dict) -> ImageSet:
    return ImageSet(
        name=name,
        path=path,
        num_images=stamp["num_images"],
        num_bytes=stamp["num_bytes"],
        megapixels=stamp["megapixels"],
        formats=stamp["formats"],
    )
