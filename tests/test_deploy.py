"""deploy/: versions agree, the template's parameters are real flags, the entry point runs."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from beam_pipeline.__main__ import parse_args
from beam_pipeline.beam_internals import beam_private
from beam_pipeline.core import flags
from tests import contract
from tests.image_factory import make_class_folders

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def test_container_beam_version_is_the_one_beam_internals_was_read_against():
    """The image's Beam SDK is beam_private.BEAM_VERSION (which the test lock pins too)."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert (
        re.search(r"^ARG BEAM_VERSION=(\S+)$", dockerfile, re.M).group(1)
        == beam_private.BEAM_VERSION
    )
    assert "apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION}" in dockerfile
    assert "pip install tensorflow" not in dockerfile.lower()


def test_container_copies_every_package_setup_py_installs():
    """The workers run the container's install: a package setup.py lists but the
    Dockerfile does not copy is silently left out (the converter frames its
    records with imagerecords' codec)."""
    setup = (ROOT / "setup.py").read_text()
    include = re.search(r"find_packages\(\s*include=\[([^\]]*)\]", setup).group(1)
    packages = {name.split(".")[0] for name in re.findall(r'"([\w.*]+)"', include)}
    copied = set(re.findall(r"^COPY (\w+) \./\1$", (DEPLOY / "Dockerfile").read_text(), re.M))
    assert packages == {"beam_pipeline", "reader", "imagerecords"}
    assert packages <= copied, f"deploy/Dockerfile does not copy {sorted(packages - copied)}"


def _install_requires() -> list[Requirement]:
    """setup.py's INSTALL_REQUIRES, read from its source (nothing installed is consulted)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["INSTALL_REQUIRES"]:
            return [Requirement(r) for r in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no INSTALL_REQUIRES list")


def _constraint_problems(constraints: str, requires: list[Requirement]) -> list[str]:
    """What is wrong with a constraints file given the package's requirements.

    Every pin must be ``name==version`` for a package the workers require, the
    version must satisfy setup.py's specifier.
    """
    wanted = {canonicalize_name(r.name): r for r in requires}
    problems = []
    for line in constraints.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        pin = Requirement(line)
        name = canonicalize_name(pin.name)
        pinned = [s.version for s in pin.specifier if s.operator == "=="]
        if len(pinned) != 1 or len(pin.specifier) != 1:
            problems.append(f"{line}: not a single == pin")
            continue
        if name not in wanted:
            problems.append(f"{line}: not in setup.py's install_requires")
        elif not wanted[name].specifier.contains(pinned[0], prereleases=True):
            problems.append(f"{line}: outside setup.py's {wanted[name]}")
    return problems


@pytest.mark.parametrize(
    "constraints, problem",
    [
        ("pillow==12.3.0\n# comment\n\ngoogle-crc32c==1.9.0", None),
        ("Pillow==9.5.0", "outside setup.py's pillow>=10.0"),
        ("apache-beam==2.59.0", "outside setup.py's apache-beam[gcp]<3,>=2.60"),
        ("apache-beam==2.77.0", None),
        ("tensorflow==2.16.1", "not in setup.py's install_requires"),
        ("pillow>=10", "not a single == pin"),
    ],
)
def test_constraint_checker_table(constraints, problem):
    got = _constraint_problems(constraints, _install_requires())
    assert got == ([] if problem is None else [f"{constraints}: {problem}"])


def test_constraints_resolve_with_setup_py():
    """deploy/constraints.txt pins versions setup.py accepts (the image installs both)."""
    constraints = (DEPLOY / "constraints.txt").read_text()
    assert _constraint_problems(constraints, _install_requires()) == []


# A value for each template parameter that has no default; the others launch
# with their declared default (beam_pipeline/core/flags.py) or a sample below.
NO_DEFAULT = {
    "input": "gs://b/images",
    "output": "gs://b/records",
    "manifest": "gs://b/list.csv",
    "reuse": "gs://b/records-v1",
    "group_by": r"^([^/]+/patient\d+)_",
}
SAMPLES = {"image_size": "224", "resize": "crop", "upscale": "true", "resample": "lanczos"}
SAMPLES |= {"min_shards": "8", "overwrite": "false", "index_files": "true"}


def test_template_parameters_are_cli_flags_with_working_regexes():
    metadata = json.loads((DEPLOY / "metadata.json").read_text())
    declared = {flag.name: flag for flag in flags.FLAGS}
    samples = {}
    for parameter in metadata["parameters"]:
        name = parameter["name"]
        assert name in declared, f"{name} is no flag"
        samples[name] = SAMPLES.get(name) or NO_DEFAULT.get(name) or declared[name].default_text
        for regex in parameter.get("regexes", []):
            assert re.match(regex, samples[name]), name
    # What the launcher passes: --name=value for every parameter.
    command = parse_args([f"--{n}={v}" for n, v in samples.items()] + ["--wait=false"])
    config, options = command.config, command.options
    assert not command.beam  # no Beam flag (a BeamFlags is false without any)
    assert config.image.size == 224 and config.image.resize == "crop" and config.image.upscale
    assert options.overwrite is False and options.wait is False and config.min_shards == 8
    assert config.index_files is True and config.image.resample == "lanczos"
    assert config.reuse == "gs://b/records-v1"
    assert config.group_by == r"^([^/]+/patient\d+)_"


@pytest.mark.e2e
@pytest.mark.parametrize("script", sorted(p.name for p in DEPLOY.glob("*.sh")))
def test_scripts_parse_and_demand_their_settings(script):
    path = DEPLOY / script
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("PROJECT", "REGION", "BUCKET")}
    result = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env)
    assert result.returncode != 0 and "set PROJECT" in result.stderr


@pytest.mark.e2e
def test_flex_entry_point_converts_and_tolerates_launcher_flags(tmp_path):
    root = tmp_path / "in"
    ids = make_class_folders(str(root), classes=("a", "b"), per_class=4, nested=False)
    result = subprocess.run(
        [
            sys.executable,
            str(DEPLOY / "flex_main.py"),
            f"--input={root}",
            f"--output={tmp_path / 'out'}",
            "--direct_running_mode=in_memory",
            "--some_launcher_flag=1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert "some_launcher_flag" in result.stderr  # warned about, not refused
    assert "not waiting" in result.stdout
    by_split = contract.check_output(str(tmp_path / "out"), str(root))
    assert sorted(i for rows in by_split.values() for i in contract.ids(rows)) == sorted(ids)
