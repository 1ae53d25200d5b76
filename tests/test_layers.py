"""beam_pipeline's sub-packages are layers: a module imports only from the layers below
its own (or from its own sub-package). Every import counts, also one inside a function.

    cli             the command line (top)
    engines         local_engine.py and pipeline.py: wiring only
    stages          what both engines call
    storage         paths, listing, output, lock      beam_internals   Beam's private parts
    core            pure: no Beam, no storage client
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "beam_pipeline"
LEVEL = {"core": 0, "storage": 1, "beam_internals": 1, "stages": 2, "engines": 3, "cli": 4}
# Modules the core must never import, at any depth of a function.
NOT_IN_CORE = ("apache_beam", "google.cloud", "tensorflow", "dask")


def imports_of(source: str, module: str) -> list[str]:
    """Every module name ``source`` imports, absolute (``module`` is its dotted name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")[: -node.level]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from beam_pipeline.stages import convert` imports beam_pipeline.stages.convert.
            found += [f"{origin}.{alias.name}" for alias in node.names] + [origin]
    return found


def violations(module: str, imported: list[str]) -> list[str]:
    """The imports of ``module`` that break the layering (empty when it keeps it)."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] not in LEVEL:
        return []  # beam_pipeline/__init__.py and __main__.py sit above every layer
    own = parts[1]
    bad = []
    for name in imported:
        target = name.split(".")
        if target[0] != "beam_pipeline":
            if own == "core" and name.startswith(NOT_IN_CORE):
                bad.append(f"{module} imports {name} (the core imports no Beam or cloud client)")
            continue
        if len(target) < 2 or target[1] not in LEVEL or target[1] == own:
            continue
        if LEVEL[target[1]] >= LEVEL[own]:
            bad.append(f"{module} ({own}) imports {name} ({target[1]})")
    return sorted(set(bad))


def _modules() -> list[tuple[str, Path]]:
    return [
        (".".join(path.relative_to(ROOT).with_suffix("").parts), path)
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def test_every_module_sits_in_a_layer():
    loose = [
        str(path.relative_to(ROOT))
        for name, path in _modules()
        if name.count(".") == 1 and path.name not in ("__init__.py", "__main__.py")
    ]
    assert not loose, f"modules outside the layer sub-packages: {loose}"
    packages = {path.parent.name for _, path in _modules() if path.parent != PACKAGE}
    assert packages == set(LEVEL), packages


def test_no_module_imports_a_higher_layer():
    bad = []
    for name, path in _modules():
        bad += violations(name, imports_of(path.read_text(), name))
    assert not bad, "\n".join(bad)


def test_the_other_packages_use_only_the_core():
    """imagerecords (the Grain/PyTorch source) may share the core's pure facts (file
    names, feature keys); the reader imports nothing of the converter at all."""
    bad = []
    for package, allowed in (("imagerecords", ("beam_pipeline.core",)), ("reader", ())):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for imported in imports_of(path.read_text(), name):
                if imported.startswith("beam_pipeline") and not imported.startswith(allowed):
                    if imported != "beam_pipeline" or not allowed:
                        bad.append(f"{name} imports {imported}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "module, source, broken",
    [
        ("beam_pipeline.core.keys", "from beam_pipeline.storage import paths", True),
        ("beam_pipeline.core.keys", "def f():\n    from beam_pipeline.cli import job", True),
        ("beam_pipeline.core.keys", "import apache_beam as beam", True),
        ("beam_pipeline.core.keys", "from beam_pipeline.core import records", False),
        ("beam_pipeline.core.keys", "from . import records", False),
        (
            "beam_pipeline.storage.gcs",
            "from beam_pipeline.beam_internals import beam_private",
            True,
        ),
        ("beam_pipeline.stages.resume", "from beam_pipeline.cli.job import config_from_args", True),
        ("beam_pipeline.stages.resume", "from ..storage import output", False),
        ("beam_pipeline.stages.resume", "from ..engines import pooled", True),
        ("beam_pipeline.engines.pipeline", "import apache_beam", False),
        ("beam_pipeline.cli.job", "from beam_pipeline.engines import local_engine", False),
        ("beam_pipeline.__main__", "from beam_pipeline.cli import job", False),
    ],
)
def test_the_rule_itself(module, source, broken):
    assert bool(violations(module, imports_of(source, module))) is broken
