"""scripts/test_any_machine.sh (`make test-any-machine`) runs its command four
times, each way the README's development section says, stops at the first
failure naming it, and leaves none of its busy processes behind.

Each test gives the script a small probe for a command instead of the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "test_any_machine.sh")
# One JSON line per run: its TF_ENABLE_ONEDNN_OPTS and the processes beside it
# (the script's other children: the busy processes, whatever program each is at
# the moment), each as [pid, start time]; exits 1 where FAIL_WITH names its value,
# or is "loaded" and the busy processes run.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    beside = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(pid) != os.getpid() and int(fields[1]) == os.getppid():
            beside.append([int(pid), int(fields[19])])
    value = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    with open(sys.argv[1], "a") as runs:
        runs.write(json.dumps({"onednn": value, "beside": sorted(beside)}) + "\\n")
    fail_with = os.environ.get("FAIL_WITH")
    sys.exit(1 if fail_with and fail_with in (value, "loaded" if beside else None) else 0)
    """
)


def _script(tmp_path, *args, fail_with=None):
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if fail_with is not None:
        env["FAIL_WITH"] = fail_with
    log = tmp_path / "runs.jsonl"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    command = [sys.executable, str(probe), str(log)]
    result = subprocess.run(
        ["bash", SCRIPT, *args, *command], env=env, capture_output=True, text=True, timeout=120
    )
    runs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, runs


def _alive(pid: int, started: int) -> bool:
    """Whether the process ``pid`` that started at ``started`` (clock ticks) still runs."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return False
    return int(fields[19]) == started and fields[0] != "Z"


def test_the_command_runs_with_onednn_on_off_then_twice_beside_two_busy_processes(tmp_path):
    result, runs = _script(tmp_path)
    assert result.returncode == 0, result.stderr
    assert [run["onednn"] for run in runs] == ["1", "0", None, None]
    assert [len(run["beside"]) for run in runs] == [0, 0, 2, 2]
    assert runs[2]["beside"] == runs[3]["beside"]  # one hog for both loaded runs
    assert not [p for p in runs[2]["beside"] if _alive(*p)], "a busy process outlived the script"
    assert result.stderr.splitlines()[-1] == "=== all four runs passed"


@pytest.mark.parametrize(
    "fail_with, runs_made, name",
    [
        ("1", 1, "TF_ENABLE_ONEDNN_OPTS=1"),
        ("0", 2, "TF_ENABLE_ONEDNN_OPTS=0"),
        ("loaded", 3, "two busy processes beside it (1 of 2)"),
    ],
)
def test_the_first_failing_run_stops_the_script_and_is_named(tmp_path, fail_with, runs_made, name):
    result, runs = _script(tmp_path, fail_with=fail_with)
    assert result.returncode == 1
    assert len(runs) == runs_made
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: ") and last.endswith(f" failed with {name}")
    assert not [p for p in runs[-1]["beside"] if _alive(*p)], "a busy process outlived the script"


def test_the_dry_run_names_the_four_runs_and_runs_nothing(tmp_path):
    result, runs = _script(tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert runs == []
    names = [line.rpartition(": ")[2] for line in result.stderr.splitlines()]
    assert names == [
        "TF_ENABLE_ONEDNN_OPTS=1",
        "TF_ENABLE_ONEDNN_OPTS=0",
        "two busy processes beside it (1 of 2)",
        "two busy processes beside it (2 of 2)",
        "nothing ran",
    ]


def test_without_a_command_it_runs_make_test():
    result = subprocess.run(
        ["bash", SCRIPT, "--dry-run"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert result.stderr.splitlines()[0] == "=== make test: TF_ENABLE_ONEDNN_OPTS=1"


def test_an_unknown_option_is_one_error_line_and_runs_nothing(tmp_path):
    result, runs = _script(tmp_path, "--fast")
    assert (result.returncode, runs) == (2, [])
    assert result.stderr.startswith("error: unknown option --fast")
    assert len(result.stderr.splitlines()) == 1
