"""docs/architecture.md names every module of the product, and no module that is gone,
each on a catalogue line of its own."""

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE_MD = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = ("beam_pipeline", "reader", "imagerecords")

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
