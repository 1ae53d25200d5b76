"""A folder of real photos and near copies of some, across the three splits.

The copies are what a scraped or merged folder holds: the photo resized and
re-encoded, cropped and brightened, re-encoded at a low quality. The
photos are scikit-image's (tests/test_near_duplicates.py uses the same).
"""

from __future__ import annotations

import json
import os

from PIL import Image, ImageEnhance

from bench.common import data
from bench.near import calibration as near_data


def _photo(name: str) -> Image.Image:
    with Image.open(data.skimage_data_dir() / name) as im:
        return im.convert("RGB")


def _resized(im: Image.Image, scale: float) -> Image.Image:
    return im.resize((round(im.width * scale), round(im.height * scale)), Image.BICUBIC)


def _crop_brighter(im: Image.Image) -> Image.Image:
    w, h = im.size
    return ImageEnhance.Brightness(im.crop((w // 12, 0, w, h - h // 50))).enhance(1.1)


# (photo, where its original lies, [(where a copy lies, how it was made)]).
PHOTOS = (
    ("astronaut.png", "train/a", [("val/a", "small"), ("test/b", "crop")]),
    ("coffee.png", "train/a", [("val/a", "small")]),
    ("chelsea.png", "train/b", [("test/b", "crop")]),
    ("rocket.jpg", "train/a", [("train/b", "q50")]),
    ("motorcycle_left.png", "train/b", []),
    ("camera.png", "val/b", []),
)
# How each kind of copy is made, and the file type it is saved as.
COPIES = {
    "small": (lambda im: near_data._jpeg(_resized(im, 0.6), 70), "jpg"),
    "crop": (_crop_brighter, "png"),
    "q50": (lambda im: near_data._jpeg(im, 50), "jpg"),
}


def _stem(name: str) -> str:
    return name.split(".")[0]


def _copy_id(name: str, where: str, kind: str) -> str:
    return f"{where}/{_stem(name)}_{kind}.{COPIES[kind][1]}"


# Each photo with copies is one group: its original and every copy, by ID.
GROUPS = sorted(
    sorted([f"{where}/{_stem(name)}.jpg", *(_copy_id(name, w, kind) for w, kind in copies)])
    for name, where, copies in PHOTOS
    if copies
)
IMAGES = sum(1 + len(copies) for _, _, copies in PHOTOS)


def near_folder(root: str, broken: bool = False) -> str:
    """Writes the photos and their copies under ``root`` (the pre-split layout).

    ``broken``: also a file that is not an image (a rejection, for the books).
    """
    for name, where, copies in PHOTOS:
        photo = _photo(name)
        os.makedirs(os.path.join(root, where), exist_ok=True)
        photo.save(os.path.join(root, where, f"{_stem(name)}.jpg"), quality=90)
        for copy_where, kind in copies:
            os.makedirs(os.path.join(root, copy_where), exist_ok=True)
            COPIES[kind][0](photo).save(os.path.join(root, _copy_id(name, copy_where, kind)))
    if broken:
        with open(os.path.join(root, "train", "a", "broken.jpg"), "wb") as f:
            f.write(b"\xff\xd8\xff not a JPEG after all")
    return root


def near_groups(out: str) -> list[list[str]]:
    """The groups of near_duplicates.jsonl, as lists of IDs."""
    with open(os.path.join(out, "near_duplicates.jsonl")) as f:
        return [[m["id"] for m in json.loads(line)["members"]] for line in f]
