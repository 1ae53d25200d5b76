"""Smoke test of the benchmark harness (``python -m bench``) at tiny sizes.

It checks the wiring, not the speed: the data generator, every converter and
reader runner, the measurement of child processes and the report all work
together and the table has a row for every tool. A tool that has not landed
(or fails) must still get its row, marked "n/a" with the reason.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("matplotlib")
pytest.importorskip("skimage")

from bench import __main__ as bench_main  # noqa: E402
from bench import report  # noqa: E402
from bench.common import procstats  # noqa: E402
from bench.convert import codec_paths, quality  # noqa: E402
from bench.convert.codec_paths import CODECS  # noqa: E402
from bench.convert.codec_paths import LABELS as CODEC_LABELS  # noqa: E402
from bench.convert.converters import LABELS as CONVERTER_LABELS  # noqa: E402
from bench.read.pipelines import LABELS as READER_LABELS  # noqa: E402

# Measures ``sys.argv[1]`` (a child's code, given ``sys.argv[2]``, a folder) with
# run_measured from a small, fresh Python process, not from pytest itself, so
# that the numbers are small and exact. The child is killed once the folder
# holds ``sys.argv[3]`` files, and sampled only when it starts and then just
# before the kill: what it held then counts however slowly the machine runs it.
_MEASURE_UNTIL_READY = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from bench.common import procstats\n"
    "code, folder, ready = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])\n"
    "r = procstats.run_measured([sys.executable, '-c', code, str(folder)], timeout_s=120,\n"
    "    kill_when=lambda: len(list(folder.iterdir())) >= ready, sample_every_s=3600)\n"
    "print(json.dumps([r.returncode, r.peak_tree_rss_mb, r.peak_proc_rss_mb]))\n"
)


def _measure_until_ready(child: str, folder: Path, ready: int, before: str = "") -> list:
    """(returncode, tree MB, largest process MB) of ``child``, run by a process that
    first runs ``before``."""
    out = subprocess.run(
        [sys.executable, "-c", before + _MEASURE_UNTIL_READY, child, str(folder), str(ready)],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_run_measured_counts_the_whole_process_tree(tmp_path):
    """Two workers that hold 40 MB each when the tree is killed: the tree peak sums them."""
    child = (
        "import multiprocessing as mp, pathlib, sys, time\n"
        "def f(n):\n"
        "    b = bytearray(40_000_000)\n"
        "    (pathlib.Path(sys.argv[1]) / str(n)).write_text('holding')\n"
        "    time.sleep(600)\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('fork')\n"
        "    ps = [ctx.Process(target=f, args=(n,)) for n in range(2)]\n"
        "    [p.start() for p in ps]; [p.join() for p in ps]\n"
    )
    (tmp_path / "ready").mkdir()
    returncode, tree_mb, proc_mb = _measure_until_ready(child, tmp_path / "ready", 2)
    assert returncode == -9  # killed while both workers held their 40 MB
    # Both workers at once (2 x 40 MB, plus three interpreters) ...
    assert tree_mb > 80 + 3 * 5
    # ... more than any single process of the tree (one worker: ~40 MB + an interpreter).
    assert proc_mb <= tree_mb
    assert tree_mb - proc_mb > 30


@pytest.mark.e2e
def test_run_measured_is_not_inflated_by_a_large_parent(tmp_path):
    """A small child of a 300 MB parent is measured small.

    Linux carries a process's RSS high-water mark across exec, so ``ru_maxrss``
    of any child of a large parent is at least the parent's size; after the
    reader half the bench parent was ~400 MB and every scale row read "399 MB".
    """
    big = "big = bytearray(300_000_000)\nbig[::4096] = b'x' * len(big[::4096])\n"
    child = (
        "import pathlib, sys, time\n(pathlib.Path(sys.argv[1]) / 'up').touch()\ntime.sleep(600)\n"
    )
    (tmp_path / "ready").mkdir()
    returncode, tree_mb, proc_mb = _measure_until_ready(child, tmp_path / "ready", 1, big)
    assert returncode == -9
    assert 1 < proc_mb <= tree_mb < 100


@pytest.mark.e2e
def test_run_measured_kills_the_tree_when_asked(tmp_path):
    """``kill_when``: SIGKILL to the whole process group once it answers True."""
    flag = tmp_path / "started"
    child = (
        "import multiprocessing as mp, pathlib, sys, time\n"
        "if __name__ == '__main__':\n"
        "    worker = mp.get_context('fork').Process(target=time.sleep, args=(60,))\n"
        "    worker.start(); print(worker.pid, flush=True)\n"
        "    pathlib.Path(sys.argv[1]).write_text('x'); time.sleep(60)\n"
    )
    result = procstats.run_measured(
        [sys.executable, "-c", child, str(flag)], timeout_s=60, kill_when=flag.exists
    )
    assert result.returncode == -9  # killed: the child would have slept 60 s and exited 0
    worker = int(result.stdout.split()[0])
    _wait_for_exit(worker)  # the worker was killed with its parent, not orphaned
    assert not Path(f"/proc/{worker}").exists() or "Z" in _state(worker)


def _wait_for_exit(pid: int) -> None:
    """Returns once ``pid`` has ended (its pidfd turns readable), or is gone already."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        # Much longer than a killed process takes to end: a guard, not a measure.
        select.select([handle], [], [], 60)
    finally:
        os.close(handle)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.e2e
def test_run_measured_kills_a_hung_child():
    result = procstats.run_measured(
        [sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1
    )
    assert result.returncode is None  # ended by the timeout, not by the child


@pytest.mark.e2e
@pytest.mark.slow
def test_quick_run_writes_a_table_with_every_row(tmp_path):
    results_dir = tmp_path / "results"
    status = bench_main.main(
        [
            "--quick",
            "--sets",
            "web",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--results-dir",
            str(results_dir),
            "--scale-factors",
            "1,2",
            "--scale-many",
            "3000",
        ]
    )
    assert status == 0
    scale_table = (results_dir / "scale.md").read_text()
    assert "| imagerecords | x2 | 96 |" in scale_table and "| floor | x1 | 48 |" in scale_table
    # The many-small-files point: full, killed, resumed; the resumed output the same bytes.
    assert "| 3,000 | full |" in scale_table and "| 3,000 | resumed |" in scale_table
    assert "resumed output byte-identical to the full run's: True" in scale_table
    many = json.loads((results_dir / "scale.json").read_text())["many"]
    resumed = next(r for r in many["rows"] if r["run"] == "resumed")
    assert resumed["images_resumed"] > 0 and resumed["images_converted"] < 3000
    reuse_table = (results_dir / "reuse.md").read_text()
    assert "| web | 47 | 1 / 1 / 1 | reuse |" in reuse_table
    assert "Output identical to the full conversion's: True" in reuse_table
    table = (results_dir / "results.md").read_text()
    for label in CONVERTER_LABELS.values():
        assert f"| web | {label} |" in table
    for label in READER_LABELS.values():
        assert f"| {label} |" in table
    assert "nproc" in table and "Load average" in table
    assert (results_dir / "chart.png").stat().st_size > 10_000

    raw = json.loads((results_dir / "results.json").read_text())
    rows = {r["converter"]: r for r in raw["converter"]["rows"]}
    # The baselines live in bench/ and must always run.
    assert rows["floor"]["ok"] and rows["floor"]["images_per_s"] > 0
    assert rows["naive"]["ok"] and rows["naive"]["images_per_s"] > 0
    # Quality next to speed for every converter and the floor.
    for name in ("floor", "naive", "imagerecords"):
        assert rows[name]["psnr_db"] > 25 and 0.5 < rows[name]["ssim"] <= 1, rows[name]
    assert "| PSNR dB | SSIM |" in table
    readers = {r["variant"]: r for r in raw["reader"]["rows"]}
    assert readers["keras_dir"]["ok"] and readers["tfdata_files"]["ok"]
    # The floors are plain tf.data and must always run.
    assert readers["floor_crop_decode"]["ok"] and readers["floor_full_decode"]["ok"]
    codec_rows = {r["codec"]: r for r in raw["codecs"]["rows"]}
    assert set(codec_rows) == set(CODECS)
    assert codec_rows["pillow_bicubic"]["ok"] and codec_rows["pillow_bicubic"]["psnr_db"] > 25
    assert codec_rows["pillow_bicubic"]["speed_vs_floor"] == 1.0
    for label in CODEC_LABELS.values():
        assert f"| web | {label} |" in table
    # Every row is either measured or says why not.
    for row in [*rows.values(), *readers.values(), *codec_rows.values()]:
        assert row["ok"] or row["note"]
    # The GPU part: measured where there is one, else it says it was skipped.
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        assert raw["gpu"]["rows"]
    else:
        assert (
            raw["gpu"]["skipped"].startswith("skipped: no GPU") and raw["gpu"]["skipped"] in table
        )


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_path_stores_the_floors_image(codec):
    """Same size, upright (EXIF orientation applied) and close to the floor's pixels.

    A path that ignored the orientation, mixed up the target's axes or lost
    colour would fail: the study compares like with like only if this holds.
    """
    why = codec_paths.unavailable(codec)
    if why:
        pytest.skip(why)
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:600, 0:900]
    pixels = np.stack([xx % 256, yy % 256, (xx + yy) % 256], axis=2).astype(np.uint8)
    pixels[:300, :450] = rng.integers(0, 256, 3)  # an asymmetric block shows any rotation
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=95, exif=exif.tobytes())
    data = buffer.getvalue()
    want = np.asarray(Image.open(io.BytesIO(codec_paths.PATHS["pillow_bicubic"](data))))
    got_image = Image.open(io.BytesIO(codec_paths.PATHS[codec](data)))
    got = np.asarray(got_image.convert("RGB"))
    assert got_image.format == "JPEG" and got.shape == want.shape == (384, 256, 3)
    assert quality.psnr(want, got) > 25


def test_report_marks_missing_numbers_and_ratios():
    results = {
        "machine": {
            "nproc": 2,
            "cpu_model": "cpu",
            "ram_gib": 1.0,
            "os": "Linux",
            "python": "3.11",
            "versions": {},
            "libjpeg": "libjpeg-turbo",
            "loadavg_start": [0, 0, 0],
        },
        "sizes": "quick",
        "finished_at": "now",
        "data": [],
        "converter": {
            "measured_at": "now",
            "rows": [
                {"image_set": "web", "converter": "floor", "images_per_s": 100.0, "note": ""},
                {"image_set": "web", "converter": "imagerecords", "images_per_s": 96.0, "note": ""},
                {"image_set": "web", "converter": "naive", "images_per_s": None, "note": "failed"},
            ],
        },
    }
    for row in results["converter"]["rows"]:
        for key in ("mb_per_s", "wall_s", "work_images_per_s", "cpu_s", "peak_tree_rss_mb"):
            row.setdefault(key, None)
    ratios = report.ratios(results)
    assert ratios["converter_web_vs_floor"] == pytest.approx(0.96)
    text = report.markdown(results)
    assert "0.96x" in text and "n/a" in text and "**met**" in text  # the goal: >= 0.95x


def test_scale_part_links_distinct_images_and_summarizes(tmp_path):
    from bench.common import data
    from bench.scale import growth as scale

    base = tmp_path / "web"
    (base / "cat").mkdir(parents=True)
    for name in ("a.jpg", "b.png"):
        (base / "cat" / name).write_bytes(b"x" * 10)
    image_set = data.ImageSet("web", base, 2, 20, 0.1, {})
    folder, images = scale.scaled_set(image_set, 3, tmp_path)
    names = sorted(p.name for p in data.list_images(folder))
    assert images == 6 and names == ["a-000.jpg", "a-001.jpg", "a-002.jpg", "b-000.png",
                                     "b-001.png", "b-002.png"]  # fmt: skip
    assert scale.scaled_set(image_set, 3, tmp_path) == (folder, 6)  # cached

    def row(converter, factor, images, work_s, rss):
        return scale.ScaleRow(converter, factor, images, True, work_s=work_s,
                              peak_tree_rss_mb=rss)  # fmt: skip

    rows = [row("floor", 1, 100, 1.0, 50), row("imagerecords", 1, 100, 3.0, 200),
            row("floor", 8, 800, 8.0, 50), row("imagerecords", 8, 800, 10.0, 214)]  # fmt: skip
    summary = scale.summarize(rows)
    assert summary["rss_ratio"] == {"x1": 1.0, "x8": 1.07}
    assert summary["kb_per_extra_image"] == pytest.approx(20.0)
    assert summary["marginal_images_per_s"]["x1-x8"] == pytest.approx(100.0)
    assert summary["marginal_vs_floor"]["x1-x8"] == pytest.approx(1.0)


def test_many_small_files_are_distinct_decodable_jpegs_in_class_folders(tmp_path):
    from bench.common import data
    from bench.scale import growth as scale

    folder = scale.many_small_set(250, tmp_path)
    files = data.list_images(folder)
    assert len(files) == 250 and len({f.parent for f in files}) == 250  # <= 1,000 classes
    contents = [f.read_bytes() for f in files]
    assert len(set(contents)) == 250  # no two are duplicates to the converter
    with Image.open(files[7]) as image:
        assert image.format == "JPEG" and image.size == (scale.MANY_SIDE, scale.MANY_SIDE)
        image.load()
    stamp = folder.with_suffix(".json").stat().st_mtime_ns
    assert scale.many_small_set(250, tmp_path) == folder  # cached: not written again
    assert folder.with_suffix(".json").stat().st_mtime_ns == stamp
    more = scale.many_small_set(2500, tmp_path)
    assert len({f.parent.name for f in data.list_images(more)}) == 1000


def test_many_summary_compares_the_resumed_run_with_the_full_one():
    from bench.scale import growth as scale

    def row(images, run, rss):
        return scale.ManyRow(images, run, True, peak_tree_rss_mb=rss)

    rows = [row(1000, "full", 100), row(1000, "killed", 90), row(1000, "resumed", 110),
            row(11000, "full", 110), row(11000, "killed", 95), row(11000, "resumed", 120)]  # fmt: skip
    summary = scale.summarize_many(rows, {1000: True, 11000: False})
    assert summary["resumed_vs_full"] == {"1000": pytest.approx(1.1),
                                          "11000": pytest.approx(120 / 110)}  # fmt: skip
    assert summary["bytes_per_extra_image"] == {"full": 1000.0, "resumed": 1000.0}
    text = scale.many_markdown({"measured_at": "t", "code": "c", "loadavg": [1], "loadavg_end": [2],
                                "rows": [dataclasses.asdict(r) for r in rows],
                                "summary": summary})  # fmt: skip
    assert (
        "| 1,000 | resumed |" in text
        and "resumed output byte-identical to the full run's: False" in text
    )
    assert "(goal <= 1.2: met)" in text


def test_reuse_part_grows_a_folder_and_compares_outputs(tmp_path):
    from PIL import Image

    from bench.common import data
    from bench.scale import reuse

    base = tmp_path / "web"
    (base / "cat").mkdir(parents=True)
    for n in range(200):
        image = Image.new("RGB", (8, 8), (n, 0, 0))
        image.putpixel((0, 0), (255, 255, 255))  # not symmetric: a mirrored copy differs
        image.save(base / "cat" / f"{n:03d}.png")
    image_set = data.ImageSet("web", base, 200, 0, 0.0, {})
    grown = reuse.grow(image_set, 1, tmp_path)
    before = {p.name: p.read_bytes() for p in data.list_images(grown.before)}
    after = {p.name: p.read_bytes() for p in data.list_images(grown.after)}
    # 1% new, 0.5% changed (same name, new bytes), 0.5% removed.
    assert (grown.new, grown.changed, grown.removed, grown.images) == (2, 1, 1, 199)
    assert len(set(after) - set(before)) == 2 and len(set(before) - set(after)) == 1
    assert sum(before[n] != after[n] for n in set(before) & set(after)) == 1
    assert reuse.grow(image_set, 1, tmp_path) == grown  # cached

    full, new = tmp_path / "full", tmp_path / "new"
    for out, extra in ((full, {}), (new, {"reuse": {"dataset": "x", "images_reused": 3}})):
        out.mkdir()
        (out / "train.tfrecord").write_bytes(b"records")
        (out / "imagerecords.json").write_text(json.dumps({"splits": {}, **extra}))
    assert reuse.same_as_full(new, full)
    (new / "train.tfrecord").write_bytes(b"other")
    assert not reuse.same_as_full(new, full)
