"""The books and the shard plan (beam_pipeline.core.books): pure, no Beam."""

import numpy as np
import pytest

from beam_pipeline.core import books, keys


def _keys(*ids):
    return books.as_keys([keys.order_key(42, i) for i in ids])


@pytest.mark.parametrize(
    "listed, written, rejected, expected",
    [
        (["a", "b"], ["a"], ["b"], []),
        (["a", "b"], ["a", "b"], [], []),
        (["a", "b"], ["a"], [], [("lost", "b")]),
        (["a", "b"], ["a", "a", "b"], [], [("doubled", "a")]),
        (["a", "b"], ["a", "b"], ["b"], [("doubled", "b")]),
        (["a"], ["a", "c"], [], [("unlisted", "c")]),
        (["a", "b"], [], [], [("lost", "a"), ("lost", "b")]),
    ],
)
def test_balance_names_the_keys_that_do_not_add_up(listed, written, rejected, expected):
    problems = books.balance(_keys(*listed), _keys(*written), _keys(*rejected))
    got = {(p.kind, p.key) for p in problems}
    assert got == {(kind, keys.order_key(42, i)) for kind, i in expected}


def test_colliding_keys_of_two_images_still_balance():
    same = books.as_keys([5, 5, 9])
    assert books.balance(same, books.as_keys([5, 9]), books.as_keys([5])) == []


@pytest.mark.parametrize(
    "records, size, target, minimum, shards",
    [
        (60, 100, 10**9, 8, 8),  # --min_shards 8 gives exactly 8
        (5, 100, 10**9, 8, 5),  # capped by the records: no empty shard
        (50, 116, 1000, 1, 6),  # 5,800 bytes / 1,000
        (1, 116, 10, 1, 1),
        (0, 0, 1000, 4, 0),  # every image rejected: no shard
    ],
)
def test_plan_cuts_exactly_n_nonempty_shards_in_key_order(records, size, target, minimum, shards):
    ids = [f"img{i}" for i in range(records)]
    written = _keys(*ids)
    plan = books.plan_split(
        "train", written, written, books.as_keys([]), records * size, target, minimum
    )
    assert plan.shards == shards and plan.problem_count == 0
    assert plan.written == records and plan.listed == records
    if not records:
        return
    by_shard = [[] for _ in range(shards)]
    for key in written.tolist():
        by_shard[plan.shard_of(key)].append(key)
    assert [len(s) for s in by_shard] == list(plan.counts)
    assert all(by_shard) and max(plan.counts) - min(plan.counts) <= 1
    # Shards 0..n-1, each sorted, hold the split's records in increasing key order.
    assert [k for s in by_shard for k in sorted(s)] == sorted(written.tolist())
    assert [books.key_sum(s) for s in by_shard] == list(plan.key_sums)


def test_plan_counts_rejections_and_keeps_first_problems_only():
    listed = _keys(*[f"x{i}" for i in range(100)])
    written = listed[:50]
    rejected = listed[50:60]
    plan = books.plan_split("val", listed, written, rejected, 5000, 10**6, 1)
    assert (plan.listed, plan.rejected, plan.written) == (100, 10, 50)
    assert plan.problem_count == 40 and len(plan.problems) == books.MAX_PROBLEMS_SHOWN
    assert {p.kind for p in plan.problems} == {"lost"}


def test_key_sum_wraps_at_64_bits():
    assert books.key_sum([2**64 - 1, 2]) == 1
    assert books.key_sum(np.zeros(0, dtype=np.uint64)) == 0


@pytest.mark.parametrize(
    "kind, name, expected",
    [
        ("lost", "cat/1.jpg", "lost (neither written nor rejected): cat/1.jpg"),
        ("doubled", "cat/1.jpg", "doubled (2 records, 0 rejections): cat/1.jpg"),
        ("unlisted", None, "not listed but written/rejected: order key 0x00000000000000ff"),
    ],
)
def test_describe(kind, name, expected):
    problem = books.Problem(kind, 255, 1, 2 if kind == "doubled" else 0, 0)
    assert books.describe(problem, name) == expected


def _plan(listed, counts=(), problems=()):
    return books.SplitPlan(
        "train", listed, 0, 0, (), tuple(counts), (0,) * len(counts), len(problems), tuple(problems)
    )


_LOST = books.Problem("lost", 255, 1, 0, 0)


@pytest.mark.parametrize(
    "plans, written, rejected, shard_problems, expected",
    [
        ([_plan(10, [6, 3])], 9, 1, [], None),
        ([_plan(10, [6]), _plan(0)], 6, 4, [], None),
        ([], 0, 0, [], "no images were found in the input; nothing was written"),
        ([_plan(0)], 0, 0, [], "no images were found in the input; nothing was written"),
        (
            [_plan(10, [9])],
            9,
            0,
            [],
            "the job's books do not balance: listed 10, wrote 9, rejected 0; "
            "imagerecords.json was not written",
        ),
        (
            [_plan(10, [10], [_LOST])],
            10,
            0,
            [],
            "the job's books do not balance: 1 image IDs were lost or doubled; "
            "imagerecords.json was not written. First: "
            "lost (neither written nor rejected): cat/1.jpg",
        ),
        (
            [_plan(10, [10])],
            10,
            0,
            ["shard 0 of train was not written"],
            "the job's books do not balance: 0 image IDs were lost or doubled; "
            "imagerecords.json was not written. First: shard 0 of train was not written",
        ),
    ],
)
def test_check_books_table(plans, written, rejected, shard_problems, expected):
    asked = []

    def names_of(wanted):
        asked.append(wanted)
        return {255: "cat/1.jpg"}

    got = books.check_books(
        plans, written=written, rejected=rejected, shard_problems=shard_problems, names_of=names_of
    )
    assert got == expected
    # The input is listed again only when there are keys to name.
    assert asked == ([{255}] if any(p.problems for p in plans) else [])
