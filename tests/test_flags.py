"""The flag table (beam_pipeline/core/flags.py) is the one declaration of every flag.

The parser, the configs' defaults and checks, the Flex Template's parameters
and docs/flags.md's table come from it (the last two rendered by
scripts/write_flags.py); these tests fail when one of them is written out by
hand again, or disagrees with the table.
"""

import ast
import dataclasses
import importlib.util
import io
import re
from pathlib import Path

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.cli import arguments, dryrun
from beam_pipeline.core import digit_ranges, flags, images, keys, settings
from beam_pipeline.core.errors import UsageError
from beam_pipeline.stages.job_config import JobConfig
from tests.image_factory import make_class_folders

ROOT = Path(__file__).resolve().parent.parent


def _writer():
    spec = importlib.util.spec_from_file_location(
        "write_flags", ROOT / "scripts" / "write_flags.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WRITER = _writer()
PAGES = {"deploy/metadata.json": WRITER.metadata_text, "docs/flags.md": WRITER.flags_page_text}


@pytest.mark.parametrize("path", sorted(PAGES))
def test_the_generated_files_are_what_make_flags_writes(path):
    current = (ROOT / path).read_text()
    assert PAGES[path](current) == current, f"{path} differs from core/flags.py: run make flags"


def test_make_flags_rewrites_a_stale_table():
    page = (ROOT / "docs" / "flags.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `--seed`"))
    stale = page.replace(row, row.replace("42", "7"))
    assert stale != page and WRITER.flags_page_text(stale) == page


def test_the_flag_table_has_one_row_per_flag():
    page = (ROOT / "docs" / "flags.md").read_text()
    table = page[page.index(WRITER.TABLE_BEGIN) : page.index(WRITER.TABLE_END)]
    named = re.findall(r"^\| `--(\w+)`", table, re.M)
    assert named == [flag.name for flag in flags.FLAGS]


def test_the_core_renders_no_document():
    """The table's renderings live in scripts/write_flags.py, not in the product."""
    names = ("template_parameters", "readme_table", "KIND_REGEX", "_KIND_REGEX")
    rendered = [name for name in names if hasattr(flags, name)]
    assert rendered == []


@pytest.mark.parametrize(
    "lo, hi", [(1, 100), (1, 65500), (0, 86400), (3, 7), (10, 999), (5, 12), (99, 101), (1, None)]
)
def test_an_integer_range_regex_matches_exactly_the_range(lo, hi):
    regex = re.compile(digit_ranges.int_range_regex(lo, hi))
    top = (hi or 2000) + 100
    wrong = [n for n in range(top) if bool(regex.match(str(n))) != (lo <= n <= (hi or top))]
    assert wrong == []
    assert not regex.match("-1") and not regex.match("01" if lo else "-0")


# Texts a flag may be given; the template must not refuse one the flag accepts.
_TRIES = ["0", "1", "-1", "7", "42", "100", "101", "65500", "65501", "0.5", "1.0", "1.5", "abc"]
_TRIES += [*flags.BOOLEAN_WORDS, "maybe"]


@pytest.mark.parametrize(
    "flag", [f for f in flags.FLAGS if f.template and not f.template.regex], ids=lambda f: f.name
)
def test_a_template_regex_refuses_no_value_the_flag_accepts(flag):
    parameter = next(p for p in WRITER.template_parameters() if p["name"] == flag.name)
    (regex,) = parameter["regexes"]
    tries = [*_TRIES, flag.default_text]
    if flag.check:
        tries += flag.check.choices
    for text in tries:
        value = _value(flag, text)
        good = value is not _BAD and not flag.problem(value)
        if good:
            assert re.match(regex, text), f"--{flag.name}={text} is good, the template refuses it"
        elif (flag.kind == "int" and flag.check) or flag.kind == "bool":
            # An integer range and a switch are exact: nothing bad gets through either.
            assert not re.match(regex, text), f"the template lets --{flag.name}={text} through"


_BAD = object()


def _value(flag, text):
    try:
        if flag.kind == "bool":
            return arguments._boolean(text)
        return {"int": int, "float": float, "str": str}[flag.kind](text)
    except Exception:  # argparse's ArgumentTypeError included
        return _BAD


def _filled():
    """(config class, field, flag) of every config field a flag fills."""
    found = []
    for config_type in (JobConfig, images.ImageSpec):
        for field in dataclasses.fields(config_type):
            flag = settings.flag_of(field)
            if flag is not None:
                found.append((config_type, field, flag))
    return found


def test_every_flag_fills_a_config_field_or_a_run_option():
    filled = [flag.name for _, _, flag in _filled()]
    assert len(filled) == len(set(filled)), "a flag fills two fields"
    run_flags = [f.name for f in flags.FLAGS if f.name not in filled]
    assert sorted(f.name for f in dataclasses.fields(arguments.RunOptions)) == sorted(run_flags)


def test_a_field_filled_by_a_flag_takes_its_default_from_the_flag():
    for config_type, field, flag in _filled():
        if flag.required:
            assert field.default is dataclasses.MISSING, field.name
            continue
        default = field.default
        if default is dataclasses.MISSING:
            default = field.default_factory()
        assert default == flag.field_value(flag.default), f"{config_type.__name__}.{field.name}"


def test_the_help_shows_each_declared_default():
    shown = arguments.build_parser().format_help()
    shown = " ".join(shown.split())
    for flag in flags.FLAGS:
        if "{default}" in flag.help:
            assert f"default {flag.default_text}" in shown, flag.name


def test_every_checked_flag_refuses_a_bad_value_on_the_command_line(tmp_path):
    """Each flag with a check, given a value that check refuses, stops the
    parse: also the flags whose field holds what the value became (--dedupe,
    --splits), which no config can check back."""
    probed = []
    for flag in flags.FLAGS:
        if flag.check is None:
            continue
        for text in ("no such value", "-99999", "-1e9"):
            value = _value(flag, text)
            if value is not _BAD and flag.problem(value):
                break
        else:
            continue  # no probe is a bad value of the right type for this flag
        probed.append(flag.name)
        argv = ["--input", str(tmp_path), "--output", str(tmp_path / "o"), f"--{flag.name}={text}"]
        with pytest.raises(UsageError, match=re.escape(flag.option)):
            arguments.parse_args(argv)
    assert {"dedupe", "splits", "resize", "image_size"} <= set(probed), probed


# A bad value of each checked flag that fills a config field.
BAD = [
    ("image_size", "0"),
    ("jpeg_quality", "101"),
    ("resize", "stretch"),
    ("resample", "nearest"),
    ("image_timeout_s", "-1"),
    ("target_shard_mb", "0"),
    ("min_shards", "0"),
    ("max_reject_fraction", "1.5"),
    ("group_by", "no-capture-group"),
]


@pytest.mark.parametrize("name, text", BAD)
def test_the_command_line_and_a_config_built_in_code_refuse_alike(name, text, tmp_path):
    """One check per value: the CLI's error line is the config's own message."""
    argv = ["--input", str(tmp_path), "--output", str(tmp_path / "o"), f"--{name}={text}"]
    with pytest.raises(UsageError) as cli:
        arguments.parse_args(argv)
    flag = flags.BY_NAME[name]
    value = flag.field_value(_value(flag, text))
    config_type, field, _ = next(found for found in _filled() if found[2] is flag)
    with pytest.raises(ValueError) as built:
        if config_type is images.ImageSpec:
            images.ImageSpec(**{field.name: value})
        else:
            JobConfig(layout=None, output="o", splits={"train": 1.0}, **{field.name: value})
    assert str(cli.value) == str(built.value)


def test_parsing_gives_a_frozen_config_and_run_options(tmp_path):
    argv = ["--input", str(tmp_path), "--output", str(tmp_path / "o"), "--quiet"]
    command = arguments.parse_args([*argv, "--min_shards", "3", "--image_size", "64"])
    assert isinstance(command.config, JobConfig) and command.config.min_shards == 3
    assert command.config.image.size == 64 and command.config.splits == keys.parse_splits(
        keys.DEFAULT_SPLITS
    )
    assert command.options.quiet is True and command.options.wait is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.options.extra = 1


def test_the_dry_run_plans_with_the_config_it_is_given(tmp_path):
    root = tmp_path / "in"
    make_class_folders(str(root), classes=("a", "b"), per_class=6, nested=False)
    command = arguments.parse_args(["--input", str(root), "--output", str(tmp_path / "o")])
    command = arguments.discover(command)
    # A config that no flag spelled: the dry run must take its splits and shard settings.
    config = dataclasses.replace(command.config, splits={"only": 1.0}, min_shards=4)
    found = dryrun.report(dataclasses.replace(command, config=config), None, out=io.StringIO())
    assert list(found["splits"]) == ["only"]
    assert found["splits"]["only"]["shards"] == 4


def test_a_capped_local_processes_is_what_the_config_gets(tmp_path, capsys):
    argv = ["--input", str(tmp_path), "--output", str(tmp_path / "o"), "--local_processes=100000"]
    command = arguments.parse_args(argv)
    cap = flags.MAX_PROCESSES_PER_CORE * (__import__("os").cpu_count() or 1)
    assert command.options.local_processes == cap == command.config.conversion_processes
    assert "is more than" in capsys.readouterr().err


def test_a_typo_still_gets_its_suggestion(tmp_path, capsys):
    assert main(["--input", str(tmp_path), "--output", str(tmp_path / "o"), "--jpeg_qualty=9"]) == 2
    assert "did you mean --jpeg_quality?" in capsys.readouterr().err


def test_the_help_shows_a_required_flag_as_required(capsys):
    with pytest.raises(SystemExit) as done:
        arguments.parse_args(["--help"])
    assert done.value.code == 0
    usage = " ".join(capsys.readouterr().out.split("\n\n")[0].split())
    assert " --output OUTPUT " in usage and "[--output" not in usage


def test_the_command_line_patches_no_argparse_internals():
    """argparse's public API only: no private attribute read or set (``_actions``),
    no parser's ``__class__`` swapped."""
    tree = ast.parse((ROOT / "beam_pipeline" / "cli" / "arguments.py").read_text())
    private = [
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_")
    ]
    assert private == []
