"""TFDS's metadata files for a converted dataset, so ``tfds.builder_from_directory`` reads it.

``dataset_info.json``, ``features.json`` and ``image-class-label.labels.txt``, in the
forms TFDS 4.9 writes (docs/format.md section 5). Pure: no TensorFlow, TFDS or Beam.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from beam_pipeline import __version__
from beam_pipeline.core import keys, metadata
from imagerecords.codec import FEATURE_TYPES

DATASET_INFO_FILE = "dataset_info.json"
FEATURES_FILE = "features.json"
DEFAULT_VERSION = "1.0.0"
DEFAULT_NAME = "imagerecords"
FILE_FORMAT = "tfrecord"
# TFDS fills {SPLIT}, {SHARD_X_OF_Y} ("00003-of-00012") and {FILEFORMAT}; the
# result must be keys.shard_filename (checked for every shard below).
FILEPATH_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"

IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"

_FEATURES = "tensorflow_datasets.core.features."
_DICT_CLASS = _FEATURES + "features_dict.FeaturesDict"
# TFDS's rules: a dataset name is snake_case, a version is MAJOR.MINOR.PATCH.
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


def labels_file(key: str = LABEL_KEY) -> str:
    """The name TFDS gives a ClassLabel's names file: the feature path with ``-``."""
    return key.replace("/", "-") + ".labels.txt"


# The files :func:`tfds_files` returns, by name.
FILES = (DATASET_INFO_FILE, FEATURES_FILE, labels_file())


def check_name_and_version(name: str, version: str) -> None:
    """Raises ValueError, with a message fit for the command line, when TFDS would refuse them."""
    if not _NAME.match(name):
        raise ValueError(
            f"TFDS dataset name {name!r}: use lower-case letters, digits and _, "
            "starting with a letter"
        )
    if not _VERSION.match(version):
        raise ValueError(f"TFDS dataset version {version!r}: use MAJOR.MINOR.PATCH, e.g. 1.0.0")


def dataset_info(info: Mapping, name: str, version: str) -> dict:
    """TFDS's ``DatasetInfo`` (proto3 JSON) for ``info``; splits with no record are left out.

    Raises:
        ValueError: a shard's name is not what ``FILEPATH_TEMPLATE`` yields.
    """
    splits = []
    for split, entry in info["splits"].items():
        shards = entry["shards"]
        if not shards:  # TFDS cannot read a split of zero shards
            continue
        for index, shard in enumerate(shards):
            expected = keys.shard_filename(split, index, len(shards))
            if shard["file"] != expected:
                raise ValueError(f"shard {shard['file']!r} should be named {expected!r} for TFDS")
        splits.append(
            {
                "filepathTemplate": FILEPATH_TEMPLATE,
                "name": split,
                "numBytes": str(entry["num_bytes"]),
                "shardLengths": [str(shard["num_examples"]) for shard in shards],
            }
        )
    return {
        "description": (
            f"Converted by {info.get('created_by') or 'imagerecords ' + __version__} "
            f"from {info.get('source', 'images')}."
        ),
        "fileFormat": FILE_FORMAT,
        "name": name,
        "splits": splits,
        "version": version,
    }


def _feature(key: str, kind: str, info: Mapping) -> dict:
    """One record key as a TFDS feature connector."""
    if key == IMAGE_KEY:
        image = info.get("image", {})
        side = image.get("size") if image.get("resize") in ("crop", "pad") else None
        dims = [str(side or -1), str(side or -1), str(image.get("channels", 3))]
        return {
            "image": {"dtype": "uint8", "encodingFormat": "jpeg", "shape": {"dimensions": dims}},
            "pythonClassName": _FEATURES + "image_feature.Image",
        }
    if key == LABEL_KEY:
        return {
            "classLabel": {"numClasses": str(len(info["classes"]))},
            "pythonClassName": _FEATURES + "class_label_feature.ClassLabel",
        }
    if kind == "bytes":
        return {"pythonClassName": _FEATURES + "text_feature.Text", "text": {}}
    return {
        "pythonClassName": _FEATURES + "scalar.Scalar",
        "tensor": {"dtype": "int64", "encoding": "none", "shape": {}},
    }


def features(info: Mapping) -> dict:
    """TFDS's ``features.json``: the record keys, split on ``/``, as nested FeaturesDicts."""
    tree: dict = {}
    for key, kind in info.get("features", FEATURE_TYPES).items():
        *folders, leaf = key.split("/")
        node = tree
        for folder in folders:
            node = node.setdefault(folder, {})
        node[leaf] = _feature(key, kind, info)

    def as_dict(node: dict) -> dict:
        return {
            "featuresDict": {
                "features": {
                    name: child if "pythonClassName" in child else as_dict(child)
                    for name, child in node.items()
                }
            },
            "pythonClassName": _DICT_CLASS,
        }

    return as_dict(tree)


def tfds_files(
    info: Mapping, *, name: str = DEFAULT_NAME, version: str = DEFAULT_VERSION
) -> dict[str, bytes]:
    """File name -> bytes of TFDS's metadata for the dataset ``info`` describes.

    The same info, name and version give the same bytes (keys sorted).
    """
    check_name_and_version(name, version)

    def dumps(obj, indent):
        return (json.dumps(obj, indent=indent, sort_keys=True) + "\n").encode("utf-8")

    return {
        DATASET_INFO_FILE: dumps(dataset_info(info, name, version), 2),
        FEATURES_FILE: dumps(features(info), 4),
        labels_file(): metadata.labels_text(info["classes"]),
    }
