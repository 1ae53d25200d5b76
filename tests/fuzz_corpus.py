"""A fuzzed corpus of real photos: bit flips, truncations and splices in five formats."""

from __future__ import annotations

import io
import os
import random

from PIL import Image

FORMATS = (
    ("jpg", "JPEG", {"quality": 90}),
    ("prog.jpg", "JPEG", {"quality": 85, "progressive": True}),
    ("png", "PNG", {}),
    ("webp", "WEBP", {"quality": 80}),
    ("gif", "GIF", {}),
    ("tif", "TIFF", {}),
)


def _photos() -> list[Image.Image]:
    from skimage import data  # real photographs, shipped with scikit-image

    photos = [Image.fromarray(data.astronaut()), Image.fromarray(data.chelsea())]
    photos.append(Image.fromarray(data.coffee()))
    return [p.resize((p.width // 2, p.height // 2)) for p in photos]


def _mutate(rng: random.Random, clean: bytes, donor: bytes) -> tuple[str, bytes]:
    kind = rng.choice(("flip", "flips", "truncate", "splice", "insert", "pad"))
    data = bytearray(clean)
    body = range(min(len(data) - 1, 300), len(data) - 1)  # past most headers
    if kind == "flip":
        pos = rng.choice(body)
        data[pos] ^= 1 << rng.randrange(8)
    elif kind == "flips":
        for _ in range(rng.randint(2, 20)):
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        data = data[: rng.randrange(len(data) // 4, len(data))]
    elif kind == "splice":  # a stretch of another file's bytes
        start, length = rng.choice(body), rng.randint(16, 4096)
        offset = rng.randrange(max(1, len(donor) - length))
        data[start : start + length] = donor[offset : offset + length]
    elif kind == "insert":  # junk bytes somewhere (cut-and-paste accidents, bad tools)
        pos = rng.randrange(2, len(data))
        data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    else:  # padding before the end-of-image marker, as some encoders write
        data = data[:-2] + b"\x00" * rng.randint(1, 300) + data[-2:]
    return kind, bytes(data)


def write_corpus(root: str, count: int, seed: int = 0) -> list[str]:
    """Writes ``count`` mutated files under ``root/<class>/``; returns their IDs."""
    rng = random.Random(seed)
    clean = {}
    for index, photo in enumerate(_photos()):
        for suffix, fmt, options in FORMATS:
            image = photo.convert("P") if fmt == "GIF" else photo
            buffer = io.BytesIO()
            image.save(buffer, fmt, **options)
            clean[(index, suffix)] = buffer.getvalue()
    keys = sorted(clean)
    ids = []
    for n in range(count):
        key = rng.choice(keys)
        kind, data = _mutate(rng, clean[key], clean[rng.choice(keys)])
        if n % 10 == 0:  # keep some clean ones: they must pass (or be re-encoded) untouched
            kind, data = "clean", clean[key]
        rel = f"{'abc'[n % 3]}/{n:04d}-{kind}.{key[1]}"
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as stream:
            stream.write(data)
        ids.append(rel)
    return ids
