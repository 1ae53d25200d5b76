"""The Beam transforms under TestPipeline + assert_that (in-process DirectRunner)."""

import dataclasses
import io
import os
import pickle
import uuid

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipeline.core import books, images, keys, metadata, spill
from beam_pipeline.core.elements import ImageRef, RecordBatch, Rejection, RejectKind, ShardEntry
from beam_pipeline.engines import pipeline
from beam_pipeline.stages import shards as shards_lib
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.storage import discovery
from beam_pipeline.storage import output as output_files
from imagerecords import codec
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
    layout = discovery.discover(root)
    return JobConfig(layout=layout, output=output, splits=SPLITS, **kwargs)


@pytest.mark.e2e
def test_list_images_lists_every_visible_file_once_with_its_split(folder):
    root, ids, bad = folder
    config = _config(root)
    expected = [
        (i, config.layout.classes.index(i.split("/")[0]), keys.assign_split(42, i, SPLITS))
        for i in ids + list(bad)
    ]
    with BeamTestPipeline() as p:
        listed = p | pipeline.ListImages(config)
        refs = listed["refs"]
        got = refs | beam.Map(lambda r: (r.image_id, r.label, r.split))
        assert_that(got, equal_to(expected), label="EveryFileOnce")
        paths_ok = refs | beam.Map(lambda r: r.path == os.path.join(root, r.image_id))
        assert_that(paths_ok | beam.Distinct(), equal_to([True]), label="FullPaths")
        # The books' count: the listed keys per split, a few elements, not one per image.
        tallies = listed["listed"] | beam.FlatMap(lambda kv: [(kv[0], key) for key in kv[1].listed])
        want = [(split, keys.order_key(42, i)) for i, _, split in expected]
        assert_that(tallies, equal_to(want), label="ListedKeys")


def _entries(batches):
    return [entry for batch in batches for entry in batch.entries]


@pytest.mark.e2e
def test_convert_images_batches_records_and_tags_rejections(folder):
    root, ids, bad = folder
    config = _config(root)
    refs = [ImageRef(i, os.path.join(root, i), 0, "train") for i in ids[:5] + list(bad)]
    refs.append(ImageRef("gone.jpg", os.path.join(root, "gone.jpg"), 0, "train"))

    def names(batch):
        for entry in batch.entries:
            (payload,) = codec.iter_records(io.BytesIO(entry.data))
            yield entry.image_id, codec.parse_example(payload)["image/filename"].decode()

    with BeamTestPipeline() as p:
        out = p | beam.Create(refs) | pipeline.ConvertImages(config)
        assert_that(out.batches | beam.FlatMap(names), equal_to([(i, i) for i in ids[:5]]))
        reasons = out[pipeline.REJECTED] | beam.Map(lambda r: (r.image_id, r.reason.split(":")[0]))
        assert_that(
            reasons,
            equal_to([(i, reason) for i, reason in bad.items()] + [("gone.jpg", "cannot read")]),
            label="Rejections",
        )


def _entry(image_id, size=100):
    framed = codec.frame_record(b"x" * (size - codec.FRAME_OVERHEAD))
    return ShardEntry(keys.order_key(42, image_id), image_id, 0, len(framed), framed)


def _batches(split, ids, per_batch=7):
    entries = [_entry(i) for i in ids]
    return [
        RecordBatch(split, tuple(entries[i : i + per_batch]))
        for i in range(0, len(entries), per_batch)
    ]


def _listed(split, ids):
    return split, books.KeyTally(listed=tuple(keys.order_key(42, i) for i in ids))


def _run_plan_and_write(tmp_path, batches, listed, rejections=(), **config_args):
    """Runs PlanShards + WriteShards; returns (config, plans, shard infos)."""
    layout = discovery.Layout(kind="classes", root="/in", classes=("a",))
    out_dir = tmp_path / "out"
    config = JobConfig(layout=layout, output=str(out_dir), splits=SPLITS, **config_args)
    kept = tmp_path / "kept"
    kept.mkdir()

    def keep(name, item):
        (kept / f"{name}-{uuid.uuid4().hex}.pickle").write_bytes(pickle.dumps(item))

    with BeamTestPipeline() as p:
        batch_pc = p | "Batches" >> beam.Create(batches)
        plans = {
            "batches": batch_pc,
            "listed": p | "Listed" >> beam.Create(listed),
            "rejected": p | "Rejected" >> beam.Create(list(rejections)),
        } | pipeline.PlanShards(config)
        shards = {"batches": batch_pc, "plans": plans} | pipeline.WriteShards(config)
        plans | "KeepPlans" >> beam.Map(lambda kv: keep("plan", kv))
        shards | "KeepShards" >> beam.Map(lambda s: keep("shard", s))
    found = {"plan": [], "shard": []}
    for path in kept.iterdir():
        found[path.name.split("-")[0]].append(pickle.loads(path.read_bytes()))
    return config, dict(found["plan"]), found["shard"]


@pytest.mark.e2e
def test_write_shards_cuts_exactly_the_planned_number_of_nonempty_shards(tmp_path):
    train, val = [f"t{i}" for i in range(50)], [f"v{i}" for i in range(3)]
    batches = _batches("train", train) + _batches("val", val)
    # train: 50 * 100 bytes = 5000 -> 5 shards; val: 300 bytes -> 1 shard
    config, plans, shards = _run_plan_and_write(
        tmp_path, batches, [_listed("train", train), _listed("val", val)], target_shard_bytes=1000
    )
    assert not [f for f in os.listdir(config.output) if f.endswith(".tfrecord")], (
        "final name before Finalize"
    )
    kept, problems = shards_lib.check_shards(plans, shards)
    assert problems == []
    placed = shards_lib.place_shards(kept, config.output)
    assert shards_lib.place_shards(kept, config.output) == placed  # a retried Finalize
    out_dir = tmp_path / "out"
    assert sorted(s["file"] for s in placed) == [
        keys.shard_filename("train", i, 5) for i in range(5)
    ] + ["val-00000-of-00001.tfrecord"]
    read = [list(codec.iter_records(open(out_dir / s["file"], "rb"))) for s in placed]
    assert [len(r) for r in read] == [10, 10, 10, 10, 10, 3]
    output_files.delete_temp_files(config.output)
    assert not list((out_dir / metadata.TMP_DIR).glob("*")), "temp files left behind"


@pytest.mark.e2e
def test_min_shards_is_exact_and_capped_by_the_records(tmp_path):
    ids = [f"t{i}" for i in range(5)]
    _, plans, shards = _run_plan_and_write(
        tmp_path, _batches("train", ids, 2), [_listed("train", ids)], min_shards=64
    )
    kept, problems = shards_lib.check_shards(plans, shards)
    assert problems == [] and plans["train"].shards == 5
    assert sorted(s.index for s in kept) == [0, 1, 2, 3, 4]
    assert all(s.num_examples == 1 for s in kept)
    order = [k for s in sorted(kept, key=lambda s: s.index) for k in [s.key_sum]]
    assert order == sorted(keys.order_key(42, i) for i in ids)  # one key per shard, in order


@pytest.mark.e2e
def test_books_name_lost_images_and_balance_rejections(tmp_path):
    """A listed image that is neither written nor rejected is a problem; rejections balance."""
    written = [f"t{i}" for i in range(6)]
    listed = [_listed("train", [f"t{i}" for i in range(8)]), _listed("val", ["v0"])]
    rejections = [
        Rejection("t6", "/in/t6", "train", "corrupt", RejectKind.BAD_IMAGE),
        Rejection("v0", "/in/v0", "val", "x", RejectKind.BAD_IMAGE),
    ]
    _, plans, shards = _run_plan_and_write(tmp_path, _batches("train", written), listed, rejections)
    assert [(p.kind, p.key) for p in plans["train"].problems] == [
        ("lost", keys.order_key(42, "t7"))
    ]
    assert (plans["val"].problem_count, plans["val"].shards, plans["val"].rejected) == (0, 0, 1)
    assert [(s.split, s.num_examples) for s in shards] == [("train", 6)]


@pytest.mark.e2e
def test_a_retried_shard_write_is_kept_once(tmp_path):
    ids = [f"t{i}" for i in range(9)]
    config, plans, shards = _run_plan_and_write(
        tmp_path, _batches("train", ids), [_listed("train", ids)], min_shards=3
    )
    writer = pipeline._WriteShardFn(config.output)
    group = (
        ("train", 1),
        _batches("train", ids[:0])
        + [
            RecordBatch(
                "train",
                tuple(
                    e
                    for e in _entries(_batches("train", ids))
                    if plans["train"].shard_of(e.key) == 1
                ),
            )
        ],
    )
    (retry,) = writer.process(group, plans)  # a second attempt at shard 1
    kept, problems = shards_lib.check_shards(plans, shards + [retry])
    assert problems == [] and len(kept) == 3
    placed = shards_lib.place_shards(kept, config.output)
    output_files.delete_temp_files(config.output)
    out_dir = tmp_path / "out"
    assert sorted(os.listdir(out_dir)) == [metadata.TMP_DIR] + sorted(s["file"] for s in placed)
    assert not list((out_dir / metadata.TMP_DIR).iterdir())
    total = sum(len(list(codec.iter_records(open(out_dir / s["file"], "rb")))) for s in placed)
    assert total == 9


@pytest.mark.e2e
def test_a_shard_holding_other_records_than_planned_fails_the_books(tmp_path):
    ids = [f"t{i}" for i in range(9)]
    _, plans, shards = _run_plan_and_write(
        tmp_path, _batches("train", ids), [_listed("train", ids)], min_shards=3
    )
    short = dataclasses.replace(shards[0], num_examples=shards[0].num_examples - 1)
    _, problems = shards_lib.check_shards(plans, [short] + shards[1:])
    assert problems and "not the 3 planned" in problems[0]
    _, problems = shards_lib.check_shards(plans, shards[1:])
    assert problems == [f"shard {shards[0].index} of train was not written"]


def test_a_retried_conversion_bundle_does_not_duplicate_records(folder, tmp_path):
    """The first attempt spilled records, then failed; its outputs are discarded (as a
    runner does) and the retry's references are the only ones that reach the shards."""
    root, ids, bad = folder
    config = _config(root, output=str(tmp_path / "out"), conversion_processes=2)
    refs = [ImageRef(i, os.path.join(root, i), 0, "train") for i in ids]
    fn = pipeline._PooledConvertFn(config, 2)
    fn.setup()
    try:
        fn.start_bundle()
        for ref in refs[:10]:
            list(fn.process(ref))  # first attempt: outputs lost with the bundle
        list(fn.finish_bundle())
        spilled_first = sum(
            1 for f in spill.spill_files(config.spill_directory) for _ in spill.scan(f)
        )
        fn.start_bundle()
        outputs = [o for ref in refs for o in fn.process(ref)] + list(fn.finish_bundle())
    finally:
        fn.teardown()
        spill.forget_indexes()
    assert spilled_first >= 10
    batches = [getattr(o, "value", o) for o in outputs]
    entries = _entries(b for b in batches if isinstance(b, RecordBatch))
    assert sorted(e.image_id for e in entries) == sorted(ids)  # once each
    on_disk = [s.image_id for f in spill.spill_files(config.spill_directory) for s in spill.scan(f)]
    assert len(on_disk) == len(ids) + spilled_first  # the first attempt's copies stay unused
    reader = spill.Reader()
    for entry in entries:
        framed = reader.read(entry.data.path, entry.data.offset, entry.size)
        (payload,) = codec.iter_records(io.BytesIO(framed))
        assert codec.parse_example(payload)["image/filename"].decode() == entry.image_id
    reader.close()


@pytest.mark.e2e
def test_config_image_spec_decides_the_stored_size(folder):
    """The JobConfig's image settings reach the conversion step: every record is 40 x 40."""
    root, ids, _ = folder
    config = _config(root, image=images.ImageSpec(resize="crop", size=40))
    refs = [ImageRef(i, os.path.join(root, i), 0, "train") for i in ids[:4]]

    def stored_sizes(batch):
        for entry in batch.entries:  # inline conversion: the framed record travels
            (payload,) = codec.iter_records(io.BytesIO(entry.data))
            example = codec.parse_example(payload)
            yield example["image/height"], example["image/width"]

    with BeamTestPipeline() as p:
        out = p | beam.Create(refs) | pipeline.ConvertImages(config)
        assert_that(out.batches | beam.FlatMap(stored_sizes), equal_to([(40, 40)] * 4))


def test_local_refs_for_converting_ahead_respect_both_bounds(folder):
    root, ids, bad = folder
    layout = discovery.discover(root)

    def paths(limit, max_bytes):
        return [ref.path for ref in discovery.local_refs(layout, limit, max_bytes, 42, {"t": 1.0})]

    everything = paths(10**6, 10**12)
    assert sorted(os.path.relpath(p, root) for p in everything) == sorted(ids + list(bad))
    assert len(paths(5, 10**12)) == 5
    sizes = [os.path.getsize(p) for p in everything]
    budget = sum(sizes[:3])
    assert paths(10**6, budget) == everything[:3]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"output": ""}, "--output is required"),
        ({"splits": {"train": 0.8, "val": 0.1}}, "--splits: fractions must sum to 1, got 0.9"),
        ({"splits": {"train": 1.5, "val": -0.5}}, "--splits: fractions must be in [0, 1]"),
        ({"splits": {}}, "--splits: fractions must be in [0, 1]"),
        ({"target_shard_bytes": 0}, "--target_shard_mb must be above 0 and at most 1e+06, got 0"),
        ({"min_shards": 0}, "--min_shards must be in 1..99999, got 0"),
        ({"max_reject_fraction": 1.5}, "--max_reject_fraction must be in [0, 1], got 1.5"),
        ({"conversion_processes": 0}, "--local_processes must be at least 1, got 0"),
    ],
)
def test_job_config_checks_its_own_values(kwargs, message):
    """Code that builds a JobConfig directly gets the CLI's errors."""
    from beam_pipeline.core.errors import UsageError

    layout = discovery.Layout(kind="classes", root="/in", classes=("a",))
    fields = {"layout": layout, "output": "/o", "splits": SPLITS, **kwargs}
    with pytest.raises(UsageError) as caught:
        JobConfig(**fields)
    assert str(caught.value).startswith(message)
    JobConfig(layout=layout, output="/o", splits=SPLITS)  # the defaults are valid
