"""``--dry_run``: writes nothing, and its estimates hold against a real run."""

from __future__ import annotations

import collections
import json
import math
import os
import shutil

import pytest

from beam_pipeline.__main__ import main, run
from beam_pipeline.cli import dryrun, estimates, forecast
from beam_pipeline.core import groups, keys
from beam_pipeline.core.elements import RecordBatch, Rejection, RejectKind, ShardEntry
from beam_pipeline.features.near import stage as near
from beam_pipeline.stages.job_config import JobConfig
from tests import contract, near_fixtures
from tests.image_factory import add_bad_files, make_class_folders

IN_MEMORY = "--direct_running_mode=in_memory"


def _tree(path) -> dict[str, tuple[int, int]]:
    """Every file and folder below ``path`` with its size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            stat = os.stat(full)
            out[os.path.relpath(full, path)] = (stat.st_size, stat.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    base = tmp_path_factory.mktemp("dryrun")
    root = base / "images"
    ids = make_class_folders(str(root), per_class=60, size_range=(60, 260))
    bad = add_bad_files(str(root))
    (root / "dog" / ".DS_Store").write_bytes(b"\0hidden")
    (root / "README.txt").write_text("not in a class folder\n")
    (root / "fish" / "LICENSE.md").write_text("skipped by its extension\n")
    return base, root, ids, bad


FLAGS = ["--splits", "train=0.6,val=0.4", "--target_shard_mb", "0.1", "--image_size", "128"]


@pytest.mark.e2e
def test_dry_run_writes_nothing_and_its_estimates_match_a_real_run(
    images, tmp_path, monkeypatch, capsys
):
    base, root, ids, bad = images
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)  # a stray relative write would land here
    # Fewer samples than images, so the estimates really extrapolate.
    monkeypatch.setattr(dryrun, "SAMPLE_SIZE", 60)
    before_input, before_here = _tree(base), _tree(tmp_path)
    argv = ["--input", str(root), "--output", str(out), "--dry_run", *FLAGS]
    estimate = run(argv)
    printed = capsys.readouterr().out

    assert _tree(base) == before_input
    assert _tree(tmp_path) == before_here
    assert not out.exists()
    assert estimate["sampled"] == 60
    assert estimate["images"] == len(ids) + len(bad)
    assert estimate["skipped"] == {
        "hidden": 1,
        "not inside a class folder": 1,
        "not an image file (.md)": 1,
    }
    assert "skipped (hidden): 1 file, e.g. dog/.DS_Store" in printed
    assert "other extensions (converted if the content is an image): .dat 1" in printed
    assert "vCPU-hours" in printed and "n2-standard-4" in printed
    assert "local run (local engine, " in printed  # no Beam flag: the local engine would run

    # The real run rejects 2 of 181, above the default 1 %: allow that.
    argv = ["--input", str(root), "--output", str(out), "--quiet", IN_MEMORY, *FLAGS]
    assert main(argv + ["--max_reject_fraction", "0.05"]) == 0
    info = contract.load_info(str(out))
    for name, split in info["splits"].items():
        guess = estimate["splits"][name]
        assert guess["images"] == split["num_examples"] + info["rejected"]["by_split"][name]
        assert guess["bytes"] == pytest.approx(split["num_bytes"], rel=0.25), name
        assert guess["shards"] == pytest.approx(len(split["shards"]), rel=0.25), name
    assert len(info["splits"]["train"]["shards"]) >= 4  # shard counts that can be wrong


def test_dry_run_says_when_the_real_run_would_refuse_the_output(images, tmp_path, capsys):
    _, root, _, _ = images
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    before = _tree(tmp_path)
    assert main(["--input", str(root), "--output", str(out), "--dry_run"]) == 0
    assert "warning: the real run would stop before starting" in capsys.readouterr().out
    assert _tree(tmp_path) == before


def test_dry_run_counts_presplit_and_manifest_layouts(tmp_path, capsys):
    root = tmp_path / "presplit"
    train = make_class_folders(str(root / "train"), classes=("a", "b"), per_class=5, nested=False)
    val = make_class_folders(str(root / "val"), classes=("a", "b"), per_class=2, nested=False)
    estimate = run(["--input", str(root), "--output", str(tmp_path / "o1"), "--dry_run"])
    assert {k: v["images"] for k, v in estimate["splits"].items()} == {
        "train": len(train),
        "val": len(val),
    }
    manifest = tmp_path / "list.jsonl"
    rows = [{"path": f"presplit/train/{i}", "label": i.split("/")[0]} for i in train]
    rows += [{"path": f"presplit/val/{i}", "label": "b", "split": "extra"} for i in val]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    estimate = run(["--manifest", str(manifest), "--output", str(tmp_path / "o2"), "--dry_run"])
    counts = {k: v["images"] for k, v in estimate["splits"].items()}
    assert counts["extra"] == len(val)
    assert sum(counts.values()) == len(train) + len(val)
    assert list(counts)[:3] == ["train", "val", "test"]  # --splits order, then the manifest's
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    capsys.readouterr()


@pytest.mark.e2e
def test_dry_run_on_gcs_writes_nothing_there(gcs_emulator, tmp_path, capsys):
    local = tmp_path / "images"
    make_class_folders(str(local), per_class=4, size_range=(60, 120))
    bucket = gcs_emulator.create_bucket()
    gcs_emulator.upload_dir(local, f"gs://{bucket}/images")
    gcs_emulator.upload_bytes(f"gs://{bucket}/images/cat/.hidden.jpg", b"x")
    before = gcs_emulator.list_names(f"gs://{bucket}")
    estimate = run(
        ["--input", f"gs://{bucket}/images", "--output", f"gs://{bucket}/out", "--dry_run"]
        + ["--machine_type", "c3-highcpu-8"]
    )
    assert gcs_emulator.list_names(f"gs://{bucket}") == before
    assert estimate["images"] == 12 and estimate["sampled"] == 12
    assert estimate["skipped"] == {"hidden": 1}
    assert estimate["reject_rate"] == 0
    assert "c3-highcpu-8 (8 vCPU, 16 GB)" in capsys.readouterr().out


def test_a_bad_machine_type_is_a_usage_error(images, tmp_path, capsys):
    _, root, _, _ = images
    argv = ["--input", str(root), "--output", str(tmp_path / "o"), "--dry_run"]
    assert main(argv + ["--machine_type", "n9-weird-4"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown machine type 'n9-weird-4'")


@pytest.mark.parametrize(
    "name, vcpus, memory",
    [
        ("n2-standard-4", 4, 16.0),
        ("n1-standard-8", 8, 30.0),
        ("c3-highcpu-22", 22, 44.0),
        ("e2-highmem-2", 2, 16.0),
        ("custom-6-12288", 6, 12.0),
        ("n2-custom-8-16384", 8, 16.0),
    ],
)
def test_machine_types(name, vcpus, memory):
    machine = estimates.machine_type(name)
    assert (machine.vcpus, machine.memory_gb) == (vcpus, memory)


@pytest.mark.parametrize("name", ["n2-standard", "standard-4", "z9-standard-4", ""])
def test_unknown_machine_types(name):
    with pytest.raises(ValueError, match="unknown machine type"):
        estimates.machine_type(name)


def _census(listed: int) -> dryrun.InputCensus:
    keys_ = [keys.order_key(42, f"img{i}") for i in range(listed)]
    listed_keys = {"train": keys_} if listed else {}
    return dryrun.InputCensus([], {}, listed_keys, {}, collections.Counter(), None, groups.Census())


@pytest.mark.parametrize(
    "listed, sizes, rejected, target, minimum, expected",
    [
        (0, [100], 0, 100, 1, (0, 0, 0, 0)),  # no image listed: no shard
        (1, [500], 0, 100, 1, (1, 0, 500, 1)),  # 5 shards wanted, one record: one shard
        (1000, [0, 1], 0, 100, 1, (1000, 0, 500, 5)),
        (10, [100], 0, 100, 1, (10, 0, 1000, 10)),  # ceil(bytes / target), capped by the records
        (100, [0, 1], 0, 100, 4, (100, 0, 50, 4)),  # --min_shards
        (8, [100, 100, 100], 1, 100, 1, (6, 2, 600, 6)),  # a quarter of the sample rejected
    ],
)
def test_the_job_plans_the_splits_of_the_estimate(
    listed, sizes, rejected, target, minimum, expected
):
    """The sample's reject rate and mean record size applied to the listed keys,
    cut into shards by the job's Plan stage."""
    entries = [ShardEntry(n, f"r{n}", 0, size, b"") for n, size in enumerate(sizes)]
    bad = [Rejection("x", "x", "train", "bad", RejectKind.BAD_IMAGE)] * rejected
    sample = dryrun.Sample(len(sizes) + rejected, {"train": entries}, bad, 0, 0, False)
    config = JobConfig(
        layout=None,
        output="o",
        splits={"train": 1.0},
        target_shard_bytes=target,
        min_shards=minimum,
    )
    copies = dryrun.find_copies(sample, "")
    [estimate] = dryrun.estimate_splits(_census(listed), sample, copies, ["train"], config, False)
    assert estimate.images == listed
    assert (estimate.records, estimate.rejects, estimate.bytes, estimate.shards) == expected


@pytest.mark.e2e
def test_a_dry_run_that_samples_every_image_plans_the_shards_the_job_writes(tmp_path):
    root = tmp_path / "images"
    make_class_folders(str(root), per_class=10, size_range=(60, 200))
    flags = ["--splits", "train=1.0", "--target_shard_mb", "0.02", "--min_shards", "2"]
    estimate = run(["--input", str(root), "--output", str(tmp_path / "o"), "--dry_run", *flags])
    assert estimate["sampled"] == estimate["images"]  # the sample is the whole input
    assert main(["--input", str(root), "--output", str(tmp_path / "o"), "--quiet", *flags]) == 0
    split = contract.load_info(str(tmp_path / "o"))["splits"]["train"]
    guess = estimate["splits"]["train"]
    assert (guess["records"], guess["bytes"]) == (split["num_examples"], split["num_bytes"])
    assert guess["shards"] == len(split["shards"]) > 2


def test_dataflow_cost_adds_up_workers_memory_disk_shuffle_and_reads():
    machine = estimates.machine_type("n2-standard-4")
    prices = estimates.Prices(
        vcpu_hour=1.0, gb_hour=0.5, shuffle_gb=2.0, pd_gb_hour=0.01, disk_gb=25, gcs_read_1000=0.1
    )
    # 3,600 images at 0.3 CPU-s each, times the planning factor: 0.3 * factor vCPU-hours.
    cost = estimates.dataflow_cost(3600, 0.3, 3e9, machine, prices)
    vcpu_h = 0.3 * estimates.DATAFLOW_FACTOR
    assert cost.vcpu_hours == pytest.approx(vcpu_h)
    assert cost.worker_hours == pytest.approx(vcpu_h / 4)
    assert cost.shuffle_gb == pytest.approx(6)  # written and read
    assert cost.usd == pytest.approx(
        vcpu_h * 1.0 + vcpu_h / 4 * (16 * 0.5 + 25 * 0.01) + 6 * 2.0 + 3.6 * 0.1
    )


def test_local_wall_time_scales_with_processes():
    one = estimates.local_wall_s(10_000, 0.004, 1) - estimates.LOCAL_FIXED_S
    four = estimates.local_wall_s(10_000, 0.004, 4) - estimates.LOCAL_FIXED_S
    assert one == pytest.approx(40 / estimates.LOCAL_EFFICIENCY)
    assert math.isclose(one / four, 4)
    # On Beam (any Beam flag) the same job pays Beam's start-up and runner work.
    beam = estimates.local_wall_s(10_000, 0.004, 1, on_beam=True)
    assert beam == pytest.approx(
        estimates.BEAM_LOCAL_FIXED_S + 40 / estimates.BEAM_LOCAL_EFFICIENCY
    )
    assert beam > estimates.local_wall_s(10_000, 0.004, 1)


@pytest.mark.parametrize(
    "reason, kind",
    [
        ("corrupt image: OSError: broken data stream", "corrupt image"),
        ("not an image: content is not JPEG, PNG, GIF, BMP, WebP or TIFF", "not an image"),
        ("empty file", "empty file"),
        ("cannot read: FileNotFoundError: gone", "cannot read"),
    ],
)
def test_reason_kind(reason, kind):
    assert forecast.reason_kind(reason) == kind


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """Photos with near copies across splits (the pre-split layout), an identical copy
    in another split and class, and two bad files."""
    root = near_fixtures.near_folder(str(tmp_path_factory.mktemp("copies") / "images"), True)
    shutil.copy(os.path.join(root, "train/a/coffee.jpg"), os.path.join(root, "val/b/coffee.jpg"))
    shutil.copy(os.path.join(root, "train/b/chelsea.jpg"), os.path.join(root, "train/b/c2.jpg"))
    with open(os.path.join(root, "val/a/cut.jpg"), "wb") as f:
        f.write(open(os.path.join(root, "val/b/camera.jpg"), "rb").read()[:300])
    return root


def _rejects_by_split(out) -> tuple[collections.Counter, collections.Counter]:
    """(bad images, dropped copies) per split, from the run's rejects.jsonl."""
    bad, dropped = collections.Counter(), collections.Counter()
    with open(os.path.join(out, "rejects.jsonl")) as f:
        for row in map(json.loads, f):
            copy = row["reason"].startswith(("duplicate of ", "near duplicate of "))
            (dropped if copy else bad)[row["split"]] += 1
    return bad, dropped


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["exact", "near"])
def test_a_dry_run_of_the_whole_input_forecasts_what_dedupe_writes(copies, tmp_path, capsys, mode):
    out = str(tmp_path / "o")
    flags = ["--dedupe", mode, "--max_reject_fraction", "0.5", "--target_shard_mb", "0.05"]
    estimate = run(["--input", copies, "--output", out, "--dry_run", *flags])
    printed = capsys.readouterr().out
    assert estimate["whole"] and estimate["sampled"] == estimate["images"]
    assert "the sample is the whole input: records, rejects and drops per split" in printed
    assert main(["--input", copies, "--output", out, "--quiet", *flags]) == 0
    info = contract.load_info(out)
    bad, dropped = _rejects_by_split(out)
    assert sum(dropped.values()) >= (2 if mode == "exact" else 6)  # the folder has copies
    assert sum(bad.values()) == 2
    _assert_forecast_is_the_run(estimate, info, bad, dropped)  # coffee.jpg in classes a and b
    assert "label conflicts: " in printed
    line = next(s for s in printed.splitlines() if s.startswith(f"--dedupe {mode} drops"))
    assert line.startswith(f"--dedupe {mode} drops {sum(dropped.values())} copies")


def test_a_sample_that_is_not_the_whole_input_says_so(copies, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dryrun, "SAMPLE_SIZE", 5)
    estimate = run(["--input", copies, "--output", str(tmp_path / "o"), "--dry_run"])
    printed = capsys.readouterr().out
    assert not estimate["whole"] and estimate["sampled"] == 5
    assert f"the sample is 5 of {estimate['images']} images: the counts are estimates" in printed


def test_a_partial_sample_spreads_drops_by_each_splits_own_rate():
    """--dedupe near keeps the train copy: the drops of the sample's val images are val's."""
    entries = {
        s: [ShardEntry(n, f"{s}{n}", 0, 100, b"") for n in range(4)] for s in ("train", "val")
    }
    kept = [RecordBatch("train", tuple(entries["train"])), RecordBatch("val", ())]
    dropped = tuple(
        Rejection(e.image_id, "", "val", "near duplicate of x", RejectKind.NEAR_DUPLICATE)
        for e in entries["val"][:2]
    )
    sample = dryrun.Sample(8, entries, [], 0, 0, False)
    copies = dryrun.Copies(tuple(kept), dropped, (), near.Found())
    census = _census(0)
    census.listed.update({s: [keys.order_key(42, f"{s}/{i}") for i in range(10)] for s in entries})
    config = JobConfig(layout=None, output="o", splits={"train": 0.5, "val": 0.5})
    train, val = dryrun.estimate_splits(census, sample, copies, ["train", "val"], config, False)
    assert (train.records, train.drops, val.records, val.drops) == (10, 0, 5, 5)


@pytest.mark.e2e
def test_the_dry_run_warns_when_near_drops_would_pass_the_reject_limit(copies, tmp_path, capsys):
    """Near drops count towards --max_reject_fraction in the run: the forecast says so too."""
    flags = ["--dedupe", "near", "--max_reject_fraction", "0.2"]
    out = str(tmp_path / "o")
    estimate = run(["--input", copies, "--output", out, "--dry_run", *flags])
    printed = capsys.readouterr().out
    assert estimate["whole"]
    dropped = estimate["duplicates"]["dropped_near"]
    bad = estimate["reject_rate"] * estimate["sampled"]
    assert bad / estimate["sampled"] <= 0.2 < (bad + dropped) / estimate["sampled"]
    assert "rejected (near drops included) is above --max_reject_fraction 0.2" in printed
    assert "the job would fail" in printed
    assert main(["--input", copies, "--output", out, "--quiet", *flags]) != 0


@pytest.fixture(scope="module")
def grouped_copies(tmp_path_factory):
    """Class folders with near and identical copies in --group_by groups drawn into
    other splits (tests/test_near_splits.py's), and a bad file in a group."""
    from tests import test_near_splits

    root = str(tmp_path_factory.mktemp("grouped-copies") / "images")
    drawn = test_near_splits.grouped_near_folder(root)
    group = next(i for i, s in drawn.items() if s == "val").split("/")[1].split("_")[0]
    with open(os.path.join(root, "a", f"{group}_broken.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff not a JPEG after all")
    return root, test_near_splits.GROUP_BY


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["exact", "near"])
def test_a_grouped_dry_run_of_the_whole_input_forecasts_what_dedupe_writes(
    grouped_copies, tmp_path, capsys, mode
):
    root, group_by = grouped_copies
    out = str(tmp_path / "o")
    flags = ["--dedupe", mode, "--group_by", group_by, "--max_reject_fraction", "0.6"]
    flags += ["--target_shard_mb", "0.05"]
    estimate = run(["--input", root, "--output", out, "--dry_run", *flags])
    printed = capsys.readouterr().out
    assert estimate["whole"] and estimate["sampled"] == estimate["images"]
    assert "the sample is the whole input: records, rejects and drops per split" in printed
    assert main(["--input", root, "--output", out, "--quiet", *flags]) == 0
    info = contract.load_info(out)
    bad, dropped = _rejects_by_split(out)
    # Copies in every split are dropped (the groups put them there), and the bad file.
    assert len(dropped) == 3 and sum(bad.values()) == 1
    _assert_forecast_is_the_run(estimate, info, bad, dropped)
    line = next(s for s in printed.splitlines() if s.startswith(f"--dedupe {mode} drops"))
    assert line.startswith(f"--dedupe {mode} drops {sum(dropped.values())} copies")


def _assert_forecast_is_the_run(estimate: dict, info: dict, bad: dict, dropped: dict) -> None:
    """The dry run's forecast per split and its three blocks are what the run wrote."""
    for name, split in info["splits"].items():
        guess = estimate["splits"][name]
        assert guess["records"] == split["num_examples"], name
        assert (guess["rejects"], guess["drops"]) == (bad[name], dropped[name]), name
        assert (guess["bytes"], guess["shards"]) == (split["num_bytes"], len(split["shards"]))
    blocks = estimate["duplicates"]
    assert blocks["exact"] == info["duplicates"]
    assert blocks["near"] == info["near_duplicates"]
    assert blocks["conflicts"] == info["label_conflicts"]
