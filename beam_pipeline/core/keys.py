"""Pure helpers: hashing, split assignment, shard counts and shard boundaries.

Imports neither Beam nor TensorFlow, so it is cheap to test and to reason
about (docs/format.md section 3). Every function here is deterministic across
processes, machines and Python versions: nothing uses Python's ``hash()``.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import re
from collections.abc import Mapping, Sequence

KEY_BITS = 64
KEY_SPACE = 1 << KEY_BITS

DEFAULT_SPLITS = "train=0.8,val=0.1,test=0.1"
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_]+$")
# TFDS reads split="all" as every split together (tfds.Split.ALL), never as a
# split of that name; a dataset with one cannot be read through TFDS.
TFDS_RESERVED_SPLITS = ("all",)
# Every file a split gets starts with its name (train-00000-of-00004.tfrecord.idx,
# and the temporary names beside them) and must fit the 255 bytes file systems allow.
MAX_SPLIT_NAME = 100
SPLIT_NAME_RULE = (
    f"letters, digits and _, at most {MAX_SPLIT_NAME}, not "
    + ", ".join(TFDS_RESERVED_SPLITS)
    + " (TFDS reserves it)"
)
FRACTION_TOLERANCE = 1e-6


def hash64(seed: int, purpose: str, image_id: str) -> int:
    """A stable unsigned 64-bit hash of ``(seed, purpose, image_id)``.

    The three parts are joined with NUL bytes, which cannot occur in a path, so
    distinct triples never collide by concatenation.

    Raises:
        ValueError: ``image_id`` is not valid UTF-8 (a file name's undecodable
            bytes, which the listing skips), naming it with those bytes as ``\\xNN``.
    """
    try:
        payload = f"{seed}\0{purpose}\0{image_id}".encode()
    except UnicodeEncodeError:
        raise ValueError(f"image ID {_escaped(image_id)} is not valid UTF-8") from None
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big")


def _escaped(text: str) -> str:
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return ascii(text)
    return "'" + raw.decode("utf-8", "backslashreplace") + "'"


def order_key(seed: int, image_id: str) -> int:
    """The global-shuffle key: records of a split are written in increasing key."""
    return hash64(seed, "order", image_id)


def split_point(seed: int, image_id: str) -> float:
    """Maps an image to [0, 1) for split assignment, independent of its order key."""
    return hash64(seed, "split", image_id) / KEY_SPACE


def parse_splits(spec: str) -> dict[str, float]:
    """Parses ``"train=0.8,val=0.1,test=0.1"`` into an ordered mapping.

    Raises:
        ValueError: with a message fit for the command line.
    """
    fractions: dict[str, float] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"--splits: {part!r} is not NAME=FRACTION ({SPLIT_NAME_RULE})")
        problem = split_name_problem(name)
        if problem is not None:
            raise ValueError(f"--splits: {part!r}: the split name {problem}; rename it")
        if name in fractions:
            raise ValueError(f"--splits: split {name!r} is given twice")
        clash = case_clash(fractions, name)
        if clash is not None:
            raise ValueError(f"--splits: {clash}; rename one")
        try:
            fraction = float(value)
        except ValueError:
            raise ValueError(f"--splits: {value!r} is not a number (in {part!r})") from None
        if not 0.0 <= fraction <= 1.0 or math.isnan(fraction):
            raise ValueError(f"--splits: fraction of {name!r} must be in [0, 1], got {value}")
        fractions[name] = fraction
    if not fractions:
        raise ValueError("--splits: no splits given")
    total = sum(fractions.values())
    if abs(total - 1.0) > FRACTION_TOLERANCE:
        raise ValueError(f"--splits: fractions must sum to 1, got {total:g} ({spec})")
    return fractions


def assign_split(seed: int, image_id: str, fractions: Mapping[str, float]) -> str:
    """The split whose cumulative fraction range holds ``split_point(seed, id)``.

    Stable: the split of an image depends only on its own ID, so adding or
    removing other images never moves it.
    """
    point = split_point(seed, image_id)
    cumulative = 0.0
    last_nonempty = None
    for name, fraction in fractions.items():
        if fraction <= 0:
            continue
        last_nonempty = name
        cumulative += fraction
        if point < cumulative:
            return name
    # Floating-point sums can end a hair below 1.0; the tail belongs to the last split.
    assert last_nonempty is not None, "fractions must contain a positive value"
    return last_nonempty


def num_shards(
    total_bytes: int, target_bytes: int, min_shards: int = 1, records: int | None = None
) -> int:
    """``max(min_shards, ceil(total_bytes / target_bytes))``, capped by ``records``.

    Every shard holds at least one record, so a split never has more shards
    than records; a split with no records has none.
    """
    if target_bytes <= 0:
        raise ValueError("target_bytes must be positive")
    wanted = max(min_shards, -(-total_bytes // target_bytes), 1)
    return wanted if records is None else min(wanted, records)


def shard_starts(records: int, shards: int) -> list[int]:
    """Rank of the first record of each shard, plus ``records`` at the end.

    Shard ``i`` of ``n`` holds the records of rank ``[floor(i*N/n), floor((i+1)*N/n))``
    in increasing order key: every shard gets ``floor(N/n)`` or ``ceil(N/n)``
    records, and none is empty when ``n <= N``.
    """
    if shards < 0 or records < 0 or (shards == 0) != (records == 0) or shards > records:
        raise ValueError(f"cannot cut {records} records into {shards} non-empty shards")
    return [i * records // shards for i in range(shards + 1)] if shards else [0]


def shard_of_key(key: int, boundaries: Sequence[int]) -> int:
    """The shard of ``key``, given the first key of shards 1..n-1 (sorted).

    Shard ``i`` holds the keys in ``[boundaries[i-1], boundaries[i])``, with
    ``boundaries[-1]`` = 0 and ``boundaries[n-1]`` = 2^64 implied.
    """
    if not 0 <= key < KEY_SPACE:
        raise ValueError(f"key {key} outside [0, 2^64)")
    return bisect.bisect_right(boundaries, key)


def shard_filename(split: str, index: int, count: int) -> str:
    """``train-00003-of-00012.tfrecord``."""
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def case_clash(names, name: str) -> str | None:
    """Why split ``name`` cannot join ``names``, the splits so far, or None.

    Two names that differ only in case would give their shards one file name
    where case does not count (macOS, Windows).
    """
    for other in names:
        if other != name and other.lower() == name.lower():
            return (
                f"the splits {other!r} and {name!r} differ only in case (their shards "
                "would share file names where case does not count: macOS, Windows)"
            )
    return None


def split_name_problem(name: str) -> str | None:
    """What keeps ``name`` from being a split of the dataset, or None.

    A split's name starts its shards' file names and is the name TFDS and
    the readers load it by (``as_dataset(split=NAME)``).
    """
    if not _SPLIT_NAME.match(name):
        return f"{name!r} is not {SPLIT_NAME_RULE}"
    if len(name) > MAX_SPLIT_NAME:
        return f"is longer than {MAX_SPLIT_NAME} characters (its files' names must fit)"
    if name in TFDS_RESERVED_SPLITS:
        return f"{name!r} is reserved by TFDS (split={name!r} reads every split together)"
    return None
