"""``--dedupe near`` leaves no found group spanning splits, with and without ``--group_by``.

The folder (class folders, splits drawn) holds photos with near and identical
copies in groups the seeded draw puts in other splits; every engine must keep
one member of each picture's copies and write the same bytes.
"""

from __future__ import annotations

import collections
import json
import os
import shutil

import pytest
from PIL import Image, ImageEnhance

from beam_pipeline.__main__ import main
from beam_pipeline.core import groups, keys
from beam_pipeline.core.elements import RejectKind
from imagerecords import RecordSource
from tests import contract, near_fixtures
from tests.test_dask import dask_cluster  # noqa: F401 (its cluster fixture, by name)

# The group is the word between the class folder and the first "_": a/g3_coffee.jpg is g3's.
GROUP_BY = r"^[^/]+/([^_]+)_"
SPLITS = keys.parse_splits(keys.DEFAULT_SPLITS)
SEED = 42
# Group slots, each the name of a group the draw puts in that split.
SLOTS = {"T1": "train", "T2": "train", "V1": "val", "V2": "val", "S1": "test", "S2": "test"}


def _brighter(im: Image.Image) -> Image.Image:
    return ImageEnhance.Brightness(im).enhance(1.08)


# How a copy is made and saved: near_fixtures' kinds and a brightness change.
MADE = {**near_fixtures.COPIES, "bright": (_brighter, "png")}
# (class, group slot, file stem, the photo, how the copy was made or None for the
# photo itself saved as JPEG, or "same:STEM" for a byte-identical copy of STEM's file).
FILES = (
    ("a", "T1", "astronaut", "astronaut.png", None),
    ("a", "V1", "astronaut", "astronaut.png", "small"),
    ("b", "S1", "astronaut", "astronaut.png", "crop"),  # also a near label conflict
    ("a", "T1", "coffee", "coffee.png", None),
    ("a", "V1", "coffee", "coffee.png", "crop"),
    ("b", "S1", "coffee", None, "same:a/T1/coffee"),  # identical, other split and class
    ("b", "V2", "chelsea", "chelsea.png", None),
    ("b", "T2", "chelsea", "chelsea.png", "bright"),
    # Identical to the val original and the smallest ID of the two: --dedupe keeps
    # this test copy, then the near search keeps the train copy over it.
    ("a", "S2", "chelsea", None, "same:b/V2/chelsea"),
    ("a", "T1", "rocket", "rocket.jpg", None),
    ("a", "T1", "rocket", "rocket.jpg", "q50"),  # a near copy in its own group
    ("b", "T2", "motorcycle", "motorcycle_left.png", None),
    ("b", "T2", "motorcycle", None, "same:b/T2/motorcycle"),  # identical, one split
    ("b", "S2", "camera", "camera.png", None),
    ("a", "V2", "coins", "coins.png", None),
)


def group_names() -> dict[str, str]:
    """Slot -> the first free name ``gN`` whose drawn split is the slot's (the converter's
    own draw, ``groups.split_of``), so the fixture's splits follow from the rule."""
    names, n = {}, 0
    for slot, split in SLOTS.items():
        while f"g{n}" in names.values() or groups.split_of(SEED, "", f"g{n}", SPLITS) != split:
            n += 1
        names[slot] = f"g{n}"
    return names


def grouped_near_folder(root: str) -> dict[str, str]:
    """Writes :data:`FILES` under ``root``; returns image ID -> the split its group draws."""
    names = group_names()
    drawn, made = {}, {}
    for label, slot, stem, photo, how in FILES:
        os.makedirs(os.path.join(root, label), exist_ok=True)
        prefix = f"{label}/{names[slot]}_{stem}"
        if how and how.startswith("same:"):
            source = made[how[len("same:") :]]
            image_id = f"{prefix}_same{os.path.splitext(source)[1]}"
            shutil.copyfile(os.path.join(root, source), os.path.join(root, image_id))
        else:
            im, ext = near_fixtures._photo(photo), "jpg"
            if how:
                make, ext = MADE[how]
                im, prefix = make(im), f"{prefix}_{how}"
            image_id = f"{prefix}.{ext}"
            im.save(os.path.join(root, image_id), **({"quality": 90} if ext == "jpg" else {}))
            made.setdefault(f"{label}/{slot}/{stem}", image_id)
        drawn[image_id] = SLOTS[slot]
    return drawn


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[str, dict[str, str]]:
    root = str(tmp_path_factory.mktemp("near-splits") / "images")
    return root, grouped_near_folder(root)


def written_splits(out: str) -> dict[str, str]:
    """image ID -> the split whose shards hold its record, read with RecordSource."""
    found = {}
    for split in contract.load_info(out)["splits"]:
        source = RecordSource(out, split)
        try:
            for i in range(len(source)):
                image_id = source[i]["filename"]
                assert image_id not in found, f"{image_id} written twice"
                found[image_id] = split
        finally:
            source.close()
    return found


LISTS = ("near_duplicates.jsonl", "duplicates.jsonl")


def listed_groups(out: str, name: str) -> list[list[dict]]:
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["members"] for line in f]


def _components(found: list[list[str]]) -> list[set[str]]:
    """The groups of identical and near copies joined where they share a member: one
    picture's every copy."""
    parent: dict[str, str] = {}

    def root(i: str) -> str:
        while parent.setdefault(i, i) != i:
            i = parent[i]
        return i

    for group in found:
        for other in group[1:]:
            parent[root(other)] = root(group[0])
    joined = collections.defaultdict(set)
    for i in parent:
        joined[root(i)].add(i)
    return sorted(joined.values(), key=sorted)


# The reasons of --dedupe's drops; what follows is the ID of the copy kept.
DROPS = (RejectKind.DUPLICATE.prefix, RejectKind.NEAR_DUPLICATE.prefix)


def kept_in_the_end(image_id: str, rejects: dict[str, dict], written: dict[str, str]) -> str:
    """The written record a dropped image's reason leads to (a copy --dedupe kept may
    itself be a near copy the search dropped: follow the reasons)."""
    seen = []
    while image_id not in written:
        assert image_id not in seen, f"a cycle of drops: {seen}"
        seen.append(image_id)
        reason = rejects[image_id]["reason"]
        prefix = next(p for p in DROPS if reason.startswith(p))
        image_id = reason[len(prefix) :]
    return image_id


def kept_of(row: dict, prefix: str) -> str | None:
    """The ID a drop's reason names as kept, for drops of that ``prefix``."""
    reason = row["reason"]
    return reason[len(prefix) :] if reason.startswith(prefix) else None


def check_one_split_per_picture(out: str, images: int) -> dict:
    """Every found group of copies (identical and near, joined) has exactly one member
    written, the others are rejects naming it; returns what was checked."""
    info = contract.load_info(out)
    written = written_splits(out)
    rejects = {r["id"]: r for r in contract.read_rejects(out)}
    assert len(written) + len(rejects) == images
    # Rejects are counted: per split, in imagerecords.json as in rejects.jsonl.
    counted = collections.Counter(r["split"] for r in rejects.values())
    assert info["rejected"]["count"] == len(rejects)
    assert {k: v for k, v in info["rejected"]["by_split"].items() if v} == dict(counted)
    near, exact = (listed_groups(out, name) for name in LISTS)
    assert len(near) == info["near_duplicates"]["groups"]
    for component in _components([[m["id"] for m in g] for g in near + exact]):
        kept = sorted(i for i in component if i in written)
        assert len(kept) == 1, f"{sorted(component)}: written {kept}"
        for image_id in component - set(kept):
            assert rejects[image_id]["reason"].startswith(DROPS), rejects[image_id]
            assert kept_in_the_end(image_id, rejects, written) == kept[0]
    # --dedupe near keeps the member in the first split (train, then val, then test).
    order = list(SPLITS)
    for group in near:
        [kept] = [m for m in group if m["id"] in written]
        assert order.index(kept["split"]) == min(order.index(m["split"]) for m in group)
    return {"written": written, "rejects": rejects, "near": near, "exact": exact}


def _cross_split(out: str) -> int:
    """Found groups of copies (identical and near, joined) whose members lie in more
    than one split, as listed (before any drop)."""
    listed = [g for name in LISTS for g in listed_groups(out, name)]
    by_id = {m["id"]: m["split"] for g in listed for m in g}
    found = [[m["id"] for m in g] for g in listed]
    return sum(len({by_id[i] for i in c}) > 1 for c in _components(found))


# Most of the folder is copies: the near drops count towards --max_reject_fraction.
NEAR_DROPS_OK = ("--max_reject_fraction", "0.6")


@pytest.mark.e2e
@pytest.mark.parametrize("grouped", [True, False], ids=["group_by", "no_group_by"])
def test_dedupe_near_leaves_no_picture_in_two_splits_on_every_engine(
    folder,
    tmp_path,
    capsys,
    dask_cluster,  # noqa: F811 (the fixture imported above)
    grouped,
):
    root, drawn = folder
    common = ["--input", root, "--quiet", *NEAR_DROPS_OK]
    if grouped:
        common += ["--group_by", GROUP_BY]
    # Without --dedupe the copies are listed across splits: the check below means something.
    assert main([*common, "--output", str(tmp_path / "listed")]) == 0
    listed = written_splits(str(tmp_path / "listed"))
    if grouped:
        assert listed == drawn  # each group in the split its name draws
    assert _cross_split(str(tmp_path / "listed")) >= 2
    on_dask = ["--runner", "DaskRunner", "--dask_client_address", dask_cluster]
    engines = {"local": [], "direct": ["--runner", "DirectRunner"], "dask": on_dask}
    for name, extra in engines.items():
        out = str(tmp_path / name)
        assert main([*common, "--dedupe", "near", "--output", out, *extra]) == 0, name
    capsys.readouterr()
    local = contract.all_files(str(tmp_path / "local"))
    for name in ("direct", "dask"):
        assert contract.all_files(str(tmp_path / name)) == local, name
    checked = check_one_split_per_picture(str(tmp_path / "local"), len(drawn))
    # The search found copies across splits, and dropped both kinds.
    assert any(len({m["split"] for m in g}) > 1 for g in checked["near"])
    kinds = {p for r in checked["rejects"].values() for p in DROPS if r["reason"].startswith(p)}
    assert kinds == set(DROPS)
    if grouped:  # the identical copy --dedupe kept (in test) went as a near copy of train's
        rejects = checked["rejects"]
        assert any(kept_of(r, DROPS[0]) in rejects for r in rejects.values())
