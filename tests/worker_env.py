"""A Python environment with exactly what a Dataflow worker installs, for pickle tests.

A worker installs the staged sdist (``workflow.tar.gz``) and its
``install_requires``: Beam, Pillow, protobuf, google-crc32c,
google-cloud-storage and what they pull in. This module builds a folder that
holds only those distributions (symlinks to the installed files, so it costs a
second, not a download) plus the package from the sdist, and runs
``python -I -S`` on it: no site-packages, no user site, no PYTHONPATH, no
current directory. TensorFlow, pytest, Dask and this repository's ``tests``
are then not importable, as on a worker.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def install_requires(sdist: Path) -> list[str]:
    """The sdist's install_requires (the part of requires.txt before any [extra])."""
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".egg-info/requires.txt"))
        text = tar.extractfile(member).read().decode()
    return [line.strip() for line in text.split("\n[", 1)[0].splitlines() if line.strip()]


def closure(requirements: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """Installed distributions needed by ``requirements``, transitively (markers honoured)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    extras_seen: dict[str, set[str]] = {}
    stack = [Requirement(r) for r in requirements]
    while stack:
        req = stack.pop()
        name = canonicalize_name(req.name)
        extras = set(req.extras)
        if name in extras_seen and extras <= extras_seen[name]:
            continue
        extras_seen[name] = extras_seen.get(name, set()) | extras
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional platform dependency that is not installed here
        found[name] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            wanted = sub.marker is None or any(
                sub.marker.evaluate({"extra": extra}) for extra in (extras_seen[name] | {""})
            )
            if wanted:
                stack.append(sub)
    return found


def _link_point(purelib: Path, parts: tuple[str, ...]) -> tuple[str, ...]:
    """The shortest prefix of an installed file's path to link as a whole.

    A regular package (a folder with ``__init__.py``) or a ``.dist-info``
    folder belongs to one distribution; a namespace folder (``google/``,
    ``google/cloud/``) is shared, so its entries are linked one by one.
    """
    for depth in range(1, len(parts)):
        prefix = parts[:depth]
        if prefix[-1].endswith((".dist-info", ".data")) or (
            purelib.joinpath(*prefix, "__init__.py").exists()
        ):
            return prefix
    return parts


def _sdist_packages(tar: tarfile.TarFile) -> list[str]:
    member = next(m for m in tar.getmembers() if m.name.endswith(".egg-info/top_level.txt"))
    return tar.extractfile(member).read().decode().split()


def build_site(sdist: Path, folder: Path) -> Path:
    """Links the worker's distributions into ``folder``, and installs the sdist's packages.

    Only the packages the sdist installs (its ``top_level.txt``), as pip would:
    not the repository's ``tests``, which the sdist also carries.
    """
    purelib = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir(parents=True, exist_ok=True)
    points = set()
    for dist in closure(install_requires(sdist)).values():
        for file in dist.files or []:
            parts = Path(file).parts
            if parts and parts[0] != ".." and purelib.joinpath(*parts).exists():
                points.add(_link_point(purelib, parts))
    for point in sorted(points):
        target = folder.joinpath(*point)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(purelib.joinpath(*point), target)
    with tarfile.open(sdist) as tar:
        packages = _sdist_packages(tar)
        for member in tar.getmembers():
            parts = member.name.split("/")
            if member.isfile() and len(parts) > 2 and parts[1] in packages:
                target = folder.joinpath(*parts[1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    return folder


def run_python(site_dir: Path, code: str, cwd: Path, args=(), timeout: float = 180):
    """Runs ``code`` in ``python -I -S`` with ``site_dir`` as its only site folder."""
    prelude = f"import site; site.addsitedir({str(site_dir)!r})\n"
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
