"""Every flag's value is checked before any work, ours and Beam's alike.

The cases are derived from the declarations (core/flags.py's FLAGS, Beam's
option table), so a flag added later is covered without a new row: a float
that is not finite or too large, an int past 64 bits, an empty text; for
Beam's numbers, negatives and values past Java's int too.
"""

import os
import subprocess
import sys

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.beam_internals import _beam_option_table, beam_options
from beam_pipeline.cli import arguments
from beam_pipeline.core import flags
from beam_pipeline.core.errors import UsageError
from tests.image_factory import make_class_folders

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each of our kinds refuses in any flag of that kind, whatever its check says.
OURS_BAD = {
    "float": ("inf", "-inf", "nan", "1e308", "-1e308"),
    "int": (str(10**30), str(-(10**30)), str(2**63)),
    "str": ("", "  "),
}
OUR_CASES = [(flag.name, text) for flag in flags.FLAGS for text in OURS_BAD.get(flag.kind, ())]
# What each kind of Beam flag refuses: its numbers count or measure something.
BEAM_BAD = {"int": ("-3", "-1", str(2**31)), "float": ("nan", "inf", "-inf", "-0.5"), "text": ("",)}
BEAM_CASES = [
    (name, text)
    for name, (kind, *_) in _beam_option_table.TABLE["options"].items()
    for text in BEAM_BAD.get(kind, ())
]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("values") / "images"
    make_class_folders(str(root), per_class=2, nested=False)
    return root


@pytest.mark.parametrize("name, text", OUR_CASES)
def test_each_of_our_flags_refuses_what_its_kind_refuses(
    name, text, images, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # where a blank --output would land
    out = tmp_path / "out"
    argv = ["--input", str(images), "--output", str(out), f"--{name}={text}"]
    if name == "output":
        argv = ["--input", str(images), f"--output={text}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --{name} "), err
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("name, text", BEAM_CASES)
def test_each_beam_flag_refuses_what_its_kind_refuses(name, text):
    with pytest.raises(UsageError) as refused:
        beam_options.check([f"{name}={text}"])
    message = str(refused.value)
    assert message.startswith(f"{name} ") and "\n" not in message


def test_beams_empty_value_given_apart_is_refused_too():
    with pytest.raises(UsageError, match="^--project is empty"):
        beam_options.check(["--project", "", "--region", "r"])


@pytest.mark.parametrize(
    "argv",
    [
        ["--direct_num_workers", "0"],  # Beam's "every core"
        ["--num_workers", "2", "--max_num_workers=40"],
        ["--profile_sample_rate=0.5"],
        ["--direct_running_mode", "multi_threading"],
    ],
)
def test_ordinary_beam_values_still_pass(argv):
    assert beam_options.check(argv).args == tuple(argv)


@pytest.mark.parametrize(
    "extra",
    [
        ["--seed", "-5"],
        ["--seed", str(2**63 - 1)],
        ["--target_shard_mb", "0.001"],
        ["--target_shard_mb", "1e6"],
        ["--min_shards", "99999"],
        ["--gcs_timeout_s", "86400"],
        ["--image_timeout_s", "0"],
        ["--group_by", r"^([^/]+/p\d+)_"],
    ],
)
def test_ordinary_values_of_ours_still_pass(extra, tmp_path):
    arguments.parse_args(["--input", str(tmp_path), "--output", str(tmp_path / "o"), *extra])


@pytest.mark.parametrize(
    "name, text, says",
    [
        ("target_shard_mb", "inf", "must be a finite number, got inf"),
        ("target_shard_mb", "nan", "must be a finite number, got nan"),
        ("target_shard_mb", "1e308", "must be above 0 and at most 1e+06, got 1e+308"),
        ("reuse", "", "is empty"),
        ("min_shards", "100000", "must be in 1..99999"),
        ("seed", str(2**63), "must be in -9223372036854775807..9223372036854775807"),
    ],
)
def test_the_line_names_the_flag_and_what_is_wrong(name, text, says, tmp_path):
    argv = ["--input", str(tmp_path), "--output", str(tmp_path / "o"), f"--{name}={text}"]
    with pytest.raises(UsageError) as refused:
        arguments.parse_args(argv)
    assert str(refused.value).startswith(f"--{name} {says}")


def test_every_float_flag_has_an_upper_bound():
    """1e308 passes a bare "positive" check and then overflows (MB to bytes); every
    float flag's own check bounds it."""
    for flag in flags.FLAGS:
        if flag.kind == "float":
            assert flag.problem(1e308), f"--{flag.name} takes 1e308"


@pytest.mark.e2e
def test_a_negative_direct_num_workers_stops_before_anything_is_forked_or_written(images, tmp_path):
    out = tmp_path / "out"
    argv = ["--input", str(images), "--output", str(out), "--quiet"]
    done = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", *argv, "--direct_num_workers", "-3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["error: --direct_num_workers must not be negative, got -3"]
    assert not out.exists()
