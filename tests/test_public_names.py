"""No two public classes of the same name in the three packages.

Two classes named alike (say two ``Converted``) make a reader of the code,
and a user catching an exception, pick the wrong one. A name may be
re-exported (``reader.info.UnknownSplitError`` is imagerecords'): only class
statements count.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("beam_pipeline", "reader", "imagerecords")


def public_classes(source: str) -> list[str]:
    """The names of the classes a module defines at its top level, but for ``_private`` ones."""
    return [
        node.name
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    ]


def shared_names(sources: dict[str, str]) -> dict[str, list[str]]:
    """Class name -> the modules (of ``sources``: module -> its source) that define it,
    for every name more than one module defines."""
    where = collections.defaultdict(list)
    for module, source in sorted(sources.items()):
        for name in public_classes(source):
            where[name].append(module)
    return {name: modules for name, modules in where.items() if len(modules) > 1}


def test_shared_names_finds_a_class_defined_twice():
    sources = {
        "a": "class Converted:\n    pass\nclass _Parser:\n    pass\n",
        "b": "class Converted(tuple):\n    pass\nclass _Parser:\n    pass\n",
        "c": "from a import Converted\n\ndef f():\n    class Local:\n        pass\n",
        "d": "class Local:\n    pass\n",
    }
    assert shared_names(sources) == {"Converted": ["a", "b"]}
    assert public_classes(sources["c"]) == []


def test_no_two_public_classes_share_a_name():
    sources = {
        str(path.relative_to(ROOT)): path.read_text()
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    shared = shared_names(sources)
    assert not shared, "\n".join(f"{name}: {', '.join(m)}" for name, m in shared.items())


def test_catching_either_packages_unknown_split_error_catches_both():
    import imagerecords
    import reader

    assert reader.UnknownSplitError is imagerecords.UnknownSplitError
