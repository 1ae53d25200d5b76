"""docs/architecture.md names every module of the product, and no module that is gone,
each on a catalogue line of its own; the modules' own docstrings stay short."""

import ast
import re
import statistics
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE_MD = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = ("beam_pipeline", "reader", "imagerecords")
# A module docstring says what the module is for; the design is architecture.md's.
DOCSTRING_MEDIAN, DOCSTRING_MAX = 6, 20

# Every `...py` in backticks: `local_engine.py`, `storage/listing.py`, `reader/info.py`.
NAMED = set(re.findall(r"`([\w./-]*\w\.py)`", ARCHITECTURE_MD))
# The catalogue: one line per module, "* `cli/job.py`: what it is for."
CATALOGUE = re.findall(r"^\* `([\w./-]*\w\.py)`: \S", ARCHITECTURE_MD, re.MULTILINE)


def _modules() -> list[Path]:
    """Every .py file of the three packages, relative to the repository, but __init__.py."""
    return sorted(
        path.relative_to(ROOT)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    )


def _is(module: Path, name: str) -> bool:
    """Whether ``name`` (`listing.py`, `storage/listing.py`, `beam_pipeline/storage/listing.py`)
    names ``module``: its whole path, or its last parts."""
    return module.as_posix() == name or module.as_posix().endswith("/" + name)


def test_every_module_is_named():
    modules = _modules()
    assert modules, "no modules found: is ROOT the repository?"
    # A name two packages share (info.py) says which one only with its package.
    shared = {name for name, n in Counter(m.name for m in modules).items() if n > 1}
    missing = [
        str(module)
        for module in modules
        if not any(_is(module, name) for name in NAMED)
        or (module.name in shared and not any("/" in n and _is(module, n) for n in NAMED))
    ]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_every_module_has_one_catalogue_line():
    modules = _modules()
    lines = {str(m): [n for n in CATALOGUE if _is(m, n)] for m in modules}
    assert [m for m, found in lines.items() if len(found) != 1] == [], (
        "docs/architecture.md: each module needs exactly one catalogue line "
        "'* `package/module.py`: ...'"
    )
    strays = [n for n in CATALOGUE if not any(_is(m, n) for m in modules)]
    assert strays == [], f"catalogue lines of no module: {', '.join(strays)}"


def test_every_named_module_exists():
    modules = _modules()

    def exists(name: str) -> bool:
        return (ROOT / name).is_file() or any(_is(module, name) for module in modules)

    stale = sorted(name for name in NAMED if not exists(name))
    assert not stale, f"docs/architecture.md names files that do not exist: {', '.join(stale)}"


def _docstring_lines(source: str) -> int:
    """The lines of a module's docstring, blank lines inside it included; 0 for none."""
    doc = ast.get_docstring(ast.parse(source), clean=False)
    return len(doc.strip().splitlines()) if doc else 0


def test_docstring_lines_are_counted():
    assert _docstring_lines("import os\n") == 0
    assert _docstring_lines('"""One line."""\n') == 1
    assert _docstring_lines('"""Summary.\n\nMore,\non two lines.\n"""\nx = 1\n') == 4
    assert _docstring_lines('x = 1\n"""Not a docstring."""\n') == 0


def test_module_docstrings_are_short():
    lines = {
        str(path.relative_to(ROOT)): _docstring_lines(path.read_text(encoding="utf-8"))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert lines, "no modules found: is ROOT the repository?"
    long = sorted(f"{path} ({n} lines)" for path, n in lines.items() if n > DOCSTRING_MAX)
    assert not long, (
        f"module docstrings over {DOCSTRING_MAX} lines (move the design to "
        f"docs/architecture.md's design notes): {', '.join(long)}"
    )
    median = statistics.median(lines.values())
    assert median <= DOCSTRING_MEDIAN, (
        f"module docstrings: median {median} lines, more than {DOCSTRING_MEDIAN}"
    )
