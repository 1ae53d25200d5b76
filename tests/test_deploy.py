"""deploy/: versions agree, the template's parameters are real flags, the entry point runs."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from beam_pipeline.__main__ import parse_args
from tests import contract
from tests.image_factory import make_class_folders

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _setup_pin(package: str) -> str:
    text = (ROOT / "setup.py").read_text()
    return re.search(rf'"{re.escape(package)}(?:\[[^\]]*\])?==([^"]+)"', text).group(1)


def test_container_beam_version_matches_setup_py():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG BEAM_VERSION=(\S+)$", dockerfile, re.M).group(1) == _setup_pin(
        "apache-beam"
    )
    assert "apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION}" in dockerfile
    assert "pip install tensorflow" not in dockerfile.lower()


def test_constraints_are_installed_versions():
    """The pins the image installs are the versions this suite ran with."""
    from importlib.metadata import version

    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, pinned = line.split("==")
            assert version(name) == pinned, f"{name}: installed {version(name)}, pinned {pinned}"


def test_template_parameters_are_cli_flags_with_working_regexes():
    metadata = json.loads((DEPLOY / "metadata.json").read_text())
    samples = {
        "input": "gs://b/images",
        "output": "gs://b/records",
        "manifest": "gs://b/list.csv",
        "splits": "train=0.9,val=0.1",
        "seed": "7",
        "image_size": "224",
        "resize": "crop",
        "upscale": "true",
        "jpeg_quality": "95",
        "target_shard_mb": "150.5",
        "min_shards": "8",
        "max_reject_fraction": "0.05",
        "overwrite": "false",
        "index_files": "true",
    }
    names = [p["name"] for p in metadata["parameters"]]
    assert sorted(names) == sorted(samples)
    for parameter in metadata["parameters"]:
        for regex in parameter.get("regexes", []):
            assert re.match(regex, samples[parameter["name"]]), parameter["name"]
    # What the launcher passes: --name=value for every parameter.
    args, beam_args = parse_args([f"--{n}={v}" for n, v in samples.items()] + ["--wait=false"])
    assert beam_args == []
    assert args.image_size == 224 and args.resize == "crop" and args.upscale is True
    assert args.overwrite is False and args.wait is False and args.min_shards == 8
    assert args.index_files is True


@pytest.mark.parametrize("script", sorted(p.name for p in DEPLOY.glob("*.sh")))
def test_scripts_parse_and_demand_their_settings(script):
    path = DEPLOY / script
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("PROJECT", "REGION", "BUCKET")}
    result = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env)
    assert result.returncode != 0 and "set PROJECT" in result.stderr


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
