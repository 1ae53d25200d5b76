"""bench.tools.near_run_cost's modes do what their names say, on a real run.

The tool's ratios are only as good as its child: ``on`` must search and time
its search, ``no-search`` must fingerprint every record and search nothing,
``off`` must fingerprint nothing.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from bench.tools import near_run_cost
from imagerecords import codec

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Twelve distinct pictures and a resized, re-encoded copy of the first."""
    root = tmp_path_factory.mktemp("near-run") / "images"
    rng = np.random.default_rng(3)
    for name in ("c0", "c1"):
        (root / name).mkdir(parents=True)
    for n in range(12):
        # Smooth pictures (noise upscaled), so that a resized copy stays near.
        small = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
        picture = small.resize((96, 96), Image.Resampling.BICUBIC)
        picture.save(root / f"c{n % 2}" / f"p{n:02d}.png")
        if n == 0:
            buffer = io.BytesIO()
            picture.resize((80, 80), Image.Resampling.BICUBIC).save(buffer, "JPEG", quality=80)
            (root / "c1" / "copy.jpg").write_bytes(buffer.getvalue())
    return root


@pytest.mark.parametrize(
    ("mode", "searched", "pairs"), [("on", True, 1), ("no-search", False, 0), ("off", False, 0)]
)
def test_each_mode_searches_and_reports_as_named(folder, tmp_path, mode, searched, pairs):
    row = near_run_cost.one_run(folder, tmp_path / "out", mode, timeout_s=300)
    assert row["images_converted"] == 13
    assert row["near_duplicate_pairs"] == pairs
    assert ("search_share" in row) is searched
    fingerprinted = [codec.near_of(record) for record in _records(tmp_path / "out")]
    assert len(fingerprinted) == 13
    assert all(bool(near and near[0]) is (mode != "off") for near in fingerprinted)
    if searched:
        assert 0 < row["search_share"] < 1
        assert row["search_cpu_s"] <= row["cpu_s"]


def _records(out):
    for shard in sorted(out.rglob("*.tfrecord*")):
        with open(shard, "rb") as stream:
            yield from codec.iter_records(stream)


def test_the_search_timing_is_read_from_the_childs_stderr():
    line = near_run_cost._SEARCH_TAG + '{"cpu_s": 1.5, "wall_s": 2.0}'
    assert near_run_cost.search_took(f"progress\n{line}\nmore\n") == {"cpu_s": 1.5, "wall_s": 2.0}
    assert near_run_cost.search_took("progress\nno search here\n") == {}


def test_modes_must_include_on_and_a_baseline(capsys):
    with pytest.raises(SystemExit):
        near_run_cost.main(["--modes", "no-search,off"])
    assert "--modes" in capsys.readouterr().err
