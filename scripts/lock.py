"""Writes constraints/test.txt: the exact versions of ``imagerecords[test]`` in this venv.

    .venv/bin/python scripts/lock.py        # after `make test-latest` passed, say

``make test`` installs with ``pip install -c constraints/test.txt``, so a commit
tests the same versions on any day. The lock holds what ``imagerecords[test]``
needs, followed through every requirement's requirements as installed here
(``pip freeze`` would also pin whatever else lies in the venv), and never the
project itself.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "imagerecords"
LOCK = Path(__file__).resolve().parents[1] / "constraints" / "test.txt"
HEADER = """\
# The exact versions `make test` and CI install (pip install -c THIS -e ".[test]").
# Written by scripts/lock.py from a venv that passed the suite; setup.py holds
# the ranges users get. `make test-latest` tries the newest versions instead.
"""


def wanted(requirement: Requirement, extras: set[str]) -> bool:
    """Whether ``requirement`` applies here, for a package installed with ``extras``."""
    if requirement.marker is None:
        return True
    environment = default_environment()
    return any(
        requirement.marker.evaluate({**environment, "extra": extra}) for extra in extras or {""}
    )


def closure(project: str, extras: set[str]) -> dict[str, str]:
    """Every installed distribution ``project[extras]`` needs: canonical name -> version."""
    found: dict[str, str] = {}
    todo = [(project, extras)]
    seen = set()
    while todo:
        name, with_extras = todo.pop()
        key = (canonicalize_name(name), frozenset(with_extras))
        if key in seen:
            continue
        seen.add(key)
        distribution = metadata.distribution(name)
        if canonicalize_name(name) != canonicalize_name(project):
            found[canonicalize_name(name)] = distribution.version
        for text in distribution.requires or []:
            requirement = Requirement(text)
            if wanted(requirement, with_extras):
                todo.append((requirement.name, set(requirement.extras)))
    return found


def lock_text(pins: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def main() -> None:
    pins = closure(PROJECT, {"test"})
    bad = [
        name for name, version in pins.items() if not re.fullmatch(r"[0-9][0-9A-Za-z.!+]*", version)
    ]
    if bad:
        sys.exit(f"error: not a released version: {', '.join(bad)}")
    LOCK.parent.mkdir(exist_ok=True)
    LOCK.write_text(lock_text(pins))
    print(f"{LOCK}: {len(pins)} pins")


if __name__ == "__main__":
    main()
