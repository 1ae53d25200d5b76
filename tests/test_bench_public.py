"""bench/ is a client of the product's public names only.

A bench module imports from ``beam_pipeline``, ``reader`` and ``imagerecords``
only modules their package lists in ``PUBLIC_MODULES`` (its ``__init__.py``)
and no name with a leading underscore, either in the import or as an attribute
of what it imported; nor a private name of another bench module. A benchmark
that reaches inside the product measures what a user cannot call, and breaks
whenever that inside moves.

Every import counts, also one inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("beam_pipeline", "reader", "imagerecords")


def declared_public(init_source: str) -> tuple[str, ...]:
    """The ``PUBLIC_MODULES`` tuple a package's ``__init__.py`` assigns (read, not imported:
    importing ``reader`` would set TensorFlow's allocator for the whole test run)."""
    for node in ast.parse(init_source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PUBLIC_MODULES" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    return ()


def is_public(module: str, public: tuple[str, ...]) -> bool:
    """Whether ``module`` is listed, or lies in a package listed as ``package.*``."""
    return any(
        module == p or (p.endswith(".*") and (module + ".").startswith(p[:-1])) for p in public
    )


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and part != "__main__" for part in dotted.split("."))


def uses(source: str, modules: set[str]) -> list[tuple[str, str]]:
    """(module, name) of everything ``source`` takes from the three packages and from bench.

    ``modules``: every module of those packages by dotted name, so that
    ``from beam_pipeline.core import images`` counts as the module
    ``beam_pipeline.core.images`` and ``from imagerecords import RecordSource``
    as the name ``RecordSource`` of ``imagerecords``. A name is "" for a plain
    ``import``; an attribute read off an imported module or name counts as a name
    of it.
    """
    found, bound = [], {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in (*PRODUCT, "bench"):
                    found.append((alias.name, ""))
                    bound[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] not in (*PRODUCT, "bench"):
                continue
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                found.append((dotted, "") if dotted in modules else (node.module, alias.name))
                bound[alias.asname or alias.name] = dotted
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = bound.get(node.value.id)
            if target is not None and node.attr.startswith("_") and not node.attr.endswith("__"):
                module = target if target in modules else target.rsplit(".", 1)[0]
                found.append((module, node.attr))
    return found


def problems(
    module: str, used: list[tuple[str, str]], public: dict[str, tuple[str, ...]]
) -> list[str]:
    """What ``module`` (a bench module) takes that is not the product's public names,
    or is another bench module's private name. ``public``: package -> its PUBLIC_MODULES."""
    bad = []
    for target, name in used:
        package = target.split(".")[0]
        if package == "bench":
            if target != module and (_private(target) or name.startswith("_")):
                bad.append(f"{module} takes the private {target}{'.' + name if name else ''}")
            continue
        dotted = f"{target}.{name}" if name else target
        if _private(dotted):
            bad.append(f"{module} takes the private {dotted}")
        elif not is_public(target, public[package]):
            bad.append(f"{module} takes {dotted}: {target} is not in {package}'s PUBLIC_MODULES")
    return sorted(set(bad))


MODULES = {"beam_pipeline.engines.pipeline", "beam_pipeline.core.images", "bench.convert.imageops"}
PUBLIC = {"beam_pipeline": ("beam_pipeline.core.*",), "reader": ("reader",), "imagerecords": ()}


@pytest.mark.parametrize(
    "source, bad",
    [
        (
            "from beam_pipeline.engines.pipeline import _WriteShardFn\n",
            [
                "bench.x takes the private beam_pipeline.engines.pipeline._WriteShardFn",
            ],
        ),
        (
            "def f():\n    from beam_pipeline.engines.pipeline import WriteShards\n",
            [
                "bench.x takes beam_pipeline.engines.pipeline.WriteShards: "
                "beam_pipeline.engines.pipeline is not in beam_pipeline's PUBLIC_MODULES"
            ],
        ),
        ("from beam_pipeline.core import images\nimages.convert(b'')\n", []),
        (
            "from beam_pipeline.core import images\nimages._decode(b'')\n",
            ["bench.x takes the private beam_pipeline.core.images._decode"],
        ),
        (
            "import reader\nreader._EXPORTS\nreader.make_dataset\n",
            ["bench.x takes the private reader._EXPORTS"],
        ),
        (
            "import reader.allocator\n",
            ["bench.x takes reader.allocator: reader.allocator is not in reader's PUBLIC_MODULES"],
        ),  # fmt: skip
        (
            "from bench.convert.imageops import _ORIENT, convert_to_jpeg\n",
            ["bench.x takes the private bench.convert.imageops._ORIENT"],
        ),
        ("from bench.convert import imageops\nimageops.__name__\n", []),
    ],
)
def test_problems_name_each_private_or_inside_name(source, bad):
    assert problems("bench.x", uses(source, MODULES), PUBLIC) == bad


def test_declared_public_reads_the_tuple_and_is_empty_without_one():
    assert declared_public('"""Doc."""\nPUBLIC_MODULES = ("a", "a.b")\n') == ("a", "a.b")
    assert declared_public("X = 1\n") == ()


def _module_names() -> set[str]:
    names = set()
    for package in (*PRODUCT, "bench"):
        for path in (ROOT / package).rglob("*.py"):
            if ".cache" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_bench_uses_only_the_products_public_names():
    public = {p: declared_public((ROOT / p / "__init__.py").read_text()) for p in PRODUCT}
    assert all(public.values()), public
    modules = _module_names()
    bad = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        if ".cache" in path.parts:  # worktrees of other commits (bench/tools/interleave.py)
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        bad += problems(module, uses(path.read_text(), modules), public)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "module, public",
    [
        ("beam_pipeline.core.keys", True),
        ("beam_pipeline.core", True),
        ("beam_pipeline.corex", False),
        ("beam_pipeline.cli.summary", True),
        ("beam_pipeline.cli", False),
        ("beam_pipeline.cli.job", False),
    ],
)
def test_a_listed_package_star_covers_its_modules_and_a_listed_module_only_itself(module, public):
    listed = ("beam_pipeline.core.*", "beam_pipeline.cli.summary")
    assert is_public(module, listed) is public


def test_every_listed_public_module_exists():
    modules = _module_names()
    for package in PRODUCT:
        for listed in declared_public((ROOT / package / "__init__.py").read_text()):
            assert listed.removesuffix(".*") in modules, (
                f"{package}'s PUBLIC_MODULES lists {listed}: no such module"
            )
