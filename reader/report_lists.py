"""What ``--report``'s page shows, read from the dataset (``reader/report.py`` draws it).

The groups of each list section (capped as they are read), one pass over the
rejects, and the thumbnails of the members shown: their records found by a
binary search on the order key, so only those records are read and decoded.
Every value from the dataset is taken as text and trusted for nothing.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import io
import json
from collections.abc import Callable, Iterator, Mapping, Sequence

import tensorflow as tf

from imagerecords import codec, trust
from reader import info as info_lib
from reader import pictures, shard_file
from reader.shard_file import ShardReadError

# What one page holds, whatever the dataset's size: at most GROUPS_SHOWN groups
# of MEMBERS_SHOWN thumbnails per section (~5 kB each), so a section adds at
# most ~2 MB.
GROUPS_SHOWN = 50
MEMBERS_SHOWN = 8
THUMB = 112
THUMB_QUALITY = 80
REASONS_SHOWN = 30
EXAMPLES_PER_REASON = 5

# The reasons --dedupe gives the images it drops (beam_pipeline.core.elements.
# RejectKind.DUPLICATE and NEAR_DUPLICATE, which the reader cannot import: a test
# checks that the two agree). What follows is the ID of the image kept.
DROP_REASONS = ("duplicate of ", "near duplicate of ")


def order_key(seed: int, image_id: str) -> int:
    """The record's global-shuffle key (docs/format.md section 3; beam_pipeline.core.keys.
    order_key, which the reader cannot import: a test checks that the two agree)."""
    payload = f"{seed}\0order\0{image_id}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big")


def reason_kind(reason) -> str:
    """What a reject reason is, without its details: ``near duplicate of`` for every
    image --dedupe near dropped, the words before the first ``:`` otherwise."""
    reason = reason if isinstance(reason, str) else "?"
    for prefix in DROP_REASONS:
        if reason.startswith(prefix):
            return prefix.strip()
    return reason.split(":", 1)[0]


def kept_of(reason) -> str | None:
    """The ID a --dedupe drop names as kept, or None for any other reason."""
    if isinstance(reason, str):
        for prefix in DROP_REASONS:
            if reason.startswith(prefix):
                return reason[len(prefix) :]
    return None


def _str(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@dataclasses.dataclass(frozen=True)
class ListedMember:
    id: str
    split: str
    label: str


@dataclasses.dataclass(frozen=True)
class ListedGroup:
    """One line of a list: its members and, for near copies, the pairs' distances."""

    members: tuple[ListedMember, ...]
    pairs: tuple[tuple[str, str, int | None], ...] = ()
    digest: str | None = None

    @property
    def across_splits(self) -> bool:
        return len({m.split for m in self.members}) > 1

    @property
    def across_classes(self) -> bool:
        return len({m.label for m in self.members}) > 1


def group_of(row) -> ListedGroup | None:
    """A group from a row of ``near_duplicates.jsonl`` or ``duplicates.jsonl``, or None
    for a row that is not one (each value is taken as text; nothing is trusted)."""
    if not isinstance(row, dict) or not isinstance(row.get("members"), list):
        return None
    members = tuple(
        ListedMember(_str(m.get("id")), _str(m.get("split")), _str(m.get("label")))
        for m in row["members"]
        if isinstance(m, dict)
    )
    pairs = tuple(
        (_str(p.get("a")), _str(p.get("b")), p["distance"] if is_int(p.get("distance")) else None)
        for p in row.get("pairs") or ()
        if isinstance(p, dict)
    )
    digest = row.get("sha256")
    return ListedGroup(members, pairs, digest if isinstance(digest, str) else None)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class ListSection:
    """A section of groups read from one of the dataset's lists.

    ``block`` is the imagerecords.json block whose ``file`` names the list,
    ``keep`` which of its groups the section shows. A new list (label
    conflicts, say) is one more entry in :data:`SECTIONS`.
    """

    key: str  # the HTML id: letters and -, never the dataset's
    title: str
    about: str
    block: str
    keep: Callable[[ListedGroup], bool]
    parse: Callable[[object], ListedGroup | None] = group_of


SECTIONS = (
    ListSection(
        "near-across-splits",
        "Near copies across splits",
        "Groups of near copies (resized, re-encoded, lightly cropped or brightened) with "
        "members in more than one split: a model would be evaluated on pictures it trained on.",
        "near_duplicates",
        lambda g: g.across_splits,
    ),
    ListSection(
        "identical-across-classes",
        "Identical files in more than one class",
        "The same bytes under two or more class names: at most one label is right.",
        "duplicates",
        lambda g: g.across_classes,
    ),
    ListSection(
        "identical",
        "Other identical files",
        "The same bytes more than once, within one class.",
        "duplicates",
        lambda g: not g.across_classes,
    ),
    ListSection(
        "near-within-split",
        "Near copies within one split",
        "Groups of near copies whose members all lie in one split.",
        "near_duplicates",
        lambda g: not g.across_splits,
    ),
)


@dataclasses.dataclass
class Shown:
    """What a section shows: its first groups, and how many it has in all."""

    section: ListSection
    groups: list[ListedGroup] = dataclasses.field(default_factory=list)
    total: int = 0
    problem: str | None = None  # why the list could not be read, in words


def list_rows(info: info_lib.DatasetInfo, block: str) -> Iterator[object]:
    """The rows of the list a block names (JSON values, or None for a line that is not
    JSON), read line by line. Raises ValueError naming why the list cannot be read."""
    entry = info.raw.get(block)
    if not isinstance(entry, Mapping):
        raise ValueError(f"this dataset has no {block} block")
    # The dataset's word: resolved inside it, a regular file (imagerecords.trust).
    path = trust.resolve(info.path, entry.get("file"), f"{block}.file", "imagerecords.json")
    if not tf.io.gfile.exists(path):
        raise ValueError(f"{entry['file']} is missing")
    with tf.io.gfile.GFile(path, "rb") as f:
        for line in f:
            if line.strip():
                try:  # bounded depth and digits: a hostile line is a row that is not JSON
                    yield trust.load_json(line.decode("utf-8", "replace"), path)
                except trust.DatasetError:
                    yield None


def read_sections(
    info: info_lib.DatasetInfo, sections: Sequence[ListSection], shown: int
) -> list[Shown]:
    """Each section's first ``shown`` groups and its total, one pass over each list."""
    out = [Shown(s) for s in sections]
    by_block = collections.defaultdict(list)
    for item in out:
        by_block[item.section.block].append(item)
    for block, items in by_block.items():
        try:
            for row in list_rows(info, block):
                for item in items:
                    group = item.section.parse(row)
                    if group is not None and len(group.members) > 1 and item.section.keep(group):
                        item.total += 1
                        if len(item.groups) < shown:
                            item.groups.append(group)
        except (ValueError, tf.errors.OpError, OSError) as error:
            why = error.message if isinstance(error, tf.errors.OpError) else str(error)
            for item in items:
                item.problem = why
    return out


@dataclasses.dataclass
class Rejects:
    """One pass over the rejects list: counts per kind of reason, examples, and the
    reason of each image the page shows."""

    kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict = dataclasses.field(default_factory=dict)
    of_shown: dict = dataclasses.field(default_factory=dict)
    problem: str | None = None

    def survivor(self, image_id: str) -> str:
        """The image a drop of ``image_id`` leads to in the end (``image_id`` itself when
        it was not dropped), as far as the shown reasons go: --dedupe near drops
        identical files first, so the copy an identical one was dropped for (the
        group's smallest ID, shown first) may itself be a near copy the search dropped."""
        seen = {image_id}
        while (kept := kept_of(self.of_shown.get(image_id))) is not None and kept not in seen:
            seen.add(kept)
            image_id = kept
        return image_id


def read_rejects(info: info_lib.DatasetInfo, shown_ids: set[str]) -> Rejects:
    out = Rejects()
    if not info.rejected_count:
        return out
    try:
        for row in list_rows(info, "rejected"):
            if not isinstance(row, dict):
                continue
            reason, image_id = _str(row.get("reason")), _str(row.get("id") or row.get("path"))
            kind = reason_kind(reason)
            out.kinds[kind] += 1
            examples = out.examples.setdefault(kind, [])
            if len(examples) < EXAMPLES_PER_REASON and len(out.examples) <= REASONS_SHOWN * 2:
                examples.append((image_id, _str(row.get("split")), reason))
            if image_id in shown_ids:
                out.of_shown[image_id] = reason
    except (ValueError, tf.errors.OpError, OSError) as error:
        out.problem = error.message if isinstance(error, tf.errors.OpError) else str(error)
    return out


def frame_offsets(path: str) -> list[int]:
    """Where each record of a shard starts, and its size last: one walk over the
    headers (``shard_file.walk_records``'s checks: no length is trusted past the
    file's end), no record read."""
    size = tf.io.gfile.stat(path).length
    offsets = [0]
    with tf.io.gfile.GFile(path, "rb") as f:
        while offsets[-1] < size:
            header = f.read(codec.FRAME_HEAD)
            problem = shard_file.framing_problem(header, size - offsets[-1], size)
            if problem:
                where = f"record {len(offsets) - 1} (byte {offsets[-1]:,})"
                raise ShardReadError(f"{where}: {problem}")
            length = codec.stated_length(header)
            f.seek(length + codec.FRAME_FOOT, whence=1)
            offsets.append(offsets[-1] + length + codec.FRAME_OVERHEAD)
    return offsets


class RecordFinder:
    """Finds records of a split by ID. A split's records, shard after shard, are
    in increasing order key (docs/format.md section 3), so two binary searches
    find one: over the shards by their first record's key (read without walking
    the shard), then inside the shard by its records' keys, each record read at
    its offset once one walk over the shard's headers has found them. About
    log2(records) records are read per ID, the first ones shared between IDs;
    a record whose ID differs from the one asked for is not it."""

    def __init__(self, info: info_lib.DatasetInfo, split: str):
        self.seed = info.seed
        self.shards = info.split(split).shards
        self.firsts: dict[int, int] = {}
        self.reads = 0  # records read, first ones included

    def usable(self) -> bool:
        counts = [s.num_examples for s in self.shards]
        return is_int(self.seed) and all(is_int(n) and n > 0 for n in counts)

    def _parsed(self, data: bytes, where: str) -> tuple[int, str, bytes]:
        self.reads += 1
        example = shard_file.parse_example(data, where)
        name = shard_file.feature(example, "image/filename")
        jpeg = shard_file.feature(example, "image/encoded")
        image_id = name.decode("utf-8", "replace") if isinstance(name, bytes) else ""
        return order_key(self.seed, image_id), image_id, jpeg if isinstance(jpeg, bytes) else b""

    def _first_key(self, shard: int) -> int:
        if shard not in self.firsts:
            for at, data in shard_file.walk_records(self.shards[shard].path, {0}):
                self.firsts[shard] = self._parsed(data, f"record {at}")[0]
        return self.firsts[shard]

    def _which_shards(self, targets) -> dict[int, list[tuple[int, str]]]:
        """Each target under the last shard whose first key is at most its own."""
        out: dict[int, list[tuple[int, str]]] = {}
        stack = [(0, len(self.shards), targets)]
        while stack:
            lo, hi, wanted = stack.pop()
            if not wanted:
                continue
            if hi - lo == 1:
                out[lo] = wanted
                continue
            mid = (lo + hi) // 2
            first = self._first_key(mid)
            stack.append((lo, mid, [t for t in wanted if t[0] < first]))
            stack.append((mid, hi, [t for t in wanted if t[0] >= first]))
        return out

    def _in_shard(self, shard: int, targets) -> dict[str, bytes]:
        offsets = frame_offsets(self.shards[shard].path)
        found: dict[str, bytes] = {}
        with tf.io.gfile.GFile(self.shards[shard].path, "rb") as f:
            stack = [(0, len(offsets) - 1, targets)]
            while stack:
                lo, hi, wanted = stack.pop()
                if not wanted or lo >= hi:
                    continue
                mid = (lo + hi) // 2
                f.seek(offsets[mid] + codec.FRAME_HEAD)
                data = f.read(offsets[mid + 1] - offsets[mid] - codec.FRAME_OVERHEAD)
                key, image_id, jpeg = self._parsed(data, f"record {mid}")
                found.update({i: jpeg for k, i in wanted if k == key and i == image_id})
                stack.append((lo, mid, [t for t in wanted if t[0] < key]))
                stack.append((mid + 1, hi, [t for t in wanted if t[0] > key]))
        return found

    def find(self, ids: Sequence[str]) -> dict[str, bytes]:
        """The stored JPEG of each ID found (raises ShardReadError naming the shard)."""
        found: dict[str, bytes] = {}
        if not self.usable() or not ids:
            return found
        targets = sorted((order_key(self.seed, i), i) for i in set(ids))
        at = None
        try:
            for at, wanted in sorted(self._which_shards(targets).items()):
                found.update(self._in_shard(at, wanted))
        except ShardReadError as error:
            where = self.shards[at].file if at is not None else "a shard's first record"
            raise ShardReadError(f"{where}: {error}") from None
        return found


def thumbnail(jpeg: bytes, size: int = THUMB) -> tuple[str, int, int] | None:
    """A ``data:`` URI of the image shrunk to fit ``size`` px, with its width and
    height; None when it does not decode (a record's bytes are the dataset's word)."""
    Image, _, _ = pictures.pillow()
    try:
        with Image.open(io.BytesIO(jpeg)) as image:
            image.draft("RGB", (size * 2, size * 2))  # decode at 1/2..1/8 scale when JPEG
            small = image.convert("RGB")
            small.thumbnail((size, size), Image.Resampling.BICUBIC)
    except Exception:  # noqa: BLE001 - Pillow raises many kinds on hostile bytes
        return None
    return data_uri(small, THUMB_QUALITY), small.width, small.height


def data_uri(image, quality: int) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclasses.dataclass
class Pictures:
    """The thumbnails of the members shown (by ID), and why some have none."""

    by_split: dict = dataclasses.field(default_factory=dict)  # split -> id -> (uri, w, h)
    problems: list = dataclasses.field(default_factory=list)


def find_pictures(info: info_lib.DatasetInfo, wanted: Mapping[str, set[str]]) -> Pictures:
    out = Pictures()
    for split, ids in sorted(wanted.items()):
        if split not in info.splits or not ids:
            continue
        finder = RecordFinder(info, split)
        if not finder.usable():
            out.problems.append(f"{split}: no seed or shard counts, records not looked up")
            continue
        try:
            found = finder.find(sorted(ids))
        except (ShardReadError, tf.errors.OpError, OSError) as error:
            why = error.message if isinstance(error, tf.errors.OpError) else str(error)
            out.problems.append(f"{split}: {why}")
            continue
        out.by_split[split] = {i: thumbnail(jpeg) for i, jpeg in found.items()}
    return out
