"""Builds small image-folder datasets for the converter's tests.

Images are synthetic but structured (gradients plus a class-specific shape) so
JPEG sizes vary like photos do; they are generated in-process in milliseconds.
"""

from __future__ import annotations

import io
import os
import random

from PIL import Image, ImageDraw

COLOURS = [(200, 40, 40), (40, 160, 60), (50, 80, 200), (220, 200, 40), (150, 60, 180)]


def photo(width: int, height: int, seed: int, colour=(200, 40, 40)) -> Image.Image:
    rng = random.Random(seed)
    image = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1, y1 = x0 + rng.randrange(5, width // 2 + 6), y0 + rng.randrange(5, height // 2 + 6)
        fill = tuple(max(0, min(255, c + rng.randint(-40, 40))) for c in colour)
        draw.ellipse((x0, y0, x1, y1), fill=fill)
    return image


def jpeg_bytes(image: Image.Image, quality: int = 85, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality, **kwargs)
    return buffer.getvalue()


def make_class_folders(
    root: str,
    classes=("cat", "dog", "fish"),
    per_class: int = 20,
    seed: int = 0,
    nested: bool = True,
    size_range=(80, 320),
) -> list[str]:
    """Writes ``root/<class>/[sub/]<n>.jpg``; returns the IDs (relative paths) written."""
    rng = random.Random(seed)
    ids = []
    for index, name in enumerate(classes):
        for n in range(per_class):
            sub = f"batch{n % 2}/" if nested and n % 3 == 0 else ""
            rel = f"{name}/{sub}{name}_{n:04d}.jpg"
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            w, h = rng.randint(*size_range), rng.randint(*size_range)
            image = photo(w, h, seed=rng.randrange(1 << 30), colour=COLOURS[index % len(COLOURS)])
            with open(path, "wb") as f:
                f.write(jpeg_bytes(image))
            ids.append(rel)
    return ids


def add_bad_files(root: str, class_name: str = "cat") -> dict[str, str]:
    """A corrupt JPEG and a non-image file; returns ``{id: expected reason prefix}``."""
    folder = os.path.join(root, class_name)
    os.makedirs(folder, exist_ok=True)
    good = jpeg_bytes(photo(120, 90, seed=1))
    with open(os.path.join(folder, "truncated.jpg"), "wb") as f:
        f.write(good[: len(good) // 2])
    with open(os.path.join(folder, "notes.dat"), "w") as f:
        f.write("not an image\n")
    return {
        f"{class_name}/truncated.jpg": "corrupt image data",
        f"{class_name}/notes.dat": "not an image",
    }
