"""--group_by cannot hang the run, and what it prints is escaped.

IDs are matched by ``regex`` with a time bound per ID (core/groups.py); the
group each ID gets for an ordinary pattern is the one ``re`` gives. Group
names and patterns are printed as class names are (core/text.shown).
"""

import os
import random
import re
import signal
import subprocess
import sys

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import groups, settings
from tests.image_factory import jpeg_bytes, photo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATASTROPHIC = r"^[^/]+/((a|aa)+)+$"  # from issue 43: years on a 26-letter name

ORDINARY = [
    groups.EXAMPLE.split("'")[1],
    r"^[^/]+/(p\d+)_",
    r"_(\d+)\.",
    r"(?i)/(PATIENT\d+)",
    r"^([^/]+)/",
    r"(\w+)-\d+\.jpg$",
    r"/(?P<scan>[a-z]+)(?=_)",
    r"^(?:train|val)/([^/]+)/",
    r"(x)?y",  # a group that takes no part: the ID is its own group
    r"(a)|(b)",
    r"/((?:ab)+)",
    r"(\d{2,4})$",
    r"^(.*)_\d+",
    r"(é+)",
    r"(\b\w)",
    r"([A-Z])\1",
    r"([^/]*)$",
]


def _ids(n=400):
    rng = random.Random(43)
    alphabet = "ab_-./0123456789xyzXYZéAB "
    found = ["cat/p07_2.jpg", "scan/PATIENT12/x.png", "train/dog/ab-12.jpg", "a/ababab_1", ""]
    for _ in range(n):
        found.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30))))
    return found


@pytest.mark.parametrize("pattern", ORDINARY)
def test_an_ordinary_pattern_gives_each_id_the_group_re_gives(pattern):
    compiled = re.compile(pattern)
    for image_id in _ids():
        match = compiled.search(image_id)
        expected = (match.group(1) or None) if match else None
        assert groups.group_of(pattern, image_id) == expected, (pattern, image_id)


@pytest.mark.parametrize("pattern", ["(a)\n", "(a)\x1b[2J", "(a)\t", "(\u200ba)"])
def test_a_pattern_with_a_control_character_is_refused_in_one_line(pattern, tmp_path, capsys):
    assert (
        main(["--input", str(tmp_path), "--output", str(tmp_path / "o"), "--group_by", pattern])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --group_by '(") and "\x1b" not in err
    assert "holds the control character" in err
    assert not (tmp_path / "o").exists()


def _write(root, rel, seed):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(jpeg_bytes(photo(24, 20, seed=seed)))


@pytest.mark.e2e
def test_a_pattern_that_backtracks_without_bound_ends_the_run_with_one_line(tmp_path):
    root = tmp_path / "in"
    _write(str(root), "cls/" + "a" * 30 + ".jpg", 1)
    _write(str(root), "cls/b.jpg", 2)
    out = tmp_path / "out"
    argv = ["--input", str(root), "--output", str(out), "--quiet", "--group_by", CATASTROPHIC]
    process = subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = process.communicate(timeout=300)  # the pattern alone takes years
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    assert process.returncode == 2, err
    (line,) = err.splitlines()
    assert line.startswith(f"error: --group_by '{CATASTROPHIC}' took over 1 s on the image ID ")
    assert "'cls/" + "a" * 30 + ".jpg'" in line and "backtracks without bound" in line
    assert not (out / "imagerecords.json").exists()


def _straddling_block(names):
    census = groups.Census()
    for name in names:
        census.add("train", name, 0)
        census.add("val", name, 1)
    return groups.info_block(census, r"/(p\d)_", ["train", "val"], {"train": 0.5, "val": 0.5})


def test_group_names_and_the_pattern_are_printed_escaped():
    block = _straddling_block(["\x1b[2Jwiped", "two\nlines"])
    block["group_by"] = "(a)\x1b]0;title\x07"  # a dataset's metadata says what it likes
    lines = groups.report_lines(block)
    printed = "\n".join(lines)
    assert not any(c != "\n" and not c.isprintable() for c in printed), printed
    assert len(printed.splitlines()) == len(lines)
    assert lines[0].startswith(r"groups (--group_by '(a)\x1b]0;title\x07'): ")
    assert r"'\x1b[2Jwiped' (train 1, val 1)" in printed and r"'two\nlines'" in printed


@pytest.mark.e2e
def test_a_manifests_group_name_reaches_the_summary_escaped(tmp_path, capsys):
    root = tmp_path / "in"
    _write(str(root), "a.jpg", 1)
    _write(str(root), "b.jpg", 2)
    manifest = tmp_path / "m.csv"
    manifest.write_text(
        'path,label,split,group\na.jpg,cat,train,"\x1b[2J\nx"\nb.jpg,cat,val,"\x1b[2J\nx"\n'
    )
    argv = ["--manifest", str(manifest), "--input", str(root), "--output", str(tmp_path / "o")]
    assert main([*argv, "--splits", "train=0.5,val=0.5"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    (warning,) = [line for line in out.splitlines() if "in two or more splits" in line]
    assert warning.endswith(r"'\x1b[2J\nx' (train 1, val 1)")


@pytest.mark.parametrize(
    "value, printed",
    [
        (r"^([^/]+)/", r"^([^/]+)/"),  # an ordinary pattern as typed
        ("shorter", "shorter"),
        ("(a)\x1b[2J\n", r"(a)\x1b[2J\n"),  # as an old dataset's metadata may hold it
        ("x\udcff", r"x\xff"),
    ],
)
def test_a_setting_is_printed_escaped(value, printed):
    """The line naming what differs from an unfinished run or a --reuse dataset."""
    assert settings.show(value) == printed
    assert settings.describe({"group_by": value}) == f"group_by {printed}"
