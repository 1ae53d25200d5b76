"""Distinct low-texture pictures that no near-duplicate search may pair.

Flat images, gradients, stripes, simple shapes and pages of text: their
pHash carries little or nothing (a flat image's is ``0x8000000000000000``,
and so is a gradient's), so before the texture rule every one of them paired
with every other. ``cases`` draws them (Pillow only, deterministic), named by
the path each has in a test folder; ``measure`` gives each one's texture
measures and every pair the hash alone would make (``python -m
bench.near.texture``).
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from beam_pipeline.features.near import hashes as nd

SIDE = 256
INVOICE = (
    "INVOICE #1043",
    "Date: 2026-11-02",
    "",
    "Item        Qty  Price",
    "Paper A4     10  45.00",
    "Toner         2  80.00",
    "",
    "Total           125.00",
)
LETTER = (
    "Dear Mr. Brown,",
    "",
    "Thank you for your",
    "letter of last week.",
    "We will reply soon.",
    "",
    "Kind regards,",
    "Anna",
)


def _flat(grey: int) -> Image.Image:
    return Image.new("RGB", (SIDE, SIDE), (grey, grey, grey))


def _grey(values: np.ndarray) -> Image.Image:
    return Image.fromarray(values.round().astype(np.uint8)).convert("RGB")


def _page(lines: tuple[str, ...], size: tuple[int, int], font_size: int | None) -> Image.Image:
    """A white page with ``lines`` of black text at its top left (Pillow's own font)."""
    page = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=font_size) if font_size else ImageFont.load_default()
    step = (font_size or 10) + 4
    for n, line in enumerate(lines):
        draw.text((15, 20 + n * step), line, fill=(0, 0, 0), font=font)
    return page


def _shape(draw_it) -> Image.Image:
    img = _flat(255)
    draw_it(ImageDraw.Draw(img), (SIDE // 4, SIDE // 4, 3 * SIDE // 4, 3 * SIDE // 4))
    return img


def cases() -> dict[str, Image.Image]:
    """Path in a test folder (class/name.png) -> the picture (no two alike: an
    exact copy is ``--dedupe``'s, not the near search's)."""
    ramp = np.tile(np.linspace(0, 255, SIDE), (SIDE, 1))
    stripes = np.tile((np.arange(SIDE) // 32 % 2) * 255.0, (SIDE, 1))
    return {
        "pattern/grey.png": _flat(128),
        "pattern/near_black.png": _flat(12),
        "pattern/gradient_left_to_right.png": _grey(ramp),
        "pattern/gradient_top_to_bottom.png": _grey(ramp.T),
        "pattern/gradient_diagonal.png": _grey((ramp + ramp.T) / 2),
        "pattern/stripes_32px.png": _grey(stripes),
        "documents/invoice.png": _page(INVOICE, (600, 848), None),
        "documents/letter.png": _page(LETTER, (600, 848), None),
        "documents/invoice_small.png": _page(INVOICE, (400, 566), 12),
        "documents/letter_small.png": _page(LETTER, (400, 566), 12),
        "documents/blank_page.png": Image.new("RGB", (600, 848), (250, 249, 245)),
        "shapes/white.png": _flat(255),
        "shapes/black_square.png": _shape(lambda d, box: d.rectangle(box, fill=(0, 0, 0))),
        "shapes/black_circle.png": _shape(lambda d, box: d.ellipse(box, fill=(0, 0, 0))),
    }


def measure(images: dict[str, Image.Image]) -> dict:
    """Each picture's texture flag, and the pairs the hash and colour alone make
    (the rule before the texture flag): ``(a, b, distance)``."""
    prints = {name: nd.fingerprint(img) for name, img in images.items()}
    pairs = []
    for a, b in itertools.combinations(prints, 2):
        d = nd.distance(prints[a], prints[b])
        if d <= nd.THRESHOLD and nd.colours_agree(prints[a], prints[b]):
            pairs.append((a, b, d))
    return {"textured": {n: nd.textured(fp) for n, fp in prints.items()}, "hash_pairs": pairs}


if __name__ == "__main__":
    found = measure(cases())
    for name, flag in found["textured"].items():
        print(f"{name}: {'textured' if flag else 'no texture'}")
    print(f"{len(found['hash_pairs'])} pairs on the hash alone", file=sys.stderr)
