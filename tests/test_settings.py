"""One source for the settings: every config field declares whether it decides the records.

The resume key, imagerecords.json's settings, the dry run's and the
summary's description of them are derived from the declarations on
ImageSpec and JobConfig (beam_pipeline/core/settings.py); these tests fail when a
field is added without a declaration, or when a reader of the settings
misses one.
"""

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.cli import arguments
from beam_pipeline.core import flags, images, metadata, settings, spill
from beam_pipeline.features.near import search as near_search
from beam_pipeline.features.near.feature import PIXELS
from beam_pipeline.stages import resume
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.storage import discovery
from tests import contract
from tests.image_factory import make_class_folders

FORMAT_MD = (Path(__file__).resolve().parent.parent / "docs" / "format.md").read_text()
CONFIGS = (images.ImageSpec, JobConfig)


_declared = settings.declared


@pytest.mark.parametrize("config_type", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_says_whether_it_decides_the_records(config_type):
    for field in dataclasses.fields(config_type):
        declared = settings.declaration(field)
        assert declared, (
            f"{config_type.__name__}.{field.name} does not say whether it decides a record's "
            "bytes, split or label: declare it with settings.decides / does_not_decide / "
            "nested (beam_pipeline/core/settings.py)"
        )
        for setting in declared:
            if setting.nested:
                assert dataclasses.is_dataclass(setting.nested)
            elif not setting.decides:
                assert setting.why, f"{field.name}: say why a resumed run may change it"
            else:
                assert setting.name, f"{field.name}: a setting in the resume key needs a name"


def test_names_and_info_places_are_unique():
    names = [s.name for _, s in _declared(JobConfig) if s.name]
    places = [s.info for _, s in _declared(JobConfig) if s.info]
    assert len(names) == len(set(names)) and len(places) == len(set(places))


def test_each_image_setting_is_the_flag_of_its_name():
    argv = ["--input", "in", "--output", "out", "--resize", "crop", "--image_size", "99"]
    argv += ["--upscale", "--jpeg_quality", "77", "--resample", "lanczos"]
    argv += ["--image_timeout_s", "5"]
    assert arguments.parse_args(argv).config.image == images.ImageSpec(
        resize="crop",
        size=99,
        upscale=True,
        jpeg_quality=77,
        resample="lanczos",
        timeout_s=5,
        pixels=PIXELS,
    )


def _config(tmp_path, **image) -> JobConfig:
    make_class_folders(str(tmp_path / "in"), classes=("a", "b"), per_class=1, nested=False)
    layout = discovery.discover(str(tmp_path / "in"))
    return JobConfig(
        layout=layout,
        output=str(tmp_path / "out"),
        splits={"train": 1.0},
        image=images.ImageSpec(pixels=PIXELS, **image),
    )


def _another_value(flag: flags.Flag):
    """A valid value of ``flag`` other than its default, as its field holds it."""
    if flag.kind == "bool":
        return not flag.default
    if flag.check and flag.check.choices:
        return next(c for c in flag.check.choices if c != flag.default)
    other = next(v for v in (flag.default + 1, flag.default - 1) if not flag.problem(v))
    return flag.field_value(other)


def _other_image_value(field: dataclasses.Field):
    """Another valid value of an ImageSpec field: from its flag, or for the one
    without a flag (the near-duplicate scheme, fixed by the code) another scheme."""
    if field.name == "pixels":
        return PIXELS._replace(scheme="another-scheme-v9")
    return _another_value(settings.flag_of(field))


# Another valid value of each ImageSpec field that decides the bytes.
OTHER_VALUE = {
    f.name: _other_image_value(f)
    for f in dataclasses.fields(images.ImageSpec)
    if all(s.decides for s in settings.declaration(f))
}


def test_every_setting_that_decides_the_bytes_is_in_the_resume_key_and_dataset_info(tmp_path):
    config = _config(tmp_path)
    deciding = [f.name for f, s in _declared(images.ImageSpec) if s.decides]
    assert sorted(deciding) == sorted(OTHER_VALUE) and "resample" in OTHER_VALUE
    key = resume.key(config)
    info = settings.info_values(config)
    for name, other in OTHER_VALUE.items():
        changed = dataclasses.replace(
            config, image=dataclasses.replace(config.image, **{name: other})
        )
        assert resume.key(changed) != key, f"{name} is not in the resume key"
        assert resume.conflict(key, resume.key(changed)), name
        assert settings.info_values(changed)["image"] != info["image"], f"{name} not recorded"
    assert key["resample"] == "bicubic" and info["image"]["resample"] == "bicubic"
    # What acts on the records once they are made is no reason to convert them again.
    for name, other in [("target_shard_bytes", 1), ("min_shards", 3), ("dedupe", True)]:
        changed = dataclasses.replace(config, **{name: other})
        assert not resume.conflict(key, resume.key(changed)), name


def _documented_info() -> dict:
    """The example imagerecords.json of docs/format.md section 7."""
    section = re.search(r"^## 7\. .*?(?=^## 8\. )", FORMAT_MD, re.M | re.S).group(0)
    return json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))


def test_a_default_run_records_the_image_block_the_format_documents(tmp_path):
    """The format's example is the contract: a setting added to how images are
    stored appears there (docs/format.md), with its default, or this fails."""
    image = dict(_documented_info()["image"])
    for key, value in metadata.IMAGE_FACTS.items():
        assert image.pop(key) == value
    assert settings.info_values(_config(tmp_path))["image"] == image
    assert image["near_scheme"] == near_search.SCHEME


def test_the_documented_near_block_names_the_search_this_code_runs():
    documented = _documented_info()["near_duplicates"]
    assert documented["scheme"] == near_search.SCHEME
    assert {k: documented[k] for k in near_search.SCHEME_VALUES} == near_search.SCHEME_VALUES
    assert documented["bucket_limit"] == near_search.MAX_BUCKET


def test_the_declared_settings_record_what_was_asked(tmp_path):
    config = _config(tmp_path, resample="lanczos", size=64, upscale=True)
    info = settings.info_values(config)
    # "groups" becomes imagerecords.json's groups block only when there are groups.
    assert set(info) == {"source", "classes", "seed", "config", "image", "groups"}
    assert info["groups"] == {"group_by": None}
    assert info["source"] == config.layout.root and info["seed"] == 42
    assert info["classes"] == ["a", "b"]
    default = settings.info_values(_config(tmp_path / "default"))["image"]
    assert info["image"] == {**default, "size": 64, "upscale": True, "resample": "lanczos"}
    assert info["config"] == {
        "layout": "classes",
        "splits": {"train": 1.0},
        "target_shard_mb": 200.0,
        "min_shards": 1,
        "max_reject_fraction": 0.01,
        "dedupe": False,
        "tfds_name": "imagerecords",
        "tfds_version": "1.0.0",
    }


def test_every_recorded_setting_is_documented_in_the_format():
    section = re.search(r"^## 7\. .*?(?=^## 8\. )", FORMAT_MD, re.M | re.S).group(0)
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", section, re.M)}
    for _, setting in _declared(JobConfig):
        if setting.info:
            block, _, key = setting.info.rpartition(".")
            if block:
                assert f"`{key}`" in rows[block], f"{setting.info} missing from docs/format.md"
            else:
                assert key in rows, f"{setting.info} missing from docs/format.md"
    for key in metadata.IMAGE_FACTS:
        assert f"`{key}`" in rows["image"]


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ({"seed": 1, "image_size": 256}, {"seed": 1, "image_size": 256}, ""),
        ({"seed": 1, "image_size": 256}, {"seed": 1, "image_size": 128}, "image_size 256 -> 128"),
        ({"resample": "lanczos"}, {"resample": "bicubic"}, "resample lanczos -> bicubic"),
        ({"upscale": False}, {"upscale": True}, "upscale off -> on"),
        (
            {"seed": 1, "splits": {"a": 1.0}},
            {"seed": 7, "splits": {"a": 0.5, "b": 0.5}},
            "seed 1 -> 7, splits changed",
        ),
        # A time limit may be raised (what timed out is retried), not lowered.
        ({"image_timeout_s": 1.0}, {"image_timeout_s": 60.0}, ""),
        ({"image_timeout_s": 60.0}, {"image_timeout_s": 0.0}, ""),  # 0: no limit
        (
            {"image_timeout_s": 60.0},
            {"image_timeout_s": 1.5},
            "image_timeout_s lowered from 60 to 1.5",
        ),
        (
            {"image_timeout_s": 0.0},
            {"image_timeout_s": 60.0},
            "image_timeout_s lowered from 0 to 60",
        ),
    ],
)
def test_what_stops_a_resume(old, new, expected):
    old, new = {"spill_format": spill.FORMAT, **old}, {"spill_format": spill.FORMAT, **new}
    assert resume.conflict(old, new) == expected


def test_a_run_of_another_spill_format_is_not_resumed():
    old = {"spill_format": spill.FORMAT - 1, "seed": 1}
    change = resume.conflict(old, {"spill_format": spill.FORMAT, "seed": 1})
    assert change == (
        f"spill_format {spill.FORMAT - 1} -> {spill.FORMAT}: "
        "written by another version of imagerecords"
    )


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings") / "images"
    make_class_folders(str(root), classes=("a", "b"), per_class=4, nested=False)
    return root


def test_the_dry_run_names_every_setting_that_decides_the_bytes(small, tmp_path, capsys):
    argv = ["--input", str(small), "--output", str(tmp_path / "o"), "--dry_run"]
    assert main([*argv, "--image_size", "40", "--resample", "lanczos"]) == 0
    out = capsys.readouterr().out
    line = re.search(r"images converted in memory \((.*)\)", out).group(1)
    shown = dict(part.split(" ", 1) for part in line.split(", "))
    deciding = [s.name for f, s in _declared(images.ImageSpec) if s.decides]
    assert list(shown) == deciding
    asked = images.ImageSpec(size=40, resample="lanczos", pixels=PIXELS)
    assert shown == {k: settings.show(v) for k, v in settings.image_settings(asked).items()}
    assert shown["image_size"] == "40" and shown["resample"] == "lanczos"


@pytest.mark.e2e
def test_both_engines_record_and_summarise_the_same_settings(small, tmp_path, capsys):
    """The local engine and Beam's DirectRunner derive the same dataset_info settings."""
    outputs = {}
    for engine, extra in [("local", []), ("beam", ["--runner", "DirectRunner"])]:
        out = tmp_path / engine
        argv = ["--input", str(small), "--output", str(out), "--quiet", *extra]
        assert main([*argv, "--image_size", "24", "--resample", "lanczos", "--upscale"]) == 0
        summary = capsys.readouterr().out
        asked = images.ImageSpec(size=24, resample="lanczos", upscale=True, pixels=PIXELS)
        stored = settings.describe(settings.image_settings(asked))
        assert f"images stored with {stored}" in summary
        assert "image_size 24, upscale on" in stored and "resample lanczos" in stored
        outputs[engine] = contract.all_files(str(out))
    assert outputs["local"] == outputs["beam"]
    info = contract.load_info(str(tmp_path / "local"))
    assert info["image"]["resample"] == "lanczos" and info["image"]["size"] == 24


# The modules that declare the settings, the flags, and route the values between them.
DECLARING = (
    "beam_pipeline/core/flags.py",
    "beam_pipeline/core/settings.py",
    "beam_pipeline/core/images.py",
    "beam_pipeline/stages/job_config.py",
    "beam_pipeline/cli/arguments.py",
)


def _setting_names() -> set[str]:
    """Every name a setting goes by: its flag's, its field's, its resume name, its key."""
    names = {flag.name for flag in flags.FLAGS}
    for field, setting in _declared(JobConfig):
        names |= {field.name, setting.name}
        if setting.info:
            names.add(setting.info.rpartition(".")[2])
    return names


def test_no_setting_is_named_by_a_hand_written_string_twice():
    """A flag is an attribute (flags.Table.image_size), a field names its Flag object,
    and the other names derive from those: a string that names a setting is written
    at most once (a part of the layout: "input", recorded as "source")."""
    names = _setting_names()
    written = []
    for path in DECLARING:
        tree = ast.parse((Path(__file__).resolve().parent.parent / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names:
                written.append(f"{node.value!r} ({path}:{node.lineno})")
    repeated = [
        w for w in written if [x.split(" (")[0] for x in written].count(w.split(" (")[0]) > 1
    ]
    assert repeated == [], "a setting named by hand twice: " + ", ".join(repeated)


def test_each_field_that_a_flag_fills_names_the_flag_object_of_the_table():
    filled = [
        settings.flag_of(field)
        for config_type in CONFIGS
        for field in dataclasses.fields(config_type)
        if settings.flag_of(field)
    ]
    assert all(any(flag is declared for declared in flags.FLAGS) for flag in filled)
    assert len({id(flag) for flag in filled}) == len(filled), "a flag fills two fields"


@pytest.mark.parametrize(
    "field, name, info",
    [
        ("size", "image_size", "image.size"),  # the flag's name; the field's in the file
        ("resample", "resample", "image.resample"),
        ("pixels", images.SCHEME_SETTING, "image.near_scheme"),  # no flag: the hook's
        ("timeout_s", "image_timeout_s", None),
        ("seed", "seed", "seed"),
        ("group_by", "group_by", "groups.group_by"),
        # The field holds bytes; the flag's value (MB) is recorded, under its name.
        ("target_shard_bytes", "target_shard_mb", "config.target_shard_mb"),
        ("conversion_processes", "local_processes", None),
        ("dedupe", "dedupe", "config.dedupe"),
    ],
)
def test_a_setting_s_name_and_place_derive_from_its_declaration(field, name, info):
    found = {(f.name, s.name): s for f, s in _declared(JobConfig)}
    assert found[(field, name)].info == info


def test_the_layout_parts_keep_their_recorded_places():
    parts = [(s.name, s.info) for f, s in _declared(JobConfig) if f.name == "layout"]
    assert parts == [("input", "source"), ("layout", "config.layout"), ("classes", "classes")]


def test_a_converted_field_is_read_as_its_flag_s_value(tmp_path):
    config = dataclasses.replace(_config(tmp_path), target_shard_bytes=3 * 2**20)
    assert settings.info_values(config)["config"]["target_shard_mb"] == 3.0
