"""Pure helpers: hashing, split assignment, shard counts and shard of a key.

Imports neither Beam nor TensorFlow, so it is cheap to test and to reason
about (docs/format.md section 3). Every function here is deterministic across
processes, machines and Python versions: nothing uses Python's ``hash()``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping

KEY_BITS = 64
KEY_SPACE = 1 << KEY_BITS

DEFAULT_SPLITS = "train=0.8,val=0.1,test=0.1"
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_FRACTION_TOLERANCE = 1e-6


def hash64(seed: int, purpose: str, image_id: str) -> int:
    """A stable unsigned 64-bit hash of ``(seed, purpose, image_id)``.

    The three parts are joined with NUL bytes, which cannot occur in a path, so
    distinct triples never collide by concatenation.
    """
    payload = f"{seed}\0{purpose}\0{image_id}".encode()
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big")


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
        if not sep or not _SPLIT_NAME.match(name):
            raise ValueError(f"--splits: {part!r} is not NAME=FRACTION (names: letters, digits, _)")
        if name in fractions:
            raise ValueError(f"--splits: split {name!r} is given twice")
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
    if abs(total - 1.0) > _FRACTION_TOLERANCE:
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


def num_shards(total_bytes: int, target_bytes: int, min_shards: int = 1) -> int:
    """``max(min_shards, ceil(total_bytes / target_bytes))``."""
    if target_bytes <= 0:
        raise ValueError("target_bytes must be positive")
    return max(min_shards, -(-total_bytes // target_bytes), 1)


def shard_of_key(key: int, shards: int) -> int:
    """Shard ``i`` of ``n`` holds keys in ``[i * 2^64 / n, (i + 1) * 2^64 / n)``."""
    if not 0 <= key < KEY_SPACE:
        raise ValueError(f"key {key} outside [0, 2^64)")
    return (key * shards) >> KEY_BITS


def shard_filename(split: str, index: int, count: int) -> str:
    """``train-00003-of-00012.tfrecord``."""
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def dense_shard_numbers(nonempty: list[int]) -> dict[int, int]:
    """Renumbers the non-empty hash-range shards 0..k-1, keeping their order.

    Hash ranges can be empty for small splits; empty shards are never written,
    and renumbering keeps "read shards in order = one permutation" true.
    """
    return {shard: rank for rank, shard in enumerate(sorted(set(nonempty)))}


def is_valid_split_name(name: str) -> bool:
    return bool(_SPLIT_NAME.match(name))
