"""constraints/test.txt, the versions `make test` and CI install, agrees with setup.py.

Read from the files (nothing installed is consulted): every requirement of
``imagerecords[test]`` is pinned to one version inside setup.py's range, and
the project itself is not (tests/test_beam_private.py checks Beam's pin).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scripts import lock

ROOT = Path(__file__).resolve().parent.parent


def _setup_lists() -> dict[str, list[Requirement]]:
    """setup.py's module-level lists of requirements, by name."""
    lists = {}
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and node.targets[0].id.endswith("_REQUIRES"):
            lists[node.targets[0].id] = [Requirement(r) for r in ast.literal_eval(node.value)]
    return lists


def pins(text: str) -> dict[str, str]:
    """``name==version`` lines (comments and blanks skipped): canonical name -> version."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.!+]*)", line)
        assert match, f"not an exact pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"pinned twice: {name}"
        found[name] = match.group(2)
    return found


@pytest.mark.parametrize(
    "text, problem",
    [
        ("pillow==12.3.0\n# comment\n\ntqdm==4.67.1", None),
        ("pillow>=10", "not an exact pin"),
        ("-e .", "not an exact pin"),
        ("pillow==12.3.0\nPillow==12.3.0", "pinned twice"),
    ],
)
def test_pins_table(text, problem):
    if problem is None:
        assert pins(text) == {"pillow": "12.3.0", "tqdm": "4.67.1"}
    else:
        with pytest.raises(AssertionError, match=problem):
            pins(text)


def test_the_lock_pins_every_test_requirement_inside_setup_pys_range():
    locked = pins(lock.LOCK.read_text())
    lists = _setup_lists()
    needed = lists["INSTALL_REQUIRES"] + lists["TEST_REQUIRES"] + lists["BENCH_REQUIRES"]
    needed += lists["DASK_REQUIRES"] + lists["TRAINERS_REQUIRES"]
    problems = []
    for requirement in needed:
        version = locked.get(canonicalize_name(requirement.name))
        if version is None:
            problems.append(f"{requirement}: not in the lock")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement}: the lock has {version}")
    assert problems == []
    assert lock.PROJECT not in locked  # the project installs from the tree, editable


def test_make_installs_from_the_lock_scripts_lock_writes():
    makefile = (ROOT / "Makefile").read_text()
    path = re.search(r"^LOCK := (\S+)$", makefile, re.M).group(1)
    assert ROOT / path == lock.LOCK
    stamp_rule = re.search(r"^\$\(STAMP\): (.*)$", makefile, re.M).group(1).split()
    assert "$(LOCK)" in stamp_rule  # a moved lock reinstalls
    assert '-m pip install --quiet -c $(LOCK) -e ".[test]"' in makefile
