"""Group-aware splits (--group_by, a manifest's group column): no group in two splits,
stable as the folder grows, reported when the layout's own splits part a group.

The Dask engine's run of the same folder is in tests/test_dask.py (its cluster
fixture lives there).
"""

from __future__ import annotations

import io
import json
import os
import random
import re

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.cli import arguments, dryrun, summary
from beam_pipeline.core import groups, keys, metadata
from beam_pipeline.core.errors import UsageError
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.storage import discovery
from tests import contract
from tests.image_factory import jpeg_bytes, photo

GROUP_BY = r"^[^/]+/(p\d+)_"  # cat/p07_2.jpg is in group p07 (with dog/p07_*.jpg)
PATIENTS, PER_PATIENT = 30, 4


def write_image(root, rel: str, seed: int) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(jpeg_bytes(photo(24, 20, seed=seed)))


def grouped_folder(root, patients=PATIENTS, per_patient=PER_PATIENT) -> list[str]:
    """cat/pNN_K.jpg and dog/pNN_K.jpg: each patient a group across both classes."""
    ids = []
    for label, name in enumerate(("cat", "dog")):
        for p in range(patients):
            for k in range(per_patient):
                rel = f"{name}/p{p:02d}_{k}.jpg"
                write_image(root, rel, seed=label * 10_000 + p * 100 + k)
                ids.append(rel)
    return ids


def group_of_id(image_id: str) -> str:
    return re.search(GROUP_BY, image_id).group(1)


def splits_by_id(out) -> dict[str, str]:
    """image ID -> the split whose shards hold its record."""
    by_split = contract.check_output(str(out), decode=False)
    return {i: split for split, rows in by_split.items() for i in contract.ids(rows)}


def splits_by_group(found: dict[str, str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for image_id, split in found.items():
        out.setdefault(group_of_id(image_id), set()).add(split)
    return out


def convert(root, out, *extra) -> int:
    return main(["--input", str(root), "--output", str(out), "--quiet", *extra])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("grouped") / "images"
    return root, grouped_folder(str(root))


# ------------------------------------------------------------------ the pure part


@pytest.mark.parametrize(
    "pattern, problem",
    [
        (r"p\d+", "has no capture group"),
        (r"(?:p\d+)_", "has no capture group"),
        ("(p", "is not a regular expression"),
        ("[p", "is not a regular expression"),
    ],
)
def test_a_pattern_that_cannot_name_a_group_is_refused(pattern, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        groups.check_group_by(pattern)
    with pytest.raises(UsageError, match=re.escape(problem)):
        JobConfig(
            layout=discovery.Layout("classes", "/in", ("a",)),
            output="/out",
            splits={"train": 1.0},
            group_by=pattern,
        )


@pytest.mark.parametrize(
    "group_by, image_id, column, group",
    [
        (None, "cat/p1_0.jpg", None, None),
        (GROUP_BY, "cat/p1_0.jpg", None, "p1"),
        (GROUP_BY, "cat/x1_0.jpg", None, None),  # no match: its own group
        (r"(p\d*)", "cat/x.tif", None, None),  # no match anywhere
        (r"^(\d*)", "cat/x.jpg", None, None),  # an empty capture names no group
        (r"(?P<id>\w+)/", "cat/p1_0.jpg", None, "cat"),  # a search, the first group
        (GROUP_BY, "cat/p1_0.jpg", "visit9", "visit9"),  # the manifest's column wins
        (None, "cat/p1_0.jpg", "visit9", "visit9"),
    ],
)
def test_group_of(group_by, image_id, column, group):
    assert groups.group_of(group_by, image_id, column) == group


def test_an_image_in_no_group_keeps_its_own_split_and_a_group_takes_its_names():
    fractions = {"train": 0.5, "val": 0.25, "test": 0.25}

    for i in range(200):
        image_id = f"cat/{i}.jpg"
        assert groups.split_of(7, image_id, None, fractions) == keys.assign_split(
            7, image_id, fractions
        )
        assert groups.split_of(7, image_id, "p3", fractions) == keys.assign_split(
            7, "p3", fractions
        )


def _census(rows) -> groups.Census:
    census = groups.Census()
    for split, group, label in rows:
        census.add(split, group, label)
    return census


def test_the_census_adds_up_in_any_order():
    rows = [("train", "p1", 0), ("test", "p1", 1), ("train", None, 0), ("val", "p2", 1)] * 3
    one = groups.info_block(_census(rows), "x", ["train", "val", "test"], None)
    halves = [_census(rows[5:]), _census(rows[:5])]
    assert groups.info_block(groups.merged(halves), "x", ["train", "val", "test"], None) == one
    assert json.dumps(one) == json.dumps(
        groups.info_block(groups.merged(halves[::-1]), "x", ["train", "val", "test"], None)
    )
    assert one["groups"] == 2 + 3  # two named groups, three images in none
    assert one["by_split"]["train"]["groups"] == 1 + 3
    assert one["straddling"] == {"count": 1, "shown": {"p1": {"train": 3, "test": 3}}}


def test_a_group_seen_in_two_sources_is_counted_once_and_parted_only_by_two_splits():
    cat, dog = _census([("train", "p1", 0), ("train", "p2", 0)]), _census([("train", "p1", 1)])
    dog.add("val", "p2", 1)
    total = groups.merged([cat, dog])
    assert total.named == {"p1": ("train", 2), "p2": {"train": 1, "val": 1}}
    assert groups.splits_of(total.named["p1"]) == {"train": 2}
    block = groups.info_block(total, None, ["train", "val"], None)
    assert block["groups"] == 2 and block["by_split"]["train"]["groups"] == 2
    assert block["straddling"] == {"count": 1, "shown": {"p2": {"train": 1, "val": 1}}}


def test_no_groups_and_no_pattern_write_no_block():
    census = _census([("train", None, 0), ("test", None, 0)])
    assert groups.info_block(census, None, ["train", "test"], {"train": 0.5, "test": 0.5}) is None
    block = groups.info_block(census, "(x)", ["train", "test"], {"train": 0.5, "test": 0.5})
    assert block["groups"] == 2 and block["lumpy"] == {}


@pytest.mark.parametrize(
    "images, labels, lumpy",
    [
        # 80/10/10 of one class: nothing to say.
        ({"train": 80, "val": 10, "test": 10}, None, {}),
        # test at 0.04 of 0.1 asked: off by more than a quarter of the ask.
        (
            {"train": 86, "val": 10, "test": 4},
            None,
            {"test": "test has 4 groups: its fraction is 0.04 against 0.1 asked"},
        ),
        # 0.08 against 0.1 is within a quarter.
        ({"train": 82, "val": 10, "test": 8}, None, {}),
        # val all of class 1 while the others are half and half: its mix is far off.
        ({"train": 80, "val": 10, "test": 10}, {"val": 1}, "val"),
    ],
)
def test_a_lumpy_split_is_named_with_its_numbers(images, labels, lumpy):
    rows = []
    for split, n in images.items():
        fixed = (labels or {}).get(split)
        for i in range(n):
            label = fixed if fixed is not None else (i % 2 if labels else 0)
            rows.append((split, f"{split}-group{i}", label))
    fractions = {"train": 0.8, "val": 0.1, "test": 0.1}
    block = groups.info_block(_census(rows), "(x)", list(fractions), fractions)
    if isinstance(lumpy, str):
        assert list(block["lumpy"]) == [lumpy]
        # class 1: 1.0 of val against 0.55 of all; train and test 0.05 off
        assert block["by_split"][lumpy]["class_mix_distance"] == 0.45
        assert block["by_split"]["train"]["class_mix_distance"] == 0.05
        assert block["lumpy"][lumpy] == (
            "val has 10 groups: its class mix is 0.45 from the whole dataset's "
            "(total variation distance; over 0.1)"
        )
    else:
        assert block["lumpy"] == lumpy
    lines = groups.report_lines(block)
    assert lines[0].startswith("groups (--group_by '(x)'): 100 in all; per split: train ")
    assert len(lines) == 1 + len(block["lumpy"])


def test_class_distance():
    assert groups.class_distance({0: 5, 1: 5}, {0: 50, 1: 50}) == 0
    assert groups.class_distance({0: 10}, {1: 3}) == 1
    assert groups.class_distance({0: 3, 1: 1}, {0: 1, 1: 1}) == pytest.approx(0.25)
    assert groups.class_distance({}, {0: 1}) == 0


# ------------------------------------------------------------------ whole runs


@pytest.mark.e2e
def test_no_group_is_in_two_splits_and_both_engines_write_the_same_bytes(folder, tmp_path, capsys):
    root, ids = folder
    assert convert(root, tmp_path / "local", "--group_by", GROUP_BY) == 0
    assert "groups (--group_by" in capsys.readouterr().out
    assert convert(root, tmp_path / "beam", "--group_by", GROUP_BY, "--runner", "DirectRunner") == 0
    local = contract.all_files(str(tmp_path / "local"))
    assert local == contract.all_files(str(tmp_path / "beam"))
    found = splits_by_id(tmp_path / "local")
    assert sorted(found) == sorted(ids)
    by_group = splits_by_group(found)
    assert len(by_group) == PATIENTS and all(len(s) == 1 for s in by_group.values())
    assert len(set(found.values())) == 3  # the groups did land in every split
    block = contract.load_info(str(tmp_path / "local"))["groups"]
    assert block["group_by"] == GROUP_BY and block["groups"] == PATIENTS
    assert block["straddling"] == {"count": 0, "shown": {}}
    per_split = {s: sum(1 for g in by_group.values() if s in g) for s in ("train", "val", "test")}
    assert {s: row["groups"] for s, row in block["by_split"].items()} == per_split
    # Without --group_by the same patients do straddle: the test means something.
    assert convert(root, tmp_path / "plain") == 0
    assert any(len(s) > 1 for s in splits_by_group(splits_by_id(tmp_path / "plain")).values())


@pytest.mark.e2e
def test_adding_ten_percent_more_images_moves_no_group(tmp_path):
    root = tmp_path / "images"
    ids = grouped_folder(str(root))
    assert convert(root, tmp_path / "before", "--group_by", GROUP_BY) == 0
    before = splits_by_id(tmp_path / "before")
    # 10% more: a new image of six old patients in each class, and three new patients.
    added = []
    for name in ("cat", "dog"):
        for p in range(6):
            added.append(f"{name}/p{p:02d}_9.jpg")
        for p in range(PATIENTS, PATIENTS + 3):
            added += [f"{name}/p{p:02d}_{k}.jpg" for k in range(2)]
    for n, rel in enumerate(added):
        write_image(str(root), rel, seed=90_000 + n)
    assert len(added) == len(ids) // 10
    assert convert(root, tmp_path / "after", "--group_by", GROUP_BY) == 0
    after = splits_by_id(tmp_path / "after")
    assert {i: after[i] for i in before} == before
    old_groups = {group_of_id(i): s for i, s in before.items()}
    assert all(
        after[i] == old_groups[group_of_id(i)] for i in added if group_of_id(i) in old_groups
    )
    assert all(len(s) == 1 for s in splits_by_group(after).values())


@pytest.mark.e2e
def test_without_groups_the_output_is_what_it_was(folder, tmp_path):
    root, _ = folder
    assert convert(root, tmp_path / "plain") == 0
    assert convert(root, tmp_path / "none", "--group_by", r"^nothing/(matches)") == 0
    plain = contract.all_files(str(tmp_path / "plain"))
    none = contract.all_files(str(tmp_path / "none"))
    assert "groups" not in json.loads(plain[metadata.INFO_FILE])
    info = json.loads(none.pop(metadata.INFO_FILE))
    assert info.pop("groups")["groups"] == len(splits_by_id(tmp_path / "plain"))
    assert json.loads(plain.pop(metadata.INFO_FILE)) == info
    assert none == plain  # the shards, the lists, TFDS's files


@pytest.mark.e2e
def test_reuse_into_a_grouped_run_writes_what_a_grouped_conversion_writes(folder, tmp_path):
    """A record does not hold its split: an old dataset made without groups is reused
    by a run with them, and the output is that run's full conversion."""
    root, ids = folder
    assert convert(root, tmp_path / "plain") == 0
    assert convert(root, tmp_path / "full", "--group_by", GROUP_BY) == 0
    reuse = ["--group_by", GROUP_BY, "--reuse", str(tmp_path / "plain")]
    assert convert(root, tmp_path / "reused", *reuse) == 0
    full = contract.all_files(str(tmp_path / "full"))
    reused = contract.all_files(str(tmp_path / "reused"))
    info = json.loads(reused.pop(metadata.INFO_FILE))
    assert info.pop("reuse")["images_reused"] == len(ids)
    assert info == json.loads(full.pop(metadata.INFO_FILE))
    assert reused == full


@pytest.mark.parametrize("pattern", [r"p\d+_", "(p"])
def test_a_bad_pattern_is_refused_before_work(folder, tmp_path, capsys, pattern):
    root, _ = folder
    assert convert(root, tmp_path / "out", "--group_by", pattern) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --group_by '{pattern}' ")
    assert not (tmp_path / "out").exists()


def test_the_split_folders_win_and_a_group_they_part_is_reported(tmp_path, capsys):
    root = tmp_path / "images"
    for n, rel in enumerate(
        ["train/cat/p1_0.jpg", "train/cat/p1_1.jpg", "test/cat/p1_2.jpg"]
        + ["train/dog/p2_0.jpg", "test/dog/p3_0.jpg", "train/cat/p4_0.jpg"]
    ):
        write_image(str(root), rel, seed=n)
    assert (
        main(["--input", str(root), "--output", str(tmp_path / "out"), "--group_by", r"/(p\d)_"])
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "warning: 1 group is in two or more splits (the layout's or the manifest's own splits "
        "win over the group's): 'p1' (test 1, train 2)"
    ) in out
    block = contract.load_info(str(tmp_path / "out"))["groups"]
    # In the layout's split order (its folders, sorted).
    assert block["straddling"] == {"count": 1, "shown": {"p1": {"test": 1, "train": 2}}}
    assert splits_by_id(tmp_path / "out")["test/cat/p1_2.jpg"] == "test"  # the folder won
    assert "asked" not in block["by_split"]["train"]  # the folders are the splits


@pytest.mark.e2e
def test_a_manifests_group_column_keeps_its_groups_together(tmp_path, capsys):
    root = tmp_path / "images"
    rng = random.Random(3)
    lines, groups_of = ["path,label,split,group"], {}
    for n in range(120):
        rel = f"img{rng.randrange(10**9):09d}.jpg"  # the name says nothing of the group
        write_image(str(root), rel, seed=n)
        group = f"subject{n % 20}"
        groups_of[rel] = group
        lines.append(f"{rel},{'cat' if n % 2 else 'dog'},,{group}")
    lines.append(f"fixed.jpg,cat,test,{groups_of[rel]}")  # its own split parts its group
    write_image(str(root), "fixed.jpg", seed=999)
    manifest = tmp_path / "m.csv"
    manifest.write_text("\n".join(lines) + "\n")
    argv = ["--manifest", str(manifest), "--input", str(root), "--output"]
    assert main([*argv, str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "groups (the manifest's group column): 20 in all" in out
    found = splits_by_id(tmp_path / "out")
    assert found.pop("fixed.jpg") == "test"
    by_group: dict[str, set[str]] = {}
    for image_id, split in found.items():
        by_group.setdefault(groups_of[image_id], set()).add(split)
    assert len(by_group) == 20 and all(len(s) == 1 for s in by_group.values())
    assert len({s for g in by_group.values() for s in g}) > 1
    block = contract.load_info(str(tmp_path / "out"))["groups"]
    assert block["group_by"] is None and block["straddling"]["count"] == (
        0 if by_group[groups_of[rel]] == {"test"} else 1
    )
    # The same in JSONL, with a number where a string belongs refused with its line.
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps({"path": p, "label": "cat", "group": g}) + "\n" for p, g in groups_of.items()
        )
    )
    assert (
        main(["--manifest", str(jsonl), "--input", str(root), "--output", str(tmp_path / "j")]) == 0
    )
    capsys.readouterr()
    assert all(len(s) == 1 for s in _groups_split(splits_by_id(tmp_path / "j"), groups_of))
    jsonl.write_text(json.dumps({"path": rel, "label": "cat", "group": 7}) + "\n")
    assert main(["--manifest", str(jsonl), "--output", str(tmp_path / "bad")]) == 2
    assert "m.jsonl:1: group must be a string, got 7" in capsys.readouterr().err


def _groups_split(found, groups_of):
    by_group: dict[str, set[str]] = {}
    for image_id, split in found.items():
        by_group.setdefault(groups_of[image_id], set()).add(split)
    return list(by_group.values())


def test_a_resume_with_another_group_by_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    bad_root = tmp_path / "images"
    grouped_folder(str(bad_root), patients=3)
    (bad_root / "cat" / "p00_broken.jpg").write_bytes(b"not a jpeg")
    argv = ["--input", str(bad_root), "--output", str(out), "--max_reject_fraction", "0"]
    # A run that fails its books leaves an unfinished run to resume.
    assert main([*argv, "--group_by", GROUP_BY]) == 1
    capsys.readouterr()
    assert not (out / metadata.INFO_FILE).exists()
    assert main([*argv, "--group_by", r"^([^/]+)/"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"error: --output {out} holds an unfinished run with other settings "
        rf"(group_by ^[^/]+/(p\d+)_ -> ^([^/]+)/); run its command again to resume it, "
        "or pass --overwrite to start afresh"
    )
    assert main(argv) == 2  # and without the flag
    assert "(group_by ^[^/]+/(p\\d+)_ -> None)" in capsys.readouterr().err


def test_the_dry_run_shows_the_group_census(folder, tmp_path, capsys):
    root, _ = folder
    argv = ["--input", str(root), "--output", str(tmp_path / "out"), "--dry_run"]
    assert main([*argv, "--group_by", GROUP_BY]) == 0
    printed = capsys.readouterr().out
    assert convert(root, tmp_path / "real", "--group_by", GROUP_BY) == 0
    real = contract.load_info(str(tmp_path / "real"))
    # The dry run reports what the run writes, line for line.
    for line in groups.report_lines(real["groups"]):
        assert line in printed
    assert not (tmp_path / "out").exists()
    capsys.readouterr()
    assert main(argv) == 0
    assert "groups (" not in capsys.readouterr().out


def test_the_summary_says_how_many_groups_each_split_has(folder, tmp_path, capsys):
    root, _ = folder
    assert (
        main(["--input", str(root), "--output", str(tmp_path / "o"), "--group_by", GROUP_BY]) == 0
    )
    printed = capsys.readouterr().out
    info = contract.load_info(str(tmp_path / "o"))
    line = next(s for s in printed.splitlines() if s.startswith("groups ("))
    per_split = ", ".join(f"{s} {r['groups']}" for s, r in info["groups"]["by_split"].items())
    assert line == f"groups (--group_by '{GROUP_BY}'): {PATIENTS} in all; per split: {per_split}"
    assert summary.format_summary(info, 1.0, {}, None).count("groups (") == 1


def test_dry_run_report_returns_the_block(folder, tmp_path):
    root, _ = folder
    command = arguments.parse_args(
        ["--input", str(root), "--output", str(tmp_path / "o"), "--group_by", GROUP_BY]
    )
    found = dryrun.report(arguments.discover(command), None, out=io.StringIO())
    assert found["groups"]["groups"] == PATIENTS
