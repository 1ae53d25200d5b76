"""The elements between steps (core/elements.py): rejection kinds, their reasons' text,
pickling, and the planner's accumulator read by field."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from beam_pipeline.core import books, images
from beam_pipeline.core.elements import (
    Converted,
    ImageRef,
    Origin,
    Outcome,
    RecordBatch,
    Rejection,
    RejectKind,
    ShardEntry,
    SpillLocation,
)
from beam_pipeline.features.dedupe import duplicates
from beam_pipeline.stages import convert, plan


@pytest.mark.parametrize(
    ("made", "kind", "reason"),
    [
        (
            lambda: convert.unreadable(PermissionError(13, "Permission denied")),
            RejectKind.UNREADABLE,
            "cannot read: PermissionError: [Errno 13] Permission denied",
        ),
        (
            lambda: convert.decode_data(b"", images.ImageSpec()),
            RejectKind.BAD_IMAGE,
            "empty file",
        ),
        (
            lambda: convert.decode_data(b"not an image at all", images.ImageSpec()),
            RejectKind.BAD_IMAGE,
            "not an image: content is not JPEG, PNG, GIF, BMP, WebP or TIFF",
        ),
    ],
)
def test_a_conversion_names_its_rejections_kind_and_keeps_the_reasons_text(made, kind, reason):
    conversion = made()
    assert conversion.image is None
    assert (conversion.kind, conversion.reason) == (kind, reason)
    assert conversion.reason.startswith(kind.prefix)


def test_the_reasons_of_the_other_kinds_are_the_text_rejects_jsonl_holds():
    """docs/format.md section 4 and docs/images.md name these texts."""
    assert (
        convert.timeout_reason(1.5)
        == "timed out: converting took longer than --image_timeout_s 1.5"
    )
    kept = duplicates.Member("cat/a.jpg", "train", 0)
    assert duplicates.duplicate_reason(kept) == "duplicate of cat/a.jpg"
    assert RejectKind.CRASHED.prefix == "crashed the image decoder"


@pytest.mark.parametrize(
    ("kind", "transient", "bad"),
    [
        (RejectKind.BAD_IMAGE, False, True),
        (RejectKind.UNREADABLE, True, True),
        (RejectKind.TIMED_OUT, True, True),
        (RejectKind.CRASHED, False, True),
        (RejectKind.DUPLICATE, False, False),
        (RejectKind.NEAR_DUPLICATE, False, True),  # a judgement: it counts
    ],
)
def test_which_rejections_a_resumed_run_retries_and_which_count_as_bad(kind, transient, bad):
    assert kind.transient is transient
    assert kind.bad is bad


def test_a_rejection_from_a_spill_file_is_a_rejection_of_the_bytes():
    from beam_pipeline.core import spill

    item = spill.Spilled("a/x.jpg", "train", 7, -1, 0, "/spill/0", 0, "corrupt image: broken")
    rejection = convert.from_spill(item, "/in/a/x.jpg")
    assert rejection == Rejection(
        "a/x.jpg", "/in/a/x.jpg", "train", "corrupt image: broken", RejectKind.BAD_IMAGE
    )


def test_elements_survive_pickling_as_themselves():
    ref = ImageRef("a/x.jpg", "/in/a/x.jpg", 1, "val")
    entry = ShardEntry(5, ref.image_id, 1, 3, SpillLocation("/spill/0", 10), ref.path, "ab")
    elements = [
        ref,
        Converted("val", entry),
        RecordBatch("val", (entry, entry._replace(data=b"abc"))),
        Outcome(Rejection("b", "/in/b", "val", "duplicate of a", RejectKind.DUPLICATE), 0, False),
        Origin.AHEAD,
    ]
    for element in elements:
        back = pickle.loads(pickle.dumps(element))
        assert back == element and type(back) is type(element)
    assert pickle.loads(pickle.dumps(elements[3])).result.kind is RejectKind.DUPLICATE


def test_key_tallies_merged_in_any_grouping_give_the_same_keys():
    adder = plan.KeyTallies()
    tallies = [
        books.KeyTally(listed=(3, 1), record_bytes=0),
        books.KeyTally(written=(3,), record_bytes=40),
        books.KeyTally(rejected=(1,), record_bytes=0),
        books.KeyTally(listed=(9,), written=(9,), record_bytes=2),
    ]

    def tallied(group):
        accumulator = adder.create_accumulator()
        for tally in group:
            accumulator = adder.add_input(accumulator, tally)
        return accumulator

    whole = adder.extract_output(tallied(tallies))
    merged = adder.merge_accumulators([tallied(tallies[:1]), tallied(tallies[1:3]), tallied([])])
    merged = adder.merge_accumulators([merged, tallied(tallies[3:])])
    parts = adder.extract_output(merged)
    assert merged.record_bytes == 42 and len(merged.listed) == 1  # compacted to one array
    for one, other in zip(whole[:3], parts[:3], strict=True):
        assert np.array_equal(np.sort(one), np.sort(other))
    assert whole[3] == parts[3]
    assert sorted(parts[0].tolist()) == [1, 3, 9] and parts[3] == 42
