"""duplicates.py: groups -> dataset_info block, duplicates.jsonl, --dedupe choices."""

import json

import pytest

from beam_pipeline.features.dedupe import duplicates
from beam_pipeline.features.dedupe.duplicates import Member

CLASSES = ("cat", "dog")


@pytest.mark.parametrize(
    "groups, expected",
    [
        ([], {"groups": 0, "images": 0, "cross_split": 0, "cross_class": 0, "also_in_train": {}}),
        (
            [[Member("a/1", "train", 0), Member("a/2", "train", 0)]],
            {"groups": 1, "images": 2, "cross_split": 0, "cross_class": 0, "also_in_train": {}},
        ),
        (
            [
                [Member("a/1", "train", 0), Member("b/1", "val", 1), Member("b/2", "test", 1)],
                [Member("a/3", "val", 0), Member("a/4", "test", 0)],
                [Member("a/5", "train", 0), Member("b/5", "train", 1)],
            ],
            {
                "groups": 3,
                "images": 7,
                "cross_split": 2,
                "cross_class": 2,
                "also_in_train": {"test": 1, "val": 1},
            },
        ),
    ],
    ids=["none", "same-split-same-class", "mixed"],
)
def test_info_block_counts(groups, expected):
    assert duplicates.info_block(groups, "train") == {**expected, "file": "duplicates.jsonl"}


def test_dedupe_keeps_the_smallest_id_and_names_it():
    members = [Member("b/9", "train", 1), Member("a/1", "val", 0), Member("a/10", "train", 0)]
    assert duplicates.keeper(members) == Member("a/1", "val", 0)
    assert duplicates.dropped(members) == [
        (Member("a/10", "train", 0), "duplicate of a/1"),
        (Member("b/9", "train", 1), "duplicate of a/1"),
    ]


def test_drop_copies_keeps_order_and_gives_each_copy_its_reason():
    records = [Member(i, "train", 0) for i in ("a/1", "b/2", "c/3", "d/4")]
    kept, copies = duplicates.drop_copies(records, {"b/2": "duplicate of a/1", "d/4": "x"})
    assert kept == [records[0], records[2]]
    assert copies == [(records[1], "duplicate of a/1"), (records[3], "x")]
    assert duplicates.drop_copies(records, {}) == (records, [])


def test_jsonl_is_sorted_and_names_classes():
    groups = [
        ("ff", [Member("z/2", "val", 1), Member("z/1", "train", 1)]),
        ("00", [Member("c/1", "train", 0), Member("d/1", "test", 1)]),
    ]
    rows = [json.loads(line) for line in duplicates.jsonl(groups, CLASSES).decode().splitlines()]
    assert [r["sha256"] for r in rows] == ["00", "ff"]
    assert rows[1]["members"] == [
        {"id": "z/1", "split": "train", "label": "dog"},
        {"id": "z/2", "split": "val", "label": "dog"},
    ]


def test_summary_is_loud_only_when_evaluation_images_are_also_in_train():
    quiet = duplicates.info_block([[Member("a", "train", 0), Member("b", "train", 1)]], "train")
    lines = duplicates.summary_lines(quiet, "train")
    assert lines == [
        "duplicates: 1 group of identical files holds 2 images "
        "(across splits: 0, across classes: 1; see duplicates.jsonl)"
    ]
    leak = duplicates.info_block(
        [[Member("a", "train", 0), Member("b", "val", 0), Member("c", "test", 0)]], "train"
    )
    lines = duplicates.summary_lines(leak, "train")
    assert lines[-1].startswith("WARNING: 2 images in test/val also appear in train")
    deduped = duplicates.summary_lines(leak, "train", deduped=True)
    assert not deduped[-1].startswith("WARNING") and "--dedupe kept one" in deduped[-1]
    assert duplicates.summary_lines(duplicates.info_block([], "train"), "train") == []


@pytest.mark.parametrize(
    "evaluation, deduped, line",
    [
        (["val"], False, "WARNING: 1 image in val also appears in train: the model"),
        (["val", "test"], False, "WARNING: 2 images in test/val also appear in train: the model"),
        (["val"], True, "1 image in val was a copy of a train image; --dedupe kept one of each"),
        (["val", "val"], True, "2 images in val were copies of train images; --dedupe kept one"),
    ],
)
def test_leak_line_counts_one_image_in_the_singular(evaluation, deduped, line):
    members = [Member("a", "train", 0)] + [
        Member(f"e{i}", split, 0) for i, split in enumerate(evaluation)
    ]
    block = duplicates.info_block([members], "train")
    assert duplicates.summary_lines(block, "train", deduped=deduped)[-1].startswith(line)


# ------------------------------------------------------------ end to end (CLI)


def _dataset_with_copies(root):
    """6 images in 2 classes, plus copies: same class, other class, and the same bytes 3 times."""
    from tests.image_factory import make_class_folders

    ids = make_class_folders(str(root), classes=("cat", "dog"), per_class=6, nested=False)
    copies = {
        "cat/copy_of_cat_0001.jpg": "cat/cat_0001.jpg",  # same class
        "dog/cat_0002_again.jpg": "cat/cat_0002.jpg",  # another class
        "dog/x1.jpg": "dog/dog_0003.jpg",  # three of a kind, across classes
        "cat/x2.jpg": "dog/dog_0003.jpg",
    }
    for copy, source in copies.items():
        (root / copy).write_bytes((root / source).read_bytes())
    return ids + list(copies), copies


def _groups_expected(split_of, label_of, copies):
    groups = {}
    for copy, source in copies.items():
        groups.setdefault(source, {source}).add(copy)
    members = list(groups.values())
    return {
        "groups": len(members),
        "images": sum(len(g) for g in members),
        "cross_split": sum(len({split_of[i] for i in g}) > 1 for g in members),
        "cross_class": sum(len({label_of[i] for i in g}) > 1 for g in members),
    }, members


@pytest.mark.e2e
@pytest.mark.parametrize(
    "dedupe, mode",
    [
        (False, "--direct_running_mode=in_memory"),
        (True, "--direct_running_mode=in_memory"),
        (True, "--local_processes=2"),  # records spilled by the local pool
    ],
    ids=["report", "dedupe", "dedupe-pool"],
)
def test_identical_files_are_counted_and_dedupe_keeps_the_smallest_id(
    tmp_path, capsys, dedupe, mode
):
    from beam_pipeline.__main__ import main
    from tests import contract

    root = tmp_path / "images"
    ids, copies = _dataset_with_copies(root)
    out = tmp_path / "out"
    argv = ["--input", str(root), "--output", str(out), "--splits", "train=0.5,val=0.5"]
    argv += ["--max_reject_fraction", "0", mode]
    assert main(argv + (["--dedupe"] if dedupe else [])) == 0
    summary = capsys.readouterr().out
    info = contract.load_info(str(out))
    rows = {s: contract.ids(r) for s, r in contract.check_output(str(out)).items()}
    rejects = {r["id"]: r for r in contract.read_rejects(str(out))}
    split_of = {i: s for s, members in rows.items() for i in members}
    split_of.update({i: r["split"] for i, r in rejects.items()})
    label_of = {i: i.split("/")[0] for i in ids}
    expected, members = _groups_expected(split_of, label_of, copies)
    block = info["duplicates"]
    assert {k: block[k] for k in expected} == expected and block["file"] == "duplicates.jsonl"
    lines = (out / "duplicates.jsonl").read_text().splitlines()
    listed = [sorted(m["id"] for m in json.loads(line)["members"]) for line in lines]
    assert sorted(listed) == sorted(sorted(g) for g in members)
    assert f"{expected['groups']} groups of identical files" in summary
    leaked = sum(
        1
        for g in members
        if any(split_of[i] == "train" for i in g)
        for i in g
        if split_of[i] != "train"
    )
    assert ("WARNING" in summary and "also appear in train" in summary) == (
        leaked > 0 and not dedupe
    )
    if not dedupe:
        assert not rejects and sorted(split_of) == sorted(ids)
        return
    # One of each group survives, the smallest ID; the others are rejections naming it.
    for group in members:
        kept = min(group)
        assert kept not in rejects
        for other in sorted(group - {kept}):
            assert rejects[other]["reason"] == f"duplicate of {kept}"
    written = [i for r in rows.values() for i in r]
    assert sorted(written + list(rejects)) == sorted(ids)
    assert len(written) == len(ids) - sum(len(g) - 1 for g in members)


@pytest.mark.parametrize(
    "splits, first",
    [(["val", "train", "test"], "train"), (["a", "b"], "a"), ([], "train")],
)
def test_first_split_is_train_else_the_first(splits, first):
    assert duplicates.first_split(splits) == first
