"""docs/format.md describes what the code writes: version, record keys, imagerecords.json keys."""

import re
from pathlib import Path

from beam_pipeline.core import metadata
from imagerecords import codec
from reader import info as reader_info

FORMAT_MD = (Path(__file__).resolve().parent.parent / "docs" / "format.md").read_text()


def _section(number: int) -> str:
    start = re.search(rf"^## {number}\. ", FORMAT_MD, re.M).start()
    following = re.search(rf"^## {number + 1}\. ", FORMAT_MD, re.M)
    return FORMAT_MD[start : following.start() if following else None]


def test_document_version_is_the_written_and_the_read_version():
    assert FORMAT_MD.startswith(
        f"# imagerecords — output format (format_version {metadata.FORMAT_VERSION})"
    )
    assert f"is **{metadata.FORMAT_VERSION}**" in _section(11)
    assert metadata.FORMAT_VERSION in reader_info.SUPPORTED_FORMAT_VERSIONS


def test_every_record_key_is_documented_with_its_type():
    table = _section(6)
    for key, kind in codec.FEATURE_TYPES.items():
        row = next((line for line in table.splitlines() if f"`{key}`" in line), None)
        assert row is not None, f"{key} missing from docs/format.md section 6"
        assert f"| {kind} |" in row, f"{key}: documented type is not {kind}"


def test_every_dataset_info_key_is_documented():
    info = metadata.build_info(
        source="/in",
        seed=1,
        classes=["a"],
        image={"resize": "shorter", "size": 8},
        splits=["train"],
        shards=[
            {
                "split": "train",
                "file": "f",
                "num_examples": 1,
                "num_bytes": 9,
                "sha256": "0",
                "index": "f.idx",
                "class_counts": {"0": 1},
            }
        ],
        rejected_by_split={},
        config={"layout": "classes"},
    )
    documented = _section(7)
    for key in info:
        assert f"| `{key}` |" in documented, f"imagerecords.json key {key} not in the table"
    for key in info["splits"]["train"]["shards"][0]:
        assert f"`{key}`" in documented.split("splits.*.shards[]", 1)[1].splitlines()[0]
    for block in ("rejected", "skipped"):
        row = next(line for line in documented.splitlines() if line.startswith(f"| `{block}` |"))
        for key in info[block]:
            assert f"`{key}`" in row, f"{block}.{key} not documented"
