"""``--report`` on a dataset converted with ``--group_by`` and ``--dedupe near``, in headless Chromium.

The input (tests/test_near_splits.py's) holds photos with near and identical
copies in groups drawn into other splits, and an identical copy that
``--dedupe`` keeps and the near search then drops: the page must show every
group with its members' IDs, splits, classes and distances, and which copy
survived.
"""

from __future__ import annotations

import json
import os

import pytest

from beam_pipeline.__main__ import main as convert
from reader import inspect as inspect_tool
from reader import load_info, report
from tests import contract, test_near_splits
from tests.test_report import check_in_browser, members

NEAR, ACROSS_CLASSES, IDENTICAL = "near-across-splits", "identical-across-classes", "identical"
NEAR_WITHIN = "near-within-split"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    work = tmp_path_factory.mktemp("report-group-by")
    root = str(work / "images")
    test_near_splits.grouped_near_folder(root)
    out = str(work / "records")
    argv = ["--input", root, "--output", out, "--group_by", test_near_splits.GROUP_BY]
    argv += ["--dedupe", "near", "--min_shards", "2", "--quiet"]
    assert convert([*argv, *test_near_splits.NEAR_DROPS_OK]) == 0
    return out


def _expected(out: str) -> dict[str, list[list[dict]]]:
    """Each section's groups as the lists hold them, in their order."""
    near = test_near_splits.listed_groups(out, "near_duplicates.jsonl")
    exact = test_near_splits.listed_groups(out, "duplicates.jsonl")

    def spread(group, key):
        return len({m[key] for m in group}) > 1

    return {
        NEAR: [g for g in near if spread(g, "split")],
        ACROSS_CLASSES: [g for g in exact if spread(g, "label")],
        IDENTICAL: [g for g in exact if not spread(g, "label")],
        NEAR_WITHIN: [g for g in near if not spread(g, "split")],
    }


def _distances(out: str) -> dict[str, int]:
    """Each near copy's least distance to another member of its group."""
    path = os.path.join(out, "near_duplicates.jsonl")
    least: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            for pair in json.loads(line)["pairs"]:
                for i in (pair["a"], pair["b"]):
                    least[i] = min(least.get(i, pair["distance"]), pair["distance"])
    return least


@pytest.mark.e2e
def test_the_grouped_report_shows_each_group_its_members_and_the_copy_kept(dataset, tmp_path):
    page_file = tmp_path / "report.html"
    assert inspect_tool.main([dataset, "--report", str(page_file), "--no_shuffle_check"]) == 0
    page = check_in_browser(page_file, tmp_path)  # renders, every image decodes, no fetch
    written = test_near_splits.written_splits(dataset)
    rejects = {r["id"]: r for r in contract.read_rejects(dataset)}
    distance = _distances(dataset)
    expected = _expected(dataset)
    # The input makes every kind of group, and one identical copy that --dedupe kept
    # and the near search dropped, so its group's survivor is outside the group.
    assert len(expected[NEAR]) >= 2 and len(expected[ACROSS_CLASSES]) >= 2
    assert expected[IDENTICAL] and expected[NEAR_WITHIN]
    assert any(not any(m["id"] in written for m in g) for g in expected[ACROSS_CLASSES])
    for section, groups in expected.items():
        shown = members(page, section)
        assert [[f["id"] for f in g] for g in shown] == [[m["id"] for m in g] for g in groups]
        for group, figures in zip(groups, shown, strict=True):
            for member, figure in zip(group, figures, strict=True):
                said = figure["text"].replace("\n", "")
                assert member["id"] in said and f"{member['split']} · {member['label']}" in said
                if section in (NEAR, NEAR_WITHIN):
                    assert f"distance {distance[member['id']]}" in said
                if member["id"] in written:  # written: its own thumbnail
                    assert figure["class"] == "kept" and figure["img"]["alt"] == member["id"]
                    assert written[member["id"]] == member["split"]
                else:  # dropped: no picture, and its reason names the copy kept
                    assert figure["class"] == "dropped" and figure["img"] is None
                    assert f"dropped: {rejects[member['id']]['reason']}" in said
            drops = [m["id"] for m in group if m["id"] not in written]
            [survivor] = {test_near_splits.kept_in_the_end(i, rejects, written) for i in drops}
            where = (
                "" if survivor in {m["id"] for m in group} else " (a near copy, not in this group)"
            )
            assert (
                f"--dedupe kept {survivor}{where}, dropped {len(drops)}" in page.sections[section]
            )
            assert survivor in written


@pytest.mark.e2e
def test_a_section_over_its_cap_says_how_many_it_leaves_out(dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "MEMBERS_SHOWN", 2)
    page_file = tmp_path / "capped.html"
    info = load_info(dataset)
    report.write_report(info, str(page_file), ["train"], 4, 0, groups_shown=1)
    page = check_in_browser(page_file, tmp_path)
    expected = _expected(dataset)
    for section in (NEAR, ACROSS_CLASSES):
        [group] = members(page, section)
        assert [f["id"] for f in group] == [m["id"] for m in expected[section][0]][:2]
        left = len(expected[section]) - 1
        noun = "group" if left == 1 else "groups"
        assert (
            f"{left} more {noun} not shown (the page shows the first 1)" in page.sections[section]
        )
    big = max(len(g) for g in expected[NEAR][:1])
    assert big > 2 and f"{big - 2} more not shown" in page.sections[NEAR]
