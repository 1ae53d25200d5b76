"""Identical source files: groups, the imagerecords.json block, duplicates.jsonl, --dedupe,
and label conflicts (a picture in two classes, identical or near copies).

A group is every converted image whose source has the same SHA-256; resized or
re-encoded copies are near duplicates (``features/near/``). Pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from beam_pipeline.core import dedupe_modes, metadata
from beam_pipeline.core.elements import RejectKind

DUPLICATES_FILE = metadata.DUPLICATES_FILE
# --dedupe's modes: declared with the flag (core/dedupe_modes.py).
DEDUPE_MODES = dedupe_modes.DEDUPE_MODES


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


# ------------------------------------------------------------ label conflicts

# Label conflicts imagerecords.json lists (all are counted) and the summary shows.
CONFLICTS_LISTED = 20
CONFLICTS_SHOWN = 3
# Which copy of a label conflict is written, and why, by kind and whether --dedupe drops it.
KEPT_BECAUSE = {
    ("exact", True): "--dedupe keeps the smallest ID",
    ("near", True): "--dedupe near keeps the member in the first split, then the smallest ID",
    ("exact", False): "without --dedupe every copy is written",
}
# An identical group's kept copy that --dedupe near then dropped: the copy written
# is the near copy it was dropped for, which is not a member of the group.
KEPT_AFTER_NEAR = (
    "--dedupe keeps the smallest ID, which --dedupe near then dropped as a near copy of this one"
)


class Conflict(NamedTuple):
    """One picture in two or more classes: a group of copies with more than one label."""

    kind: str  # "exact" (identical files) or "near" (near copies)
    members: tuple[Member, ...]  # sorted by ID
    kept: Member | None  # the copy --dedupe writes; None: every copy is written


def label_conflicts(groups: Iterable[Sequence[Member]], kind: str, kept_by=None) -> list[Conflict]:
    """The groups of ``kind`` whose members have more than one label, by smallest ID.

    ``kept_by``: the rule that picks the member --dedupe writes (``keeper``, or
    ``near_search.keeper``); None when every copy is written.
    """
    found = [
        Conflict(kind, tuple(sorted(members)), kept_by(members) if kept_by else None)
        for members in groups
        if len({m.label for m in members}) > 1
    ]
    return sorted(found, key=lambda c: c.members[0])


def run_conflicts(exact, near, dedupe: str, near_keeper) -> list[Conflict]:
    """The label conflicts a run reports: of its groups of identical files (``exact``,
    member lists), and under ``--dedupe near`` of its near groups (``near``), with
    the copy each keeps by ``keeper`` or ``near_keeper`` (``near_search.keeper``)."""
    found = label_conflicts(exact, "exact", keeper if dedupe else None)
    if dedupe == "near":
        # Identical files are dropped first; the copy kept may then be a near copy
        # the search drops, and the one written is its near group's keeper.
        written = {m: near_keeper(group) for group in near for m in group}
        found = [c._replace(kept=written.get(c.kept, c.kept)) for c in found]
        found += label_conflicts(near, "near", near_keeper)
    return found


def conflicts_block(conflicts: Sequence[Conflict], classes: Sequence[str]) -> dict | None:
    """The ``label_conflicts`` block of imagerecords.json (docs/format.md section 7), or
    None when there is none."""
    if not conflicts:
        return None

    def listed(c: Conflict) -> dict:
        return {
            "kind": c.kind,
            "members": [
                {"id": m.image_id, "split": m.split, "label": classes[m.label]} for m in c.members
            ],
            "kept": c.kept.image_id if c.kept else None,
            "why": KEPT_AFTER_NEAR
            if c.kept is not None and c.kept not in c.members
            else KEPT_BECAUSE[c.kind, c.kept is not None],
        }

    kinds = [c.kind for c in conflicts]
    return {
        "count": len(conflicts),
        "exact": kinds.count("exact"),
        "near": kinds.count("near"),
        "listed": [listed(c) for c in conflicts[:CONFLICTS_LISTED]],
    }


def conflict_lines(block: dict | None) -> list[str]:
    """The end-of-run lines of the ``label_conflicts`` block: its count and the first few."""
    if not block or not block.get("count"):
        return []
    count = block["count"]
    lines = [
        f"WARNING: label conflicts: {count} picture{' is' if count == 1 else 's are'} in two or "
        f"more classes ({block['exact']} identical, {block['near']} near copies; "
        f"imagerecords.json's label_conflicts lists the first {CONFLICTS_LISTED}): "
        "check which class is right"
    ]
    for row in block.get("listed", [])[:CONFLICTS_SHOWN]:
        who = " = ".join(f"{m['id']} ({m['label']}, {m['split']})" for m in row["members"])
        kept = f"kept {row['kept']} ({row['why']})" if row["kept"] else row["why"]
        lines.append(f"  {who}: {kept}")
    return lines
