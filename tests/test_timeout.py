"""--image_timeout_s: a stalling image becomes a rejection and the job goes on."""

import sys
import threading
import time

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import deadline, images
from tests import contract
from tests.image_factory import make_class_folders


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # Python code: the soft limit interrupts it
        pass


@pytest.mark.parametrize("where", ["main thread", "worker thread"])
def test_the_limit_interrupts_python_code_in_any_thread(where):
    outcome = {}

    def work():
        started = time.monotonic()
        try:
            with deadline.limit(0.5, "test image"):
                _spin(10)
            outcome["result"] = "finished"
        except deadline.ImageTimeout:
            outcome["result"] = "timed out"
        outcome["seconds"] = time.monotonic() - started

    if where == "main thread":
        work()
    else:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join(10)
    assert outcome["result"] == "timed out"
    # Not before the limit; how long after it is the scheduler's business (the
    # spin lasts 10 s, so "timed out" already says the limit ended it).
    assert outcome["seconds"] >= 0.5


def test_no_exception_leaks_after_a_block_that_finished_in_time():
    for _ in range(200):
        with deadline.limit(5):
            pass
    _spin(0.6)  # the watchdog polls every 0.25 s: nothing may fire now
    assert not deadline._active


_REAL_CONVERT = images.convert
_STALL_ON = b""
_HOW = "spin"


def _stalling_convert(data, spec):
    if data == _STALL_ON:
        if _HOW == "spin":
            _spin(60)
        else:
            time.sleep(60)  # one native call: only the hard limit ends it
    return _REAL_CONVERT(data, spec)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "processes, how",
    [("1", "spin"), ("2", "spin"), ("2", "native")],
    ids=["inline-python", "pool-python", "pool-native-call"],
)
def test_a_stalling_image_is_rejected_and_the_job_finishes(tmp_path, monkeypatch, processes, how):
    root = tmp_path / "images"
    ids = make_class_folders(str(root), classes=("a", "b"), per_class=6, nested=False)
    victim = sorted(ids)[2]
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "_STALL_ON", (root / victim).read_bytes())
    monkeypatch.setattr(module, "_HOW", how)
    monkeypatch.setattr(images, "convert", _stalling_convert)
    argv = ["--input", str(root), "--output", str(tmp_path / "out"), "--quiet"]
    argv += ["--image_timeout_s", "1", "--max_reject_fraction", "0.5"]
    argv += ["--local_processes", processes, "--direct_running_mode=in_memory"]
    # The stalled image is rejected for its time, so the job did not wait out the
    # stall (how long it took is the machine's business).
    assert main(argv) == 0
    rejects = {r["id"]: r["reason"] for r in contract.read_rejects(str(tmp_path / "out"))}
    assert list(rejects) == [victim]
    assert rejects[victim] == "timed out: converting took longer than --image_timeout_s 1"
    written = [
        i
        for rows in contract.check_output(str(tmp_path / "out")).values()
        for i in contract.ids(rows)
    ]
    assert sorted(written) == sorted(set(ids) - {victim})


@pytest.mark.e2e
def test_a_timed_out_image_is_converted_again_when_the_run_resumes(tmp_path, monkeypatch, capsys):
    """A timeout is no property of the image's bytes: a resumed run retries it,
    with a higher limit too, and the result is what an uninterrupted run gives."""
    root = tmp_path / "images"
    ids = make_class_folders(str(root), classes=("a", "b"), per_class=6, nested=False)
    victim = sorted(ids)[2]
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "_STALL_ON", (root / victim).read_bytes())
    monkeypatch.setattr(images, "convert", _stalling_convert)
    out = tmp_path / "out"
    argv = ["--input", str(root), "--output", str(out), "--local_processes", "2"]
    argv += ["--image_size", "24", "--max_reject_fraction", "0"]
    assert main([*argv, "--image_timeout_s", "1"]) == 1  # the one timeout fails the run
    assert "timed out:" in capsys.readouterr().err
    monkeypatch.undo()  # the image converts in time now (a quieter machine)
    # A lower limit could keep records that it would have rejected: refused.
    assert main([*argv, "--image_timeout_s", "0.5"]) == 2
    assert "(image_timeout_s lowered from 1 to 0.5)" in capsys.readouterr().err
    assert main([*argv, "--image_timeout_s", "30"]) == 0
    counted = capsys.readouterr().out
    assert "images_converted=1," in counted and f"images_resumed={len(ids) - 1}" in counted
    reference = tmp_path / "reference"
    assert main([*argv[:3], str(reference), *argv[4:], "--image_timeout_s", "30"]) == 0
    assert contract.all_files(str(out)) == contract.all_files(str(reference))
    assert contract.read_rejects(str(out)) == []
