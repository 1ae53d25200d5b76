"""Checks an output folder against docs/format.md sections 5-7, parsing with real TensorFlow."""

from __future__ import annotations

import hashlib
import json
import os

import tensorflow as tf

from beam_pipeline.core import metadata

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/format": tf.io.FixedLenFeature([], tf.string),
    "image/height": tf.io.FixedLenFeature([], tf.int64),
    "image/width": tf.io.FixedLenFeature([], tf.int64),
    "image/channels": tf.io.FixedLenFeature([], tf.int64),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/class/text": tf.io.FixedLenFeature([], tf.string),
    "image/filename": tf.io.FixedLenFeature([], tf.string),
    "image/key/sha256": tf.io.FixedLenFeature([], tf.string),
}


def load_info(out: str) -> dict:
    with open(os.path.join(out, metadata.INFO_FILE)) as f:
        return json.load(f)


def read_rejects(out: str) -> list[dict]:
    with open(os.path.join(out, "rejects.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_shard(path: str) -> list[dict]:
    """Every record of one shard, parsed in batches by tf.io.parse_example."""
    rows = []
    for batch in tf.data.TFRecordDataset(path).batch(64):
        parsed = tf.io.parse_example(batch, FEATURES)
        for i in range(int(tf.shape(batch)[0])):
            rows.append({key: value[i].numpy() for key, value in parsed.items()})
    return rows


def check_output(out: str, input_root: str | None = None, decode: bool = True) -> dict:
    """Asserts the contract; returns ``{split: [record dicts in file order]}``."""
    info = load_info(out)
    classes = info["classes"]
    with open(os.path.join(out, "labels.txt")) as f:
        assert f.read().splitlines() == classes
    assert info["format_version"] == metadata.FORMAT_VERSION
    by_split: dict[str, list[dict]] = {}
    for split, entry in info["splits"].items():
        rows: list[dict] = []
        counts = dict.fromkeys(classes, 0)
        n = len(entry["shards"])
        for index, shard in enumerate(entry["shards"]):
            assert shard["file"] == f"{split}-{index:05d}-of-{n:05d}.tfrecord"
            path = os.path.join(out, shard["file"])
            with open(path, "rb") as f:
                data = f.read()
            assert shard["num_bytes"] == len(data)
            assert shard["sha256"] == hashlib.sha256(data).hexdigest()
            shard_rows = read_shard(path)
            assert shard["num_examples"] == len(shard_rows) > 0, "empty or miscounted shard"
            rows += shard_rows
        for row in rows:
            label = int(row["image/class/label"])
            counts[classes[label]] += 1
            assert row["image/class/text"].decode() == classes[label]
            assert row["image/format"] == b"jpeg"
            assert row["image/channels"] == 3
            if decode:
                image = tf.io.decode_jpeg(row["image/encoded"]).numpy()
                assert image.shape == (row["image/height"], row["image/width"], 3)
            if input_root is not None:
                name = row["image/filename"].decode()
                with open(os.path.join(input_root, name), "rb") as f:
                    assert row["image/key/sha256"].decode() == hashlib.sha256(f.read()).hexdigest()
        assert entry["num_examples"] == len(rows)
        assert entry["class_counts"] == counts
        by_split[split] = rows
    return by_split


def ids(rows) -> list[str]:
    return [r["image/filename"].decode() for r in rows]


def all_files(folder: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out
