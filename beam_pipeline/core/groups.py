"""Group-aware splits: which group an image belongs to, and the census of groups per split.

A group's split is drawn from its name as an image's is from its ID, so a group never
straddles splits (docs/images.md, "Groups"). Pure: no Beam, no storage.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence

from beam_pipeline.core import keys
from beam_pipeline.core.errors import UsageError
from beam_pipeline.core.text import shown

FLAG = "--group_by"
EXAMPLE = r"--group_by '^([^/]+/patient\d+)_'"
# A split is lumpy when its share of the images is off what --splits asked by
# more than this fraction of the ask (0.1 asked: below 0.075 or above 0.125) ...
LUMPY_FRACTION = 0.25
# ... or when its class mix is this far from the whole dataset's: the total
# variation distance, half the sum over classes of the difference of their
# shares (0.1: a tenth of its images would have to change class). The whole
# dataset, not the other splits: a small split off the mix is flagged, not
# the large one beside it.
LUMPY_CLASS_MIX = 0.1
# Groups put in two splits that imagerecords.json names (all are counted).
STRADDLING_SHOWN = 20
# The longest a search of one image ID may take. An ordinary pattern takes a
# microsecond; one that backtracks without bound (((a|aa)+)+ on a 26-letter
# name) takes years. ``re`` cannot be stopped (not even by Ctrl-C), so IDs are
# matched by ``regex``, with this bound, in ``re``'s syntax and meaning (VERSION0).
MATCH_TIMEOUT_S = 1.0


def check_group_by(text: str | None) -> re.Pattern | None:
    """``--group_by``'s pattern, compiled by ``re`` (its syntax is ``re``'s); None without one.

    Raises:
        ValueError: it holds a control character (a line break would end up in
            the summary), does not compile, or has no capture group to name the group.
    """
    if text is None:
        return None
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        raise ValueError(
            f"{FLAG} {shown(text)} holds the control character {shown(bad)}: write it as "
            r"an escape (\n, \t, \x1b) if an image ID holds it"
        )
    try:
        pattern = re.compile(text)
    except re.error as error:
        raise ValueError(f"{FLAG} {shown(text)} is not a regular expression ({error})") from None
    if not pattern.groups:
        raise ValueError(
            f"{FLAG} {shown(text)} has no capture group: put the part of the image ID that "
            f"names the group in parentheses, e.g. {EXAMPLE}"
        )
    return pattern


@functools.lru_cache(maxsize=8)
def _compiled(text: str):
    """The pattern as ``regex`` matches it (``re`` cannot be stopped mid-search)."""
    import regex  # 40 ms of imports, paid only by a run with --group_by

    check_group_by(text)
    return regex.compile(text, regex.VERSION0)


def group_of(group_by: str | None, image_id: str, column: str | None = None) -> str | None:
    """The image's group: the manifest's ``group`` column when the row has one, else
    the first capture group of ``group_by`` searched in ``image_id``; None (its own
    group) when neither names one (no match, or an empty capture).

    Raises:
        UsageError: the search took over :data:`MATCH_TIMEOUT_S` (a pattern that
            backtracks without bound), naming the pattern and the ID.
    """
    if column:
        return column
    if group_by is None:
        return None
    try:
        match = _compiled(group_by).search(image_id, timeout=MATCH_TIMEOUT_S)
    except TimeoutError:
        raise UsageError(
            f"{FLAG} {shown(group_by)} took over {MATCH_TIMEOUT_S:g} s on the image ID "
            f"{shown(image_id)}: it backtracks without bound (a repeated group that can match "
            "the same text in many ways, like ((a|aa)+)+); rewrite it, e.g. "
            f"{EXAMPLE}"
        ) from None
    return (match.group(1) or None) if match else None


def split_of(seed: int, image_id: str, group: str | None, fractions: Mapping[str, float]) -> str:
    """The split ``--splits`` draws: the group's, or the image's own when in no group."""
    return keys.assign_split(seed, image_id if group is None else group, fractions)


@dataclasses.dataclass
class Census:
    """Who is in which split: images per split of each named group, and of the images
    that are their own group, and images per class; adds up in any order.

    ``named`` holds a group that is in one split as ``(split, images)`` and only one
    in several as ``{split: images}`` (:func:`splits_of` reads either): about half
    the memory of a dict for each, which counts when most groups are one image.
    """

    named: dict[str, tuple[str, int] | dict[str, int]] = dataclasses.field(default_factory=dict)
    single: dict[str, int] = dataclasses.field(default_factory=dict)
    classes: dict[str, dict[int, int]] = dataclasses.field(default_factory=dict)

    def add(self, split: str, group: str | None, label: int) -> None:
        if group is None:
            self.single[split] = self.single.get(split, 0) + 1
        else:
            self._add_group(group, split, 1)
        by_class = self.classes.setdefault(split, {})
        by_class[label] = by_class.get(label, 0) + 1

    def _add_group(self, group: str, split: str, n: int) -> None:
        seen = self.named.get(group)
        if seen is None:
            self.named[group] = (split, n)
        elif isinstance(seen, tuple):
            if seen[0] == split:
                self.named[group] = (split, seen[1] + n)
            else:
                self.named[group] = {seen[0]: seen[1], split: n}
        else:
            seen[split] = seen.get(split, 0) + n

    def merge(self, other: Census) -> Census:
        for group, seen in other.named.items():
            for split, n in splits_of(seen).items():
                self._add_group(group, split, n)
        for split, n in other.single.items():
            self.single[split] = self.single.get(split, 0) + n
        for split, by_class in other.classes.items():
            mine = self.classes.setdefault(split, {})
            for label, n in by_class.items():
                mine[label] = mine.get(label, 0) + n
        return self


def splits_of(seen: tuple[str, int] | Mapping[str, int]) -> dict[str, int]:
    """A :class:`Census` ``named`` value as ``{split: images}``."""
    return {seen[0]: seen[1]} if isinstance(seen, tuple) else dict(seen)


def merged(censuses) -> Census:
    total = Census()
    for census in censuses:
        total.merge(census)
    return total


def _holds(seen, split: str) -> bool:
    return seen[0] == split if isinstance(seen, tuple) else split in seen


def class_distance(mine: Mapping[int, int], others: Mapping[int, int]) -> float:
    """Total variation distance of two class mixes (0: the same shares, 1: no class shared)."""
    a, b = sum(mine.values()), sum(others.values())
    if not a or not b:
        return 0.0
    labels = set(mine) | set(others)
    return sum(abs(mine.get(c, 0) / a - others.get(c, 0) / b) for c in labels) / 2


def _split_row(census: Census, split: str, asked: float | None, everyone: dict) -> dict:
    images = sum(census.classes.get(split, {}).values())
    total = sum(everyone.values())
    row = {
        "groups": census.single.get(split, 0)
        + sum(_holds(s, split) for s in census.named.values()),
        "images": images,
        "fraction": round(images / total, 4) if total else 0.0,
    }
    if asked is not None:
        row["asked"] = asked
    row["class_mix_distance"] = round(class_distance(census.classes.get(split, {}), everyone), 4)
    return row


def lumpy_reason(name: str, row: Mapping) -> str:
    """Why split ``name`` (a row of :func:`info_block`'s ``by_split``) is lumpy; "" if not."""
    why = []
    asked = row.get("asked")
    if asked and abs(row["fraction"] - asked) > LUMPY_FRACTION * asked:
        why.append(f"its fraction is {row['fraction']:g} against {asked:g} asked")
    if row["class_mix_distance"] > LUMPY_CLASS_MIX:
        why.append(
            f"its class mix is {row['class_mix_distance']:g} from the whole dataset's "
            f"(total variation distance; over {LUMPY_CLASS_MIX:g})"
        )
    if not why:
        return ""
    groups = f"{row['groups']} group" + ("" if row["groups"] == 1 else "s")
    return f"{name} has {groups}: " + " and ".join(why)


def info_block(
    census: Census, group_by: str | None, splits: Sequence[str], asked: Mapping[str, float] | None
) -> dict | None:
    """imagerecords.json's ``groups`` block (docs/format.md section 7); None when no
    image is in a group and no ``--group_by`` was given (the block is then left out).

    ``splits``: the dataset's splits in order; ``asked``: --splits (None for the
    pre-split layout, whose splits are its folders').
    """
    if group_by is None and not census.named:
        return None
    everyone: dict[int, int] = {}
    for by_class in census.classes.values():
        for label, n in by_class.items():
            everyone[label] = everyone.get(label, 0) + n
    by_split = {
        name: _split_row(census, name, asked.get(name) if asked else None, everyone)
        for name in splits
    }
    order = {name: i for i, name in enumerate(splits)}
    straddling = sorted(g for g, s in census.named.items() if not isinstance(s, tuple))
    return {
        "group_by": group_by,
        "groups": len(census.named) + sum(census.single.values()),
        "by_split": by_split,
        "straddling": {
            "count": len(straddling),
            "shown": {
                g: dict(sorted(census.named[g].items(), key=lambda kv: order.get(kv[0], 0)))
                for g in straddling[:STRADDLING_SHOWN]
            },
        },
        "lumpy": {name: why for name, row in by_split.items() if (why := lumpy_reason(name, row))},
    }


def report_lines(block: Mapping | None) -> list[str]:
    """The summary's and the dry run's lines about groups: the census, then warnings."""
    if not block:
        return []
    by_split = ", ".join(f"{name} {row['groups']}" for name, row in block["by_split"].items())
    how = (
        f"{FLAG} {shown(block['group_by'])}" if block["group_by"] else "the manifest's group column"
    )
    lines = [f"groups ({how}): {block['groups']} in all; per split: {by_split}"]
    straddling = block["straddling"]
    if straddling["count"]:
        listed = "; ".join(
            f"{shown(g)} ({', '.join(f'{s} {n}' for s, n in splits.items())})"
            for g, splits in list(straddling["shown"].items())[:5]
        )
        more = f"; and {straddling['count'] - 5} more" if straddling["count"] > 5 else ""
        count = straddling["count"]
        lines.append(
            f"warning: {count} {'group is' if count == 1 else 'groups are'} in two or more "
            f"splits (the layout's or the manifest's own splits win over the group's): "
            f"{listed}{more}"
        )
    for why in block["lumpy"].values():
        lines.append(f"warning: {why}; few large groups make splits lumpy")
    return lines
