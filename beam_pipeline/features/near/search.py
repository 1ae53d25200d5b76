"""Near duplicates in the conversion: the stored fingerprint, the buckets, the report, the keeper.

What the engines need around ``hashes.py``'s fingerprint and pair rules, the same
for every engine. Pure: no Beam, no storage.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from beam_pipeline.core.elements import RejectKind
from beam_pipeline.features.dedupe.duplicates import Member
from beam_pipeline.features.near import hashes as near_duplicates
from beam_pipeline.features.near import texture as near_texture
from imagerecords import codec

NEAR_FILE = codec.NEAR_DUPLICATES_FILE
# The scheme a dataset's fingerprints and pairs were made with: its name says
# what it is, its version changes with any of the hash (the base it is taken
# from included), the windows, the bands (width and count), which buckets
# pair, the threshold or the texture rule (a resume or --reuse with another
# refuses or redoes).
SCHEME = "phash19-v5"
# The schemes this project wrote before SCHEME (its name, each lower version): a
# --reuse of a dataset made with one recomputes its fingerprints; any other
# (a newer version, another name) is refused.
_NAME, _VERSION = SCHEME.rsplit("-v", 1)
EARLIER_SCHEMES = tuple(f"{_NAME}-v{n}" for n in range(1, int(_VERSION)))
# Of those, the ones whose records hold this scheme's fingerprint bit for bit (only
# the search changed): a --reuse of one keeps its records as they are.
SAME_FINGERPRINT = ("phash19-v4",)
# The values the scheme stands for, recorded beside its name in imagerecords.json.
SCHEME_VALUES = {
    "hash": near_duplicates.DEFAULT_KIND,
    "windows": len(near_duplicates.WINDOWS),
    "band_bits": near_duplicates.BAND_BITS,
    "band_count": near_duplicates.BAND_COUNT,
    "probe_flips": near_duplicates.PROBE_FLIPS,
    "threshold": near_duplicates.THRESHOLD,
    "support": near_duplicates.SUPPORT,
    "colour_tolerance": near_duplicates.COLOUR_TOLERANCE,
    "texture": {
        "energy": near_texture.TEXTURE_ENERGY,
        "coefficients": near_texture.TEXTURE_COEFFICIENTS,
        "margin": near_texture.TEXTURE_MARGIN,
        "blank_share": near_texture.BLANK_SHARE,
        "blank_levels": near_texture.BLANK_LEVELS,
    },
}
# A bucket of more images than this is not paired all against all: random
# collisions of a band key stay far below it (a few images at 1.28 M with
# 27-bit bands), so a bucket this large is images sharing one hash, reported
# in the block instead.
MAX_BUCKET = 4096
COLOUR_BYTES = 3
HASH_BYTES = near_duplicates.HASH_BITS // 8


def pack(fp: near_duplicates.Fingerprint) -> bytes:
    """The fingerprint as the record keeps it: the hashes big-endian, then the colour."""
    return b"".join(h.to_bytes(HASH_BYTES, "big") for h in fp.hashes) + bytes(fp.colour)


def pack_image(img) -> bytes:
    """:func:`pack` of ``near_duplicates.fingerprint(img)``, made straight from the
    hash bits (the converter's path: no tuple of ints in between)."""
    hashes, colour = near_duplicates.packed(img)
    return hashes + bytes(colour)


def searched(packed: bytes) -> bool:
    """Whether the search takes a packed fingerprint: its whole hash's texture
    flag (``near_duplicates.textured``) is set."""
    return bool(packed[0] & (near_duplicates.TEXTURE_BIT >> (near_duplicates.HASH_BITS - 8)))


def features(packed: bytes) -> tuple[bytes, bytes]:
    """``(image/near/phash, image/near/colour)`` of a packed fingerprint."""
    return packed[:-COLOUR_BYTES], packed[-COLOUR_BYTES:]


def unpack(packed: bytes) -> near_duplicates.Fingerprint:
    """Inverse of :func:`pack`."""
    phash, colour = features(packed)
    count = len(phash) // HASH_BYTES
    hashes = struct.unpack(f">{count}Q", phash)
    return near_duplicates.Fingerprint(tuple(hashes), tuple(colour))


class Entry(NamedTuple):
    """What one image brings to a bucket: who it is, whether it probes the key
    (its whole hash's key, a few bits flipped) or is filed under it (a hash of
    it has the key), and its packed fingerprint."""

    member: Member
    probe: bool
    packed: bytes


def keyed(member: Member, packed: bytes) -> list[tuple[int, Entry]]:
    """``(band key, Entry)`` for each of an image's distinct homes and probes."""
    fp = unpack(packed)
    homes = [(key, Entry(member, False, packed)) for key, _ in near_duplicates.band_keys(fp)]
    probes = [(key, Entry(member, True, packed)) for key in near_duplicates.probe_keys(fp)]
    return homes + probes


class Pair(NamedTuple):
    """A verified pair, its members in ID order."""

    a: Member
    b: Member
    distance: int


class Oversized(NamedTuple):
    """A bucket left unpaired: its band key and how many images share it."""

    key: int
    images: int


def bucket(key: int, entries: Sequence[Entry]) -> list[Pair] | Oversized:
    """One band key's verified pairs, or :class:`Oversized` past :data:`MAX_BUCKET`
    images.

    Each probe meets each home of another image (``near_duplicates.bucket_pairs``)
    and a meeting within the threshold (``near_duplicates.meets``) is
    verified. A bucket without both a probe and a home pairs nothing, whatever
    its size, so it is neither paired nor reported: the local engine never
    writes its entries. The entries are sorted first, so the pairs do not
    depend on the order the engine gathered them in.
    """
    if not (any(e.probe for e in entries) and any(not e.probe for e in entries)):
        return []
    images = len({e.member for e in entries})
    if images > MAX_BUCKET:
        return Oversized(key, images)
    ordered = sorted(entries)
    prints = [unpack(e.packed) for e in ordered]
    found = []
    for i, j in near_duplicates.bucket_pairs([(i, e.probe) for i, e in enumerate(ordered)]):
        a, b = ordered[i].member, ordered[j].member
        if a.image_id == b.image_id:
            continue  # one image under two entries cannot happen; never pair it with itself
        if not near_duplicates.meets(prints[i], prints[j], key):
            continue
        d = near_duplicates.verify(prints[i], prints[j])
        if d is not None:
            found.append(Pair(a, b, d) if a < b else Pair(b, a, d))
    return sorted(set(found))  # two images may meet both ways


class Group(NamedTuple):
    """One near-duplicate group: its members sorted, its pairs sorted."""

    members: tuple[Member, ...]
    pairs: tuple[Pair, ...]


def report(pairs: Iterable[Pair]) -> list[Group]:
    """The groups of the distinct pairs (union-find, ``near_duplicates.groups``), sorted."""
    distinct = sorted(set(pairs))
    of_id = {m.image_id: m for p in distinct for m in (p.a, p.b)}
    ids = near_duplicates.groups((p.a.image_id, p.b.image_id) for p in distinct)
    group_of = {image_id: n for n, members in enumerate(ids) for image_id in members}
    grouped: list[list[Pair]] = [[] for _ in ids]
    for p in distinct:
        grouped[group_of[p.a.image_id]].append(p)
    return [
        Group(tuple(of_id[i] for i in members), tuple(grouped[n])) for n, members in enumerate(ids)
    ]


_SPLIT_ORDER = ("train", "val", "test")


def split_rank(split: str) -> tuple[int, str]:
    """The order ``--dedupe near`` prefers splits in: train, val, test, then the rest by name."""
    return (_SPLIT_ORDER.index(split) if split in _SPLIT_ORDER else len(_SPLIT_ORDER), split)


def keeper(members: Sequence[Member]) -> Member:
    """The member ``--dedupe near`` keeps: in the first split, then the smallest ID."""
    return min(members, key=lambda m: (split_rank(m.split), m.image_id))


def near_reason(kept: Member) -> str:
    return f"{RejectKind.NEAR_DUPLICATE.prefix}{kept.image_id}"


def dropped(found: Sequence[Group]) -> dict[str, str]:
    """image ID -> rejection reason of every member ``--dedupe near`` drops."""
    drops = {}
    for group in found:
        kept = keeper(group.members)
        for m in group.members:
            if m != kept:
                drops[m.image_id] = near_reason(kept)
    return drops


def info_block(found: Sequence[Group], oversized: Sequence[Oversized], untextured: int = 0) -> dict:
    """The ``near_duplicates`` block of imagerecords.json (docs/format.md section 7)."""
    return {
        "scheme": SCHEME,
        **SCHEME_VALUES,
        "pairs": sum(len(g.pairs) for g in found),
        "groups": len(found),
        "images": sum(len(g.members) for g in found),
        "cross_split": sum(len({m.split for m in g.members}) > 1 for g in found),
        "bucket_limit": MAX_BUCKET,
        "oversized_buckets": len(oversized),
        "images_in_oversized_buckets": sum(o.images for o in oversized),
        "untextured": untextured,
        "file": NEAR_FILE,
    }


def jsonl(found: Sequence[Group], classes: Sequence[str]) -> bytes:
    """``near_duplicates.jsonl``: one group per line, in the groups' order."""

    def member(m: Member) -> dict:
        return {"id": m.image_id, "split": m.split, "label": classes[m.label]}

    lines = []
    for group in found:
        row = {
            "members": [member(m) for m in group.members],
            "pairs": [
                {"a": p.a.image_id, "b": p.b.image_id, "distance": p.distance} for p in group.pairs
            ],
        }
        lines.append(json.dumps(row, sort_keys=True) + "\n")
    return "".join(lines).encode()


def summary_lines(block: dict) -> list[str]:
    """The end-of-run lines of the block (nothing when there is nothing to say)."""
    lines = []
    if block.get("groups"):
        lines.append(
            f"near duplicates: {block['groups']} groups hold {block['images']} images "
            f"(across splits: {block['cross_split']}; see {block['file']})"
        )
    if block.get("oversized_buckets"):
        lines.append(
            f"near duplicates: {block['oversized_buckets']} band keys shared by more than "
            f"{block['bucket_limit']} images each (flat or blank images) were not paired"
        )
    if block.get("untextured"):
        lines.append(
            f"near duplicates: {block['untextured']} images have too little texture to "
            "pair (flat, gradients, simple shapes, mostly blank pages) and were not searched"
        )
    return lines
