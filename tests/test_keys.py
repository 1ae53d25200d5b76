"""Table tests of the pure helpers in beam_pipeline.core.keys (no Beam, no TF)."""

import math
import subprocess
import sys
from collections import Counter

import pytest

from beam_pipeline.core import keys


@pytest.mark.e2e
def test_keys_module_imports_neither_beam_nor_tensorflow():
    code = (
        "import sys, beam_pipeline.core.keys, beam_pipeline.core.images, imagerecords.codec, "
        "beam_pipeline.core.spill, beam_pipeline.core.books, beam_pipeline.stages.convert, "
        "beam_pipeline.core.metadata\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'tensorflow')]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize(
    "seed, purpose, image_id",
    [(42, "order", "cat/1.jpg"), (0, "split", "dog/a b/ü.png"), (7, "order", "")],
)
def test_hash64_is_stable_and_64_bit(seed, purpose, image_id):
    value = keys.hash64(seed, purpose, image_id)
    assert value == keys.hash64(seed, purpose, image_id)
    assert 0 <= value < 2**64
    # Same value in a fresh interpreter (Python's hash() would differ per process).
    code = f"from beam_pipeline.core import keys; print(keys.hash64({seed}, {purpose!r}, {image_id!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == value


def test_hash64_separates_seed_purpose_and_id():
    values = {
        keys.hash64(1, "order", "a"),
        keys.hash64(2, "order", "a"),
        keys.hash64(1, "split", "a"),
        keys.hash64(1, "order", "b"),
        keys.hash64(1, "orde", "ra"),  # no collision by concatenation
    }
    assert len(values) == 5


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("train=0.8,val=0.1,test=0.1", {"train": 0.8, "val": 0.1, "test": 0.1}),
        ("train=1", {"train": 1.0}),
        (" a=0.5 , b=0.5 ", {"a": 0.5, "b": 0.5}),
        ("train=0.7,validation=0.3", {"train": 0.7, "validation": 0.3}),
    ],
)
def test_parse_splits_accepts(spec, expected):
    assert keys.parse_splits(spec) == expected
    assert list(keys.parse_splits(spec)) == list(expected)  # order kept


@pytest.mark.parametrize(
    "spec, message",
    [
        ("train=0.8,val=0.1", "sum to 1"),
        ("train=0.8,val=0.3", "sum to 1"),
        ("train", "NAME=FRACTION"),
        ("train=abc", "not a number"),
        ("train=0.5,train=0.5", "twice"),
        ("tr-ain=1", "is not letters, digits and _"),
        ("all=0.9,test=0.1", "'all' is reserved by TFDS"),
        ("Train=0.5,train=0.5", "differ only in case"),
        ("a" * 101 + "=1", "longer than 100 characters"),
        ("train=1.5,val=-0.5", "[0, 1]"),
        ("", "no splits"),
    ],
)
def test_parse_splits_rejects(spec, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        keys.parse_splits(spec)


@pytest.mark.parametrize(
    "name, problem",
    [
        ("train", None),
        ("ALL", None),  # TFDS reserves "all" exactly
        ("all_images", None),
        ("a" * 100, None),
        ("all", "reserved by TFDS"),
        ("a" * 101, "longer than"),
        ("train[:10%]", "is not letters"),  # TFDS would read it as a slice of train
        ("a+b", "is not letters"),  # TFDS would read it as two splits
        ("val-1", "is not letters"),
        ("", "is not letters"),
        ("caf\u00e9", "is not letters"),
    ],
)
def test_split_name_problem(name, problem):
    found = keys.split_name_problem(name)
    assert found is None if problem is None else problem in found


def test_case_clash():
    assert keys.case_clash(["train", "val"], "test") is None
    assert keys.case_clash(["train"], "train") is None  # the same split again
    assert "differ only in case" in keys.case_clash(["train", "val"], "VAL")


def test_assign_split_matches_fractions_and_is_stable():
    fractions = {"train": 0.8, "val": 0.1, "test": 0.1}
    ids = [f"class{i % 7}/img_{i}.jpg" for i in range(20000)]
    counts = Counter(keys.assign_split(42, i, fractions) for i in ids)
    for name, fraction in fractions.items():
        # 4 standard deviations of a binomial: fails only if assignment is biased.
        sd = math.sqrt(len(ids) * fraction * (1 - fraction))
        assert abs(counts[name] - len(ids) * fraction) < 4 * sd, counts
    # Stability: an image's split depends only on its own ID.
    before = {i: keys.assign_split(42, i, fractions) for i in ids[:500]}
    assert all(keys.assign_split(42, i, fractions) == s for i, s in before.items())
    # A different seed gives a different assignment.
    assert any(keys.assign_split(43, i, fractions) != s for i, s in before.items())


def test_assign_split_skips_zero_fractions():
    fractions = {"train": 1.0, "val": 0.0}
    assert {keys.assign_split(1, f"x{i}", fractions) for i in range(300)} == {"train"}


@pytest.mark.parametrize(
    "total, target, minimum, records, expected",
    [
        (0, 100, 1, None, 1),
        (1, 100, 1, None, 1),
        (100, 100, 1, None, 1),
        (101, 100, 1, None, 2),
        (1000, 100, 1, None, 10),
        (1001, 100, 1, None, 11),
        (50, 100, 4, None, 4),
        (10_000, 100, 4, None, 100),
        (250 * 2**20, 200 * 2**20, 1, None, 2),
        # Capped only by the number of records: no shard is ever empty.
        (50, 100, 8, 60, 8),
        (50, 100, 8, 5, 5),
        (10_000, 100, 1, 7, 7),
        (0, 100, 8, 0, 0),
        (116, 100, 1, 1, 1),
    ],
)
def test_num_shards(total, target, minimum, records, expected):
    assert keys.num_shards(total, target, minimum, records) == expected


@pytest.mark.parametrize(
    "records, shards, expected",
    [
        (0, 0, [0]),
        (1, 1, [0, 1]),
        (10, 1, [0, 10]),
        (10, 3, [0, 3, 6, 10]),
        (5, 5, [0, 1, 2, 3, 4, 5]),
        (7, 2, [0, 3, 7]),
        (1_281_167, 4, [0, 320291, 640583, 960875, 1281167]),
    ],
)
def test_shard_starts_cut_by_rank(records, shards, expected):
    starts = keys.shard_starts(records, shards)
    assert starts == expected
    sizes = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert all(size >= 1 for size in sizes) and (not sizes or max(sizes) - min(sizes) <= 1)


@pytest.mark.parametrize("records, shards", [(3, 4), (0, 1), (5, 0), (-1, 1)])
def test_shard_starts_refuses_empty_shards(records, shards):
    with pytest.raises(ValueError):
        keys.shard_starts(records, shards)


@pytest.mark.parametrize(
    "key, boundaries, expected",
    [
        (0, (), 0),
        (2**64 - 1, (), 0),
        (9, (10, 20), 0),
        (10, (10, 20), 1),  # a boundary is the first key of its shard
        (19, (10, 20), 1),
        (20, (10, 20), 2),
        (2**64 - 1, (10, 20), 2),
    ],
)
def test_shard_of_key(key, boundaries, expected):
    assert keys.shard_of_key(key, boundaries) == expected


def test_shard_of_key_rejects_out_of_range():
    with pytest.raises(ValueError):
        keys.shard_of_key(2**64, (5,))


@pytest.mark.parametrize("n", [1, 2, 7, 8, 13])
def test_rank_boundaries_give_n_nonempty_shards_of_sorted_keys(n):
    """Reading shards 0..n-1, each sorted, yields all keys in increasing order."""
    all_keys = sorted(keys.order_key(5, f"id{i}") for i in range(13))
    starts = keys.shard_starts(len(all_keys), n)
    boundaries = [all_keys[i] for i in starts[1:-1]]
    shards = [[k for k in all_keys if keys.shard_of_key(k, boundaries) == i] for i in range(n)]
    assert all(shards)
    assert [k for shard in shards for k in shard] == all_keys


def test_shard_filename():
    assert keys.shard_filename("train", 3, 12) == "train-00003-of-00012.tfrecord"
