"""The import rules: between the three packages, between beam_pipeline's layers, and no cycle.

Every import counts, also one inside a function.

Packages: ``imagerecords`` is the bottom (the format's codec and the Grain /
PyTorch source); ``beam_pipeline`` (the converter) and ``reader`` (tf.data)
each import it and never each other; it imports neither.

beam_pipeline's sub-packages are layers: a module imports only from the layers
below its own (or from its own sub-package).

    cli             the command line (top)
    engines         local_engine.py and pipeline.py: wiring only, the features' included
    features        one folder per optional feature (near, dedupe, reuse): its local and Beam parts
    stages          what both engines call; the hooks a feature plugs into (stages/hooks.py)
    storage         paths, listing, output, lock      beam_internals   Beam's private parts
    core            pure: no Beam, no storage client

So the conversion path (core, storage, stages) names no feature, and a
feature no engine or command line: only engines/ and cli/ wire one in. Of a
feature, only ``beam.py`` imports Beam (the local engine imports the rest).

And no module imports itself again through others: the module import graph
has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "beam_pipeline"
# Which of the project's packages each package may import (besides itself).
MAY_IMPORT = {"imagerecords": (), "beam_pipeline": ("imagerecords",), "reader": ("imagerecords",)}
# What the bottom package must never import, at any depth of a function.
NOT_IN_IMAGERECORDS = ("apache_beam", "tensorflow")
LEVEL = {
    "core": 0,
    "storage": 1,
    "beam_internals": 1,
    "stages": 2,
    "features": 2.5,
    "engines": 3,
    "cli": 4,
}
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
            if own == "features" and parts[-1] != "beam" and name.startswith("apache_beam"):
                bad.append(f"{module} imports {name} (a feature's Beam part is its beam.py)")
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
    packages = {name.split(".")[1] for name, path in _modules() if path.parent != PACKAGE}
    assert packages == set(LEVEL), packages


def test_no_module_imports_a_higher_layer():
    bad = []
    for name, path in _modules():
        imported = imports_of(path.read_text(), name)
        bad += violations(name, imported)
    assert not bad, "\n".join(bad)


def test_reuse_gets_the_fingerprint_through_the_pixel_hook():
    """--reuse fingerprints a stored JPEG with the run's ImageSpec.pixels, the
    near-duplicate feature's hook, never by importing that feature."""
    bad = [
        f"{name} imports {i}"
        for name, path in _modules()
        if name.startswith("beam_pipeline.features.reuse")
        for i in imports_of(path.read_text(), name)
        if i.startswith("beam_pipeline.features.near")
    ]
    assert not bad, "\n".join(bad)


def package_violations(module: str, imported: list[str]) -> list[str]:
    """The imports of ``module`` that break the rule between the packages."""
    own = module.split(".")[0]
    bad = []
    for name in imported:
        target = name.split(".")[0]
        if own == "imagerecords" and name.startswith(NOT_IN_IMAGERECORDS):
            bad.append(f"{module} imports {name} (imagerecords imports no TensorFlow or Beam)")
        elif target in MAY_IMPORT and target != own and target not in MAY_IMPORT[own]:
            bad.append(f"{module} ({own}) imports {name} ({target})")
    return sorted(set(bad))


def _all_modules() -> dict[str, Path]:
    """Every module of the three packages by dotted name (a package by its own name)."""
    found = {}
    for package in MAY_IMPORT:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules among ``sources`` it imports (``sources``: name -> its source;
    a package's name is its ``__init__``'s).

    ``from a import b`` counts as an import of ``a.b`` when that is a module, else of
    ``a``; importing ``a.b.c`` runs ``a`` and ``a.b`` too. A module's own packages
    are left out: they always run before it, whatever it imports.
    """
    graph = {}
    for module, source in sources.items():
        is_package = any(other.startswith(module + ".") for other in sources)
        resolved_as = module + ".__init__" if is_package else module
        targets = set()
        for name in imports_of(source, resolved_as):
            parts = name.split(".")
            for n in range(len(parts), 0, -1):
                if ".".join(parts[:n]) in sources:
                    break
            else:
                continue
            # The target and the packages above it that the import runs.
            for k in range(1, n + 1):
                target = ".".join(parts[:k])
                if target in sources and not (module + ".").startswith(target + "."):
                    targets.add(target)
        targets.discard(module)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return sorted(found)


def test_the_packages_import_each_other_one_way():
    bad = []
    for name, path in _all_modules().items():
        module = name + ".__init__" if path.name == "__init__.py" else name
        bad += package_violations(name, imports_of(path.read_text(), module))
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    sources = {name: path.read_text() for name, path in _all_modules().items()}
    found = cycles(import_graph(sources))
    assert not found, "modules that import each other:\n" + "\n".join(map(" <-> ".join, found))


@pytest.mark.parametrize(
    "module, source, broken",
    [
        ("imagerecords.index", "from imagerecords import codec", False),
        ("imagerecords.index", "from beam_pipeline.core.records import FRAME_OVERHEAD", True),
        ("imagerecords.info", "def f():\n    from beam_pipeline.core import metadata", True),
        ("imagerecords.source", "import reader", True),
        ("imagerecords.source", "import tensorflow as tf", True),
        ("imagerecords.grain", "def f():\n    import apache_beam", True),
        ("imagerecords.torch", "import torch", False),
        ("reader.verify", "from imagerecords import codec", False),
        ("reader.verify", "from beam_pipeline.core import metadata", True),
        ("reader.info", "import beam_pipeline", True),
        ("beam_pipeline.features.reuse.stage", "from imagerecords import storage", False),
        ("beam_pipeline.cli.job", "def f():\n    from reader import info", True),
        ("beam_pipeline.cli.job", "import tensorflow", False),  # not this rule: see test_keys.py
    ],
)
def test_the_package_rule_itself(module, source, broken):
    assert bool(package_violations(module, imports_of(source, module))) is broken


@pytest.mark.parametrize(
    "sources, expected",
    [
        # a.x -> a.y -> a.x: a cycle, also through an import inside a function.
        (
            {"a": "", "a.x": "from a import y", "a.y": "def f():\n    from a import x"},
            [["a.x", "a.y"]],
        ),
        # One way only: no cycle.
        ({"a": "", "a.x": "from a import y", "a.y": "import os"}, []),
        # A package importing its module, the module importing a sibling by the package:
        # the module's own package runs before it anyway, so no cycle.
        ({"a": "from a.x import f", "a.x": "from a import y", "a.y": ""}, []),
        # Another package's module runs that package's __init__, which imports back.
        (
            {"a": "from a import x", "a.x": "", "b": "", "b.y": "import a.x", "a.z": ""},
            [],
        ),
        (
            {
                "a": "from a import x",
                "a.x": "import b.y",
                "b": "",
                "b.y": "from a import z",
                "a.z": "",
            },
            [["a", "a.x", "b.y"]],
        ),
        # A relative import resolves against the importing module's package.
        ({"a": "", "a.x": "from . import y", "a.y": "from .x import f"}, [["a.x", "a.y"]]),
        # Three modules in a ring, and an unrelated module beside them.
        (
            {"p": "", "p.a": "import p.b", "p.b": "import p.c", "p.c": "import p.a", "p.d": ""},
            [["p.a", "p.b", "p.c"]],
        ),
    ],
)
def test_the_cycle_finder_itself(sources, expected):
    assert cycles(import_graph(sources)) == expected


@pytest.mark.parametrize(
    "module, source, broken",
    [
        ("beam_pipeline.core.keys", "from beam_pipeline.storage import paths", True),
        ("beam_pipeline.core.keys", "def f():\n    from beam_pipeline.cli import job", True),
        ("beam_pipeline.core.keys", "import apache_beam as beam", True),
        ("beam_pipeline.core.keys", "from beam_pipeline.core import errors", False),
        ("beam_pipeline.core.keys", "from . import errors", False),
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
        # The conversion path names no feature; a feature names no engine or command line.
        ("beam_pipeline.stages.convert", "from beam_pipeline.features.reuse import feature", True),
        (
            "beam_pipeline.stages.finalize",
            "from beam_pipeline.features.near.stage import Found",
            True,
        ),
        (
            "beam_pipeline.storage.output",
            "from beam_pipeline.features.dedupe import duplicates",
            True,
        ),
        ("beam_pipeline.core.flags", "def f():\n    import beam_pipeline.features.dedupe", True),
        ("beam_pipeline.features.near.stage", "from beam_pipeline.engines import pipeline", True),
        ("beam_pipeline.features.reuse.beam", "from beam_pipeline.cli import job", True),
        (
            "beam_pipeline.features.near.stage",
            "from beam_pipeline.features.dedupe import stage",
            False,
        ),
        ("beam_pipeline.features.dedupe.feature", "from beam_pipeline.stages import hooks", False),
        (
            "beam_pipeline.engines.local_engine",
            "from beam_pipeline.features.near import feature",
            False,
        ),
        ("beam_pipeline.cli.dryrun", "from beam_pipeline.features.near import stage", False),
        # Of a feature, only beam.py imports Beam.
        ("beam_pipeline.features.near.beam", "import apache_beam as beam", False),
        ("beam_pipeline.features.near.feature", "import apache_beam as beam", True),
    ],
)
def test_the_rule_itself(module, source, broken):
    assert bool(violations(module, imports_of(source, module))) is broken
