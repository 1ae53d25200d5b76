"""imagerecords.json and labels.txt (docs/format.md section 7). Pure: no Beam, no TF."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from beam_pipeline import __version__
from imagerecords import codec

# The contract version (docs/format.md section 11): change it only when an old
# reader could misread the new output, and change that document with it.
# 2: the metadata file is imagerecords.json, beside TFDS's own files; 3: every
# record holds its near-duplicate fingerprint, and near_duplicates.jsonl the groups.
FORMAT_VERSION = 3
# The published files' names are the format's (imagerecords.codec declares them).
INFO_FILE = codec.INFO_FILE
V1_INFO_FILE = codec.V1_INFO_FILE
LABELS_FILE = codec.LABELS_FILE
REJECTS_FILE = codec.REJECTS_FILE
SKIPPED_FILE = codec.SKIPPED_FILE
NEAR_DUPLICATES_FILE = codec.NEAR_DUPLICATES_FILE
# The groups of identical source files, one a line.
DUPLICATES_FILE = "duplicates.jsonl"
# imagerecords.json's blocks after the records' own, in the order docs/format.md
# section 7 gives them (each written by a feature, or by the listing: "groups");
# a block of another name comes after these.
BLOCK_ORDER = ("duplicates", "groups", "near_duplicates", "label_conflicts", "reuse")
# What every stored image is, whatever the settings: dataset_info.json's
# "image" block ends with these, after the settings (settings.info_values).
IMAGE_FACTS = {
    "format": "jpeg",
    "channels": 3,
    # Embedded colour profiles are applied (docs/images.md).
    "color_space": "sRGB",
}
# imagerecords.json's "created_by": the converter that made the records.
CREATED_BY = f"imagerecords {__version__}"
# A job's temporary files live under OUTPUT/TMP_DIR (hidden: readers never list it).
TMP_DIR = ".imagerecords-tmp"
# The live run's lock (storage/lock.py): removed by its owner alone, last.
LOCK = f"{TMP_DIR}/lock"


def split_order(configured: Iterable[str], present: Iterable[str]) -> list[str]:
    """Configured splits first, in their order, then any others (from a manifest) sorted."""
    order = list(dict.fromkeys(configured))
    return order + sorted(set(present) - set(order))


def build_info(
    *,
    source: str,
    seed: int,
    classes: Sequence[str],
    image: Mapping[str, object],
    splits: Sequence[str],
    shards: Iterable[Mapping],
    rejected_by_split: Mapping[str, int],
    config: Mapping[str, object],
    skipped_reasons: Iterable[str] = (),
) -> dict:
    """The imagerecords.json object.

    Args:
        shards: one mapping per written shard with ``split``, ``file``,
            ``num_examples``, ``num_bytes``, ``sha256`` and ``class_counts``
            (label id -> count).
        skipped_reasons: the reason of every skipped file (not an image by its
            extension, not inside a class folder).
    """
    skipped = Counter(skipped_reasons)
    per_split = {
        name: {
            "num_examples": 0,
            "num_bytes": 0,
            "class_counts": dict.fromkeys(classes, 0),
            "shards": [],
        }
        for name in splits
    }
    for shard in sorted(shards, key=lambda s: s["file"]):
        entry = per_split[shard["split"]]
        entry["num_examples"] += shard["num_examples"]
        entry["num_bytes"] += shard["num_bytes"]
        for label, count in shard["class_counts"].items():
            entry["class_counts"][classes[int(label)]] += count
        entry["shards"].append(
            {
                key: shard[key]
                for key in ("file", "num_examples", "num_bytes", "sha256", "index")
                if key in shard
            }
        )
    return {
        "format_version": FORMAT_VERSION,
        "created_by": CREATED_BY,
        "source": source,
        "seed": seed,
        "classes": list(classes),
        "image": dict(image),
        "features": dict(codec.FEATURE_TYPES),
        "splits": per_split,
        "rejected": {
            "count": sum(rejected_by_split.values()),
            "file": REJECTS_FILE,
            "by_split": {name: rejected_by_split.get(name, 0) for name in splits},
        },
        "skipped": {
            "count": sum(skipped.values()),
            "file": SKIPPED_FILE,
            "by_reason": dict(sorted(skipped.items())),
        },
        "config": dict(config),
    }


def dumps(info: Mapping) -> bytes:
    """Stable bytes: a rerun with the same seed and config writes the same file."""
    return (json.dumps(info, indent=2, sort_keys=False) + "\n").encode("utf-8")


def labels_text(classes: Sequence[str]) -> bytes:
    return "".join(f"{name}\n" for name in classes).encode("utf-8")


def skipped_jsonl(rows: Iterable[Mapping[str, str]]) -> bytes:
    """One ``{"path", "reason"}`` object per skipped file, sorted by path."""
    return rejects_jsonl(rows)


def rejects_jsonl(rejections: Iterable[Mapping[str, str]]) -> bytes:
    """One ``{"path", "reason", ...}`` object per line, sorted by path."""
    rows = sorted(rejections, key=lambda r: (r["path"], r["reason"]))
    return "".join(json.dumps(dict(r), sort_keys=True) + "\n" for r in rows).encode("utf-8")
