"""bench/tools/interleave.py: the order of the rounds, the commands, the ratios and the table."""

from __future__ import annotations

import math
import sys

import pytest

from bench.tools import interleave


@pytest.mark.parametrize(
    "rounds, order",
    [
        (1, [(0, "old"), (0, "new")]),
        (2, [(0, "old"), (0, "new"), (1, "new"), (1, "old")]),
        (3, [(0, "old"), (0, "new"), (1, "new"), (1, "old"), (2, "old"), (2, "new")]),
    ],
)
def test_rounds_alternate_and_take_turns_going_first(rounds, order):
    assert interleave.round_order(("old", "new"), rounds) == order


def test_a_round_is_the_converter_then_the_reader_of_the_commits_own_bench(tmp_path):
    results, cache = tmp_path / "results", tmp_path / "cache"
    converter, reader = interleave.bench_commands(results, cache)
    tail = ["--results-dir", str(results), "--cache-dir", str(cache)]
    assert converter == [sys.executable, "-m", "bench", "--only", "converter",
                         "--converters", "floor,imagerecords", "--repeats", "1", *tail]  # fmt: skip
    assert reader == [sys.executable, "-m", "bench", "--only", "reader", "--read-rounds", "1",
                      *tail]  # fmt: skip


def _results(web_ir: float, web_floor: float, train: float, keras: float) -> dict:
    row = {"cpu_ms_per_image": 1.0}
    return {
        "converter": {
            "rows": [
                {**row, "image_set": "web", "converter": "imagerecords", "images_per_s": web_ir},
                {**row, "image_set": "web", "converter": "floor", "images_per_s": web_floor},
            ]
        },
        "reader": {
            "rows": [
                {**row, "variant": "imagerecords_train", "images_per_s": train},
                {**row, "variant": "keras_dir", "images_per_s": keras},
            ]
        },
    }


def test_headlines_are_reports_ratios_and_a_half_not_run_is_nan():
    ratios = interleave.headlines(_results(90.0, 100.0, 3000.0, 1000.0))
    assert set(ratios) == set(interleave.HEADLINES)
    assert ratios["converter_web_vs_floor"] == pytest.approx(0.9)
    assert ratios["reader_train_vs_keras"] == pytest.approx(3.0)
    assert ratios["converter_web_cpu_floor_over_ir"] == pytest.approx(1.0)
    assert math.isnan(ratios["converter_phone_vs_floor"])  # no phone rows


@pytest.mark.parametrize(
    "values, median, low, high, rounds",
    [
        ([1.0, 3.0, 2.0], 2.0, 1.0, 3.0, 3),
        ([1.0, float("nan"), 2.0], 1.5, 1.0, 2.0, 2),
        ([0.9], 0.9, 0.9, 0.9, 1),
    ],
)
def test_spread_leaves_out_the_rounds_that_failed(values, median, low, high, rounds):
    assert interleave.spread(values) == {
        "median": median, "low": low, "high": high, "rounds": rounds
    }  # fmt: skip


def test_spread_of_no_measured_round_is_nan():
    got = interleave.spread([float("nan")])
    assert got["rounds"] == 0 and math.isnan(got["median"])


def test_the_table_has_every_round_with_its_load_and_each_commits_median():
    rounds = []
    for index, rev, web in ((0, "aaaaaaa", 0.8), (0, "bbbbbbb", 0.9), (1, "bbbbbbb", 1.1),
                            (1, "aaaaaaa", 0.84)):  # fmt: skip
        ratios = {k: float("nan") for k in interleave.HEADLINES}
        ratios["converter_web_vs_floor"] = web
        rounds.append({"round": index, "rev": rev, "ratios": ratios,
                       "loadavg_before": [7.0, 6, 5], "loadavg_after": [9.25, 8, 7]})  # fmt: skip
    result = {
        "revs": ["aaaaaaa", "bbbbbbb"],
        "rounds": rounds,
        "summary": interleave.summarize(rounds, ("aaaaaaa", "bbbbbbb")),
    }
    text = interleave.markdown(result)
    assert "| 2 | aaaaaaa | 0.84x | n/a |" in text
    assert "| 7.0 / 9.2 |" in text or "| 7.0 / 9.3 |" in text
    label = interleave.HEADLINES["converter_web_vs_floor"]
    assert f"| {label} | 0.82x (0.80x-0.84x, 2 rounds) | 1.00x (0.90x-1.10x, 2 rounds) |" in text


@pytest.mark.e2e  # runs git
def test_a_name_that_is_no_commit_is_refused_in_one_line():
    with pytest.raises(SystemExit, match=r"^error: 'no-such-rev' names no commit here"):
        interleave.resolve("no-such-rev")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in (b"Z", b"X")


@pytest.mark.e2e  # starts a child with a grandchild in a session of its own
def test_kill_tree_ends_a_grandchild_in_its_own_session(tmp_path):
    import subprocess
    import time

    pid_file = tmp_path / "grandchild.pid"
    grandchild = (
        "import os, time; "
        f"open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid())); "
        f"os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r}); time.sleep(600)"
    )
    child = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}], start_new_session=True); "
        "time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", child])
    deadline = time.monotonic() + 60
    while not pid_file.exists():  # the grandchild says it is up
        assert time.monotonic() < deadline, "the grandchild never started"
        time.sleep(0.05)
    grandchild_pid = int(pid_file.read_text())
    interleave.kill_tree(proc.pid)
    assert proc.wait(timeout=30) == -9
    while _alive(grandchild_pid):  # SIGKILL is delivered; wait for it to land
        assert time.monotonic() < deadline, "the grandchild outlived kill_tree"
        time.sleep(0.05)


def test_the_trainers_suite_runs_the_trainers_bench_and_reads_its_file(tmp_path):
    suite = interleave.SUITES["trainers"]
    (command,) = interleave.bench_commands(tmp_path / "r", tmp_path / "c", suite.parts)
    assert command[3:7] == ["--only", "trainers", "--read-rounds", "1"]
    assert suite.result_file == "trainers.json"


def test_trainer_headlines_are_each_loader_over_the_floor_and_a_failed_row_is_nan():
    rows = [
        {"variant": "crop_loop", "ok": True, "cpu_ms_per_image": 0.5, "images_per_s": 2000.0},
        {"variant": "reader_uint8", "ok": True, "cpu_ms_per_image": 0.4, "images_per_s": 4000.0},
        {"variant": "grain_workers", "ok": False},
    ]
    ratios = interleave.trainer_headlines({"rows": rows})
    assert set(ratios) == set(interleave.TRAINER_HEADLINES)
    assert ratios["reader_uint8_cpu_over_floor"] == pytest.approx(0.8)
    assert ratios["reader_uint8_speed_over_floor"] == pytest.approx(2.0)
    assert math.isnan(ratios["grain_workers_cpu_over_floor"])
    floorless = interleave.trainer_headlines({"rows": rows[1:]})
    assert math.isnan(floorless["reader_uint8_cpu_over_floor"])
