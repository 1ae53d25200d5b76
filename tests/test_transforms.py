"""The Beam transforms under TestPipeline + assert_that (in-process DirectRunner)."""

import os

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to, is_not_empty

from beam_pipeline import images, keys, listing, pipeline, records
from tests.image_factory import add_bad_files, make_class_folders

SPLITS = {"train": 0.8, "val": 0.1, "test": 0.1}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("images"))
    ids = make_class_folders(root, per_class=8)
    bad = add_bad_files(root)
    os.makedirs(os.path.join(root, "dog", ".hidden"))
    with open(os.path.join(root, "dog", ".hidden", "x.jpg"), "wb") as f:
        f.write(b"skipped")
    with open(os.path.join(root, "dog", ".DS_Store"), "wb") as f:
        f.write(b"skipped")
    return root, ids, bad


def _config(root, output="/nonexistent", **kwargs):
    layout = listing.discover(root)
    return pipeline.JobConfig(layout=layout, output=output, splits=SPLITS, **kwargs)


def test_list_images_lists_every_visible_file_once_with_its_split(folder):
    root, ids, bad = folder
    config = _config(root)
    expected = [
        (i, config.layout.classes.index(i.split("/")[0]), keys.assign_split(42, i, SPLITS))
        for i in ids + list(bad)
    ]
    with BeamTestPipeline() as p:
        refs = p | pipeline.ListImages(config)
        got = refs | beam.Map(lambda r: (r.image_id, r.label, r.split))
        assert_that(got, equal_to(expected), label="EveryFileOnce")
        paths_ok = refs | beam.Map(lambda r: r.path == os.path.join(root, r.image_id))
        assert_that(paths_ok | beam.Distinct(), equal_to([True]), label="FullPaths")


def test_convert_images_splits_records_and_rejections(folder):
    root, ids, bad = folder
    config = _config(root)
    refs = [listing.ImageRef(i, os.path.join(root, i), 0, "train") for i in ids[:5] + list(bad)]
    refs.append(listing.ImageRef("gone.jpg", os.path.join(root, "gone.jpg"), 0, "train"))
    with BeamTestPipeline() as p:
        out = p | beam.Create(refs) | pipeline.ConvertImages(config)
        parsed = out.records | beam.Map(
            lambda r: (r.image_id, records.parse_example(r.payload)["image/filename"].decode())
        )
        assert_that(parsed, equal_to([(i, i) for i in ids[:5]]), label="Records")
        reasons = out[pipeline.REJECTED] | beam.Map(lambda r: (r.image_id, r.reason.split(":")[0]))
        assert_that(
            reasons,
            equal_to([(i, reason) for i, reason in bad.items()] + [("gone.jpg", "cannot read")]),
            label="Rejections",
        )


def _record(split, image_id, size=100):
    return pipeline.Record(split, keys.order_key(42, image_id), image_id, 0, b"x" * size)


def test_write_shards_sizes_by_target_and_never_writes_empty_shards(tmp_path):
    layout = listing.Layout(kind="classes", root="/in", classes=("a",))
    config = pipeline.JobConfig(
        layout=layout, output=str(tmp_path), splits=SPLITS, target_shard_bytes=1000, min_shards=1
    )
    recs = [_record("train", f"t{i}") for i in range(50)] + [
        _record("val", f"v{i}") for i in range(3)
    ]
    # train: 50 * 116 bytes = 5800 -> 6 shards; val: 348 bytes -> 1 shard
    with BeamTestPipeline() as p:
        out = p | beam.Create(recs) | pipeline.WriteShards(config)
        files = out.shards | beam.Map(lambda s: s["file"])
        assert_that(
            files,
            equal_to(
                [keys.shard_filename("train", i, 6) for i in range(6)]
                + ["val-00000-of-00001.tfrecord"]
            ),
            label="ShardFiles",
        )
        assert_that(
            out[pipeline.WRITTEN] | beam.combiners.Count.Globally(), equal_to([53]), label="Written"
        )
    train = sorted(tmp_path.glob("train-*.tfrecord"))
    read = [list(records.iter_records(open(f, "rb"))) for f in train]
    assert all(read), "an empty shard was written"
    assert sum(len(r) for r in read) == 50
    assert not list(tmp_path.glob(f"{pipeline.TMP_DIR}/*")), "temp files left behind"


def test_write_shards_renumbers_around_empty_hash_ranges(tmp_path):
    layout = listing.Layout(kind="classes", root="/in", classes=("a",))
    config = pipeline.JobConfig(
        layout=layout, output=str(tmp_path), splits=SPLITS, target_shard_bytes=10**9, min_shards=64
    )
    recs = [_record("train", f"t{i}") for i in range(5)]  # 5 records, 64 hash ranges
    with BeamTestPipeline() as p:
        out = p | beam.Create(recs) | pipeline.WriteShards(config)
        assert_that(
            out.shards | beam.Map(lambda s: s["num_examples"]), is_not_empty(), label="Some"
        )
    files = sorted(os.listdir(tmp_path))
    shards = [f for f in files if f.endswith(".tfrecord")]
    assert shards == [keys.shard_filename("train", i, len(shards)) for i in range(len(shards))]
    assert 1 <= len(shards) <= 5
    sizes = [len(list(records.iter_records(open(tmp_path / f, "rb")))) for f in shards]
    assert sum(sizes) == 5 and min(sizes) > 0


@pytest.mark.parametrize(
    "groups, expected",
    [
        ({"listed": ["train"], "written": ["train"], "rejected": []}, []),
        ({"listed": ["train"], "written": [], "rejected": ["train"]}, []),
        ({"listed": ["train"], "written": [], "rejected": []}, ["lost"]),
        ({"listed": ["train"], "written": ["train", "train"], "rejected": []}, ["doubled"]),
        ({"listed": ["train"], "written": ["train"], "rejected": ["train"]}, ["doubled"]),
        ({"listed": [], "written": ["train"], "rejected": []}, ["not listed"]),
    ],
)
def test_balance_names_lost_and_doubled_ids(groups, expected):
    out = list(pipeline._balance(("cat/1.jpg", groups)))
    assert [v for kind, v in out if kind == "listed"] == groups["listed"]
    problems = [v for kind, v in out if kind == "problem"]
    assert [p.split(" ")[0] for p in problems] == [e.split(" ")[0] for e in expected]
    assert all("cat/1.jpg" in p for p in problems)


def test_check_books_summarises_listing_and_problems():
    with BeamTestPipeline() as p:
        listed = p | "L" >> beam.Create([("a", "train"), ("b", "train"), ("c", "val")])
        written = p | "W" >> beam.Create([("a", "train"), ("a", "train")])
        rejected = p | "R" >> beam.Create([("c", "val")])
        books = {"listed": listed, "written": written, "rejected": rejected} | pipeline.CheckBooks()
        assert_that(
            books
            | beam.Map(
                lambda b: (
                    b["listed"],
                    b["problem_count"],
                    [x.split(":")[0] for x in b["problems"]],
                )
            ),
            equal_to(
                [
                    (
                        {"train": 2, "val": 1},
                        2,
                        [
                            "doubled (2 records, 0 rejections)",
                            "lost (neither written nor rejected)",
                        ],
                    )
                ]
            ),
            label="Books",
        )


def test_books_fn_keeps_the_first_problems_in_order():
    fn = pipeline._BooksFn()
    parts = []
    for chunk in (range(0, 30), range(30, 60)):
        acc = fn.create_accumulator()
        for i in chunk:
            acc = fn.add_input(acc, ("problem", f"lost: id{i:03d}"))
            acc = fn.add_input(acc, ("listed", "train"))
        parts.append(acc)
    out = fn.extract_output(fn.merge_accumulators(parts))
    assert out["problem_count"] == 60 and out["listed"] == {"train": 60}
    assert out["problems"] == [f"lost: id{i:03d}" for i in range(pipeline._MAX_PROBLEMS_SHOWN)]


def test_image_spec_travels_with_config():
    spec = images.ImageSpec(resize="crop", size=64)
    layout = listing.Layout(kind="classes", root="/in", classes=("a",))
    assert (
        pipeline.JobConfig(layout=layout, output="/o", splits=SPLITS, image=spec).image.size == 64
    )
