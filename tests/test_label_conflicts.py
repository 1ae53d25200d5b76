"""Label conflicts: the same picture in two classes is counted, listed with both IDs,
and the summary says which copy was kept and why."""

from __future__ import annotations

import os
import shutil

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.cli import summary
from beam_pipeline.features.dedupe import duplicates
from beam_pipeline.features.dedupe.duplicates import Member
from beam_pipeline.features.near import search as near_search
from tests import contract, near_fixtures

A, B, C = (
    Member("cat/a.jpg", "val", 0),
    Member("dog/a.jpg", "train", 1),
    Member("cat/z.jpg", "train", 0),
)


@pytest.mark.parametrize(
    "groups, kept_by, expected",
    [
        ([[A, C]], duplicates.keeper, []),  # one class: no conflict
        ([[B, A]], duplicates.keeper, [("exact", (A, B), A)]),  # the smallest ID
        ([[B, A]], None, [("exact", (A, B), None)]),  # without --dedupe: both written
        ([[A, B, C]], near_search.keeper, [("exact", (A, C, B), C)]),  # train, then the ID
    ],
)
def test_a_group_in_two_classes_is_a_conflict(groups, kept_by, expected):
    assert duplicates.label_conflicts(groups, "exact", kept_by) == expected


@pytest.mark.parametrize(
    "dedupe, kinds",
    [("", ["exact"]), ("exact", ["exact"]), ("near", ["exact", "near"])],
)
def test_near_conflicts_are_the_runs_only_under_dedupe_near(dedupe, kinds):
    found = duplicates.run_conflicts([[B, A]], [[A, C], [C, B]], dedupe, near_search.keeper)
    assert [c.kind for c in found] == kinds
    # Under --dedupe near, A (kept over B) is then a near copy of C, in train: C is written.
    assert found[0].kept == {"": None, "exact": A, "near": C}[dedupe]
    if dedupe == "near":
        assert found[1] == ("near", (C, B), C)  # both in train: the smallest ID


def test_an_identical_copy_kept_then_dropped_as_near_names_the_onewritten_splits():
    """--dedupe keeps A over B (the smallest ID), then --dedupe near drops A, in test,
    as a near copy of D, in train: D is what the run writes of the picture."""
    a, b, d = (
        Member("cat/a.jpg", "test", 0),
        Member("dog/b.jpg", "val", 1),
        Member("z.jpg", "train", 1),
    )
    found = duplicates.run_conflicts([[b, a]], [[a, d]], "near", near_search.keeper)
    assert found == [("exact", (a, b), d), ("near", (a, d), d)]
    block = duplicates.conflicts_block(found, ["cat", "dog"])
    assert [(r["kept"], r["why"]) for r in block["listed"]] == [
        ("z.jpg", duplicates.KEPT_AFTER_NEAR),
        ("z.jpg", duplicates.KEPT_BECAUSE["near", True]),
    ]
    # Without --dedupe near, A is written.
    assert duplicates.run_conflicts([[b, a]], [[a, d]], "exact", near_search.keeper)[0].kept == a


def test_the_block_lists_both_ids_and_why(tmp_path):
    found = duplicates.label_conflicts([[B, A]], "exact", duplicates.keeper)
    block = duplicates.conflicts_block(found, ["cat", "dog"])
    assert block == {
        "count": 1,
        "exact": 1,
        "near": 0,
        "listed": [
            {
                "kind": "exact",
                "members": [
                    {"id": "cat/a.jpg", "split": "val", "label": "cat"},
                    {"id": "dog/a.jpg", "split": "train", "label": "dog"},
                ],
                "kept": "cat/a.jpg",
                "why": "--dedupe keeps the smallest ID",
            }
        ],
    }
    assert duplicates.conflicts_block([], ["cat"]) is None
    assert duplicates.conflict_lines(block)[1] == (
        "  cat/a.jpg (cat, val) = dog/a.jpg (dog, train): kept cat/a.jpg "
        "(--dedupe keeps the smallest ID)"
    )


@pytest.fixture(scope="module")
def conflicted(tmp_path_factory):
    """The near folder (pre-split) with an identical copy and a near copy in another class."""
    root = near_fixtures.near_folder(str(tmp_path_factory.mktemp("conflicts") / "images"))
    shutil.copy(os.path.join(root, "train/a/coffee.jpg"), os.path.join(root, "train/b/mug.jpg"))
    return root


@pytest.mark.e2e
def test_both_engines_report_the_conflicts_and_write_the_same_bytes(conflicted, tmp_path):
    outs = [str(tmp_path / "local"), str(tmp_path / "beam")]
    common = ["--input", conflicted, "--quiet", "--dedupe", "near", "--max_reject_fraction", "0.6"]
    assert main([*common, "--output", outs[0]]) == 0
    assert main([*common, "--output", outs[1], "--runner", "DirectRunner"]) == 0
    assert contract.all_files(outs[0]) == contract.all_files(outs[1])
    info = contract.load_info(outs[0])
    block = info["label_conflicts"]
    exact = [c for c in block["listed"] if c["kind"] == "exact"]
    assert [[m["id"] for m in c["members"]] for c in exact] == [
        ["train/a/coffee.jpg", "train/b/mug.jpg"]
    ]
    assert exact[0]["kept"] == "train/a/coffee.jpg"
    # astronaut (class a) has a near copy in class b: a near conflict, kept in train.
    near = [c for c in block["listed"] if c["kind"] == "near"]
    assert any(c["kept"] == "train/a/astronaut.jpg" for c in near), near
    assert block["count"] == block["exact"] + block["near"] == len(block["listed"])
    printed = summary.format_summary(info, 1.0, {}, None)
    assert f"WARNING: label conflicts: {block['count']} pictures are in two" in printed
    assert (
        "  train/a/coffee.jpg (a, train) = train/b/mug.jpg (b, train): kept train/a/coffee.jpg "
        "(--dedupe keeps the smallest ID)"
    ) in printed


@pytest.mark.e2e
def test_a_dataset_without_conflicts_has_no_block(tmp_path):
    root = near_fixtures.near_folder(str(tmp_path / "images"))
    shutil.copy(os.path.join(root, "train/a/coffee.jpg"), os.path.join(root, "train/a/mug.jpg"))
    assert main(["--input", root, "--quiet", "--output", str(tmp_path / "o")]) == 0
    info = contract.load_info(str(tmp_path / "o"))
    assert info["duplicates"]["groups"] == 1 and "label_conflicts" not in info


@pytest.mark.e2e
def test_near_conflicts_of_a_grouped_run_name_both_ids_and_the_copywritten_splits(tmp_path, capsys):
    """Near copies in two classes whose groups put them in other splits, and an
    identical copy --dedupe keeps that the near search then drops: the list and the
    summary name every member, and the copy kept is the one the shards hold."""
    from tests import test_near_splits

    root = str(tmp_path / "images")
    test_near_splits.grouped_near_folder(root)
    out = str(tmp_path / "o")
    argv = ["--input", root, "--output", out, "--group_by", test_near_splits.GROUP_BY]
    assert main([*argv, "--dedupe", "near", *test_near_splits.NEAR_DROPS_OK]) == 0
    printed = capsys.readouterr().out
    info = contract.load_info(out)
    block = info["label_conflicts"]
    written = test_near_splits.written_splits(out)
    near = [
        g
        for g in test_near_splits.listed_groups(out, "near_duplicates.jsonl")
        if len({m["label"] for m in g}) > 1
    ]
    listed_near = [c for c in block["listed"] if c["kind"] == "near"]
    assert len(near) >= 2 and block["near"] == len(near)
    assert [c["members"] for c in listed_near] == near  # both IDs, splits and classes
    for conflict in block["listed"]:
        assert conflict["kept"] in written, conflict  # the copy kept is in the shards
        [survivor] = [m for m in conflict["members"] if m["id"] in written] or [
            {"id": conflict["kept"]}
        ]
        assert survivor["id"] == conflict["kept"]
        if conflict["kind"] == "near":
            assert conflict["why"] == duplicates.KEPT_BECAUSE["near", True]
    # An identical pair whose kept copy went as a near copy says so.
    assert any(c["why"] == duplicates.KEPT_AFTER_NEAR for c in block["listed"])
    # The summary names each conflict it shows, with the copy kept and why.
    shown = duplicates.conflict_lines(block)[1:]
    assert any(" = " in line and "--dedupe near keeps" in line for line in shown)
    for conflict in block["listed"][: duplicates.CONFLICTS_SHOWN]:
        who = " = ".join(f"{m['id']} ({m['label']}, {m['split']})" for m in conflict["members"])
        assert f"  {who}: kept {conflict['kept']} ({conflict['why']})" in printed
