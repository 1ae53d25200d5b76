"""``reader.inspect``'s pictures: a contact sheet of random records, and a class histogram.

Pillow is imported only when a picture is drawn (:func:`pillow`), so
``import reader`` and ``import reader.inspect`` do not load it.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import math
import random
from collections.abc import Sequence

import tensorflow as tf

from reader import info as info_lib
from reader import shard_file
from reader.shard_file import ShardReadError

TILE = 128
CAPTION = 18
PAD = 6
HEADER = 24
BACKGROUND = (24, 24, 28)
TEXT = (235, 235, 235)
SPLIT_COLOURS = ((66, 133, 244), (244, 160, 0), (15, 157, 88), (219, 68, 55), (171, 71, 188))


@dataclasses.dataclass(frozen=True)
class Tile:
    """One image on the contact sheet and where it was drawn."""

    split: str
    filename: str
    class_name: str
    box: tuple[int, int, int, int]  # left, top, right, bottom of the pasted image


class PillowMissingError(ImportError):
    """Pillow is not installed, so no picture can be drawn."""


def pillow():
    """Pillow's ``(Image, ImageDraw, ImageFont)``; :class:`PillowMissingError` without it."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise PillowMissingError("pictures need Pillow: pip install pillow") from None
    return Image, ImageDraw, ImageFont


def _font(size: int):
    _, _, ImageFont = pillow()
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed bitmap font
        return ImageFont.load_default()


def draw_samples(
    info: info_lib.DatasetInfo, split: str, count: int, rng: random.Random
) -> list[tuple[str, str, bytes]]:
    """``count`` records of ``split`` drawn uniformly: ``(filename, class, jpeg)``."""
    entry = info.split(split)
    picks = sorted(rng.sample(range(entry.num_examples), min(count, entry.num_examples)))
    by_shard: dict[int, set[int]] = collections.defaultdict(set)
    starts, total = [], 0
    for shard in entry.shards:
        starts.append(total)
        total += shard.num_examples or 0
    for pick in picks:
        shard = max(i for i, start in enumerate(starts) if start <= pick)
        by_shard[shard].add(pick - starts[shard])
    out = []
    keys = ("image/filename", "image/class/text", "image/encoded")
    for shard_index, wanted in sorted(by_shard.items()):
        shard = entry.shards[shard_index]
        try:
            for index, data in shard_file.walk_records(shard.path, wanted):
                example = shard_file.parse_example(data, f"record {index}")
                filename, text, jpeg = (shard_file.feature(example, key) for key in keys)
                if None in (filename, text, jpeg):
                    raise ShardReadError(f"record {index}: missing one of {', '.join(keys)}")
                out.append(
                    (filename.decode("utf-8", "replace"), text.decode("utf-8", "replace"), jpeg)
                )
        except ShardReadError as error:
            raise ShardReadError(f"{shard.file}: {error}") from None
    return out


def contact_sheet(
    info: info_lib.DatasetInfo,
    out_file: str,
    splits: Sequence[str],
    samples: int,
    seed: int,
    columns: int = 8,
    tile: int = TILE,
) -> list[Tile]:
    """Draws ``samples`` random records of each split, captioned with their class.

    Each image is shrunk to fit a ``tile`` x ``tile`` square (never enlarged).

    Returns:
        The tiles, in drawing order, with the box each image was pasted in.
    """
    sheet, tiles = draw_contact_sheet(info, splits, samples, seed, columns, tile)
    _save_png(sheet, out_file)
    return tiles


def draw_contact_sheet(
    info: info_lib.DatasetInfo,
    splits: Sequence[str],
    samples: int,
    seed: int,
    columns: int = 8,
    tile: int = TILE,
):
    """:func:`contact_sheet`'s picture, not saved: ``(PIL image, tiles)``."""
    Image, ImageDraw, _ = pillow()
    rng = random.Random(seed)
    drawn = {split: draw_samples(info, split, samples, rng) for split in splits}
    columns = max(1, min(columns, max(len(d) for d in drawn.values()) or 1))
    cell_w, cell_h = tile + PAD, tile + CAPTION + PAD
    width = PAD + columns * cell_w
    height = sum(HEADER + max(1, math.ceil(len(d) / columns)) * cell_h for d in drawn.values())
    sheet = Image.new("RGB", (width, height + PAD), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    title, caption = _font(15), _font(12)
    tiles, top = [], 0
    for split, records in drawn.items():
        draw.text(
            (PAD, top + 4),
            f"{split}: {len(records)} of {info.num_examples(split):,} records",
            fill=TEXT,
            font=title,
        )
        top += HEADER
        for i, (filename, class_name, jpeg) in enumerate(records):
            row, col = divmod(i, columns)
            x, y = PAD + col * cell_w, top + row * cell_h
            try:
                image = Image.open(io.BytesIO(jpeg)).convert("RGB")
            except OSError as error:  # PIL's UnidentifiedImageError is one
                raise ShardReadError(f"{filename}: the image does not decode ({error})") from None
            image.thumbnail((tile, tile), Image.Resampling.BICUBIC)
            left, upper = x + (tile - image.width) // 2, y + (tile - image.height) // 2
            sheet.paste(image, (left, upper))
            label = class_name if len(class_name) <= 20 else class_name[:19] + "…"
            draw.text((x + 2, y + tile + 2), label, fill=TEXT, font=caption)
            box = (left, upper, left + image.width, upper + image.height)
            tiles.append(Tile(split, filename, class_name, box))
        top += max(1, math.ceil(len(records) / columns)) * cell_h
    return sheet, tiles


HISTOGRAM_WIDTH = 900
_BAR = 12
_MAX_CLASSES_DRAWN = 60


@dataclasses.dataclass(frozen=True)
class Bar:
    split: str
    class_name: str
    count: int
    box: tuple[int, int, int, int]


def histogram(info: info_lib.DatasetInfo, out_file: str, splits: Sequence[str]) -> list[Bar]:
    """Class counts per split as grouped horizontal bars (the largest and
    smallest classes only, when there are too many to draw)."""
    Image, ImageDraw, _ = pillow()
    classes = list(info.classes)
    skipped = 0
    if len(classes) > _MAX_CLASSES_DRAWN:
        total = {c: sum(info.class_counts(s).get(c, 0) for s in splits) for c in classes}
        ranked = sorted(classes, key=lambda c: (-total[c], c))
        half = _MAX_CLASSES_DRAWN // 2
        skipped = len(classes) - 2 * half
        classes = ranked[:half] + ranked[-half:]
    font, title = _font(12), _font(15)
    label_w = min(220, 12 + 7 * max(len(c) for c in classes))
    group_h = _BAR * len(splits) + 8
    legend_h = 24
    height = HEADER + legend_h + group_h * len(classes) + (group_h if skipped else 0) + PAD
    image = Image.new("RGB", (HISTOGRAM_WIDTH, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    draw.text(
        (PAD, 4),
        f"class counts per split ({info.num_classes} classes"
        + (f"; the {len(classes) // 2} largest and smallest)" if skipped else ")"),
        fill=(0, 0, 0),
        font=title,
    )
    x = PAD
    for i, split in enumerate(splits):
        colour = SPLIT_COLOURS[i % len(SPLIT_COLOURS)]
        draw.rectangle((x, HEADER + 4, x + 12, HEADER + 16), fill=colour)
        draw.text((x + 16, HEADER + 3), split, fill=(0, 0, 0), font=font)
        x += 30 + 8 * len(split)
    longest = max([1, *(info.class_counts(s).get(c, 0) for s in splits for c in classes)])
    bar_space = HISTOGRAM_WIDTH - label_w - 70
    bars, y = [], HEADER + legend_h
    for n, name in enumerate(classes):
        if skipped and n == len(classes) // 2:
            draw.text(
                (PAD, y + 2), f"... {skipped} classes not drawn ...", fill=(90, 90, 90), font=font
            )
            y += group_h
        shown = name if len(name) <= 30 else name[:29] + "…"
        draw.text((PAD, y + 2), shown, fill=(0, 0, 0), font=font)
        for i, split in enumerate(splits):
            count = info.class_counts(split).get(name, 0)
            length = round(bar_space * count / longest)
            top = y + i * _BAR
            box = (label_w, top, label_w + length, top + _BAR - 2)
            if length:
                draw.rectangle(
                    (box[0], box[1], box[2] - 1, box[3] - 1),
                    fill=SPLIT_COLOURS[i % len(SPLIT_COLOURS)],
                )
            draw.text((label_w + length + 4, top - 1), f"{count:,}", fill=(60, 60, 60), font=font)
            bars.append(Bar(split, name, count, box))
        y += group_h
    _save_png(image, out_file)
    return bars


def _save_png(image, out_file: str) -> None:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    with tf.io.gfile.GFile(out_file, "wb") as f:
        f.write(buffer.getvalue())
