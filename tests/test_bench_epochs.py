"""bench.common.epochs: how the loader workers count, time and report their epochs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bench.common.epochs import (
    RESULT_PREFIX,
    pass_images,
    print_result,
    pull_images,
    read_results,
    time_epochs,
    timed_result,
)


def _batches(*sizes):
    """Batches as the pipelines yield them: (images, labels), one row per image."""
    return [(np.zeros((n, 2, 2, 3)), np.zeros(n)) for n in sizes]


@pytest.mark.parametrize(
    "sizes, count, images, left",
    [
        ((4, 4, 4), 8, 8, 1),  # stops as soon as the epoch's images came out
        ((4, 4, 4), 5, 8, 1),  # a batch is never split: the epoch ends on a whole batch
        ((3, 3, 3), 9, 9, 0),
        ((4,), 0, 0, 1),  # nothing asked, nothing pulled
    ],
)
def test_pull_images_takes_batches_until_the_count(sizes, count, images, left):
    iterator = iter(_batches(*sizes))
    assert pull_images(iterator, count) == images
    assert len(list(iterator)) == left  # the rest stays for the next epoch


@pytest.mark.parametrize("sizes, images", [((4, 4, 1), 9), ((), 0), ((7,), 7)])
def test_pass_images_counts_one_whole_pass(sizes, images):
    assert pass_images(_batches(*sizes)) == images


def test_time_epochs_leaves_out_the_warmup():
    epoch_images = iter([10, 20, 30, 40])
    cpu = itertools.count(0.0, 0.5)  # each reading half a CPU second later than the last
    seconds, counts, cpu_s = time_epochs(lambda: next(epoch_images), 2, 2, lambda: next(cpu))
    assert counts == [30, 40]
    assert len(seconds) == 2 and all(s >= 0 for s in seconds)
    assert cpu_s == 1.0  # one reading before and one after each of the two timed epochs


def test_a_timed_result_has_the_rates_of_its_epochs():
    result = timed_result("v", lambda: "pipeline", lambda p: ([2.0, 2.0], [10, 30], 0.8))
    assert result["ok"] and result["variant"] == "v"
    assert result["images_per_s"] == 10.0
    assert result["cpu_ms_per_image"] == pytest.approx(20.0)
    assert result["epoch_images"] == [10, 30] and result["build_s"] >= 0


def _fails_to_build():
    raise ValueError("no shards")


@pytest.mark.parametrize(
    "build, time_pipeline, note",
    [
        (_fails_to_build, None, "ValueError: no shards"),
        (lambda: "pipeline", lambda p: ([1.0], [0], 0.0), "the pipeline produced no batches"),
        (lambda: "pipeline", lambda p: ([], [], 0.0), "the pipeline produced no batches"),
    ],
)
def test_a_failed_variant_is_a_result_not_a_crash(build, time_pipeline, note):
    result = timed_result("v", build, time_pipeline)
    assert not result["ok"]
    assert note in result["note"]


def test_the_harness_reads_back_what_the_worker_prints(capsys):
    print("a log line")
    print_result({"variant": "a", "ok": True, "images_per_s": 1.5})
    print(RESULT_PREFIX.strip() + "S follow")  # not a result line
    print_result({"variant": "b", "ok": False, "note": "x"})
    results = read_results(capsys.readouterr().out)
    assert results == {
        "a": {"variant": "a", "ok": True, "images_per_s": 1.5},
        "b": {"variant": "b", "ok": False, "note": "x"},
    }
