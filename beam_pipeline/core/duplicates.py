"""Identical source files: groups, the imagerecords.json block, duplicates.jsonl, --dedupe.

A group is every converted image whose source has the same SHA-256; resized or
re-encoded copies are near duplicates (``near_duplicates.py``). Pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from beam_pipeline.core.elements import RejectKind

DUPLICATES_FILE = "duplicates.jsonl"
# --dedupe: what it drops, besides keeping one of each group. "exact": identical
# source files; "near": near copies as well (docs/images.md, "Near duplicates").
DEDUPE_MODES = ("exact", "near")


def dedupe_mode(value, switch_words: dict[str, bool]) -> str:
    """--dedupe's value as the config holds it: "" (off), "exact" or "near".

    A switch's words (``switch_words``: text -> on) stay valid, ``--dedupe=true``
    being ``exact``, as scripts and Flex Templates passed them before ``near``.
    """
    if isinstance(value, bool):
        return "exact" if value else ""
    text = str(value).strip().lower()
    if text in DEDUPE_MODES:
        return text
    return "exact" if switch_words.get(text, False) else ""


class Member(NamedTuple):
    """One image of a group (what the grouping step carries per image)."""

    image_id: str
    split: str
    label: int


def keeper(members: Sequence[Member]) -> Member:
    """The member ``--dedupe`` keeps: the smallest ID, so its split is deterministic."""
    return min(members)


def duplicate_reason(kept: Member) -> str:
    return f"{RejectKind.DUPLICATE.prefix}{kept.image_id}"


def dropped(members: Sequence[Member]) -> list[tuple[Member, str]]:
    """Every member but the keeper, with its rejection reason."""
    kept = keeper(members)
    return [(m, duplicate_reason(kept)) for m in sorted(members) if m != kept]


def drop_copies(entries: Iterable, drops: dict[str, str]) -> tuple[list, list[tuple]]:
    """Splits records (anything with an ``image_id``) into those kept and the
    ``(record, reason)`` of each copy in ``drops`` (image ID -> reason)."""
    kept, dropped_copies = [], []
    for entry in entries:
        reason = drops.get(entry.image_id)
        if reason is None:
            kept.append(entry)
        else:
            dropped_copies.append((entry, reason))
    return kept, dropped_copies


def leaks(groups: Iterable[Sequence[Member]], first_split: str) -> dict[str, int]:
    """Per split other than ``first_split``: images whose bytes are also in ``first_split``.

    With ``first_split`` the training split, these are the evaluation images
    the model will have trained on.
    """
    out: dict[str, int] = {}
    for members in groups:
        if any(m.split == first_split for m in members):
            for m in members:
                if m.split != first_split:
                    out[m.split] = out.get(m.split, 0) + 1
    return dict(sorted(out.items()))


def first_split(splits: Sequence[str]) -> str:
    """The split a model trains on, whose copies elsewhere are leaks: "train" when
    there is one, else the first."""
    return "train" if "train" in splits else (splits[0] if splits else "train")


def info_block(groups: Sequence[Sequence[Member]], first_split: str) -> dict:
    """The ``duplicates`` block of imagerecords.json (docs/format.md section 7)."""
    return {
        "groups": len(groups),
        "images": sum(len(g) for g in groups),
        "cross_split": sum(len({m.split for m in g}) > 1 for g in groups),
        "cross_class": sum(len({m.label for m in g}) > 1 for g in groups),
        "file": DUPLICATES_FILE,
        # What the end-of-run summary warns about: val/test images also in train.
        "also_in_" + first_split: leaks(groups, first_split),
    }


def jsonl(groups: Iterable[tuple[str, Sequence[Member]]], classes: Sequence[str]) -> bytes:
    """``duplicates.jsonl``: one group per line, sorted by its smallest member ID."""
    lines = []
    for sha256, members in sorted(groups, key=lambda g: keeper(g[1])):
        row = {
            "sha256": sha256,
            "members": [
                {"id": m.image_id, "split": m.split, "label": classes[m.label]}
                for m in sorted(members)
            ],
        }
        lines.append(json.dumps(row, sort_keys=True) + "\n")
    return "".join(lines).encode()


def summary_lines(block: dict, first_split: str, deduped: bool = False) -> list[str]:
    """The end-of-run lines; a leak left in the output is shouted (it ruins an evaluation)."""
    if not block or not block.get("groups"):
        return []
    groups = block["groups"]
    plural = "groups of identical files hold" if groups != 1 else "group of identical files holds"
    lines = [
        f"duplicates: {groups} {plural} {block['images']} images "
        f"(across splits: {block['cross_split']}, across classes: {block['cross_class']}; "
        f"see {block['file']})"
    ]
    leaked = block.get("also_in_" + first_split) or {}
    count = sum(leaked.values())
    one = count == 1
    images = f"{count} image{'' if one else 's'} in {'/'.join(leaked)}"
    if leaked and deduped:
        copies = f"a copy of a {first_split} image" if one else f"copies of {first_split} images"
        lines.append(f"{images} {'was' if one else 'were'} {copies}; --dedupe kept one of each")
    elif leaked:
        lines.append(
            f"WARNING: {images} also appear{'s' if one else ''} in {first_split}: "
            "the model will be evaluated on images it trained on (--dedupe keeps one of each)"
        )
    return lines
