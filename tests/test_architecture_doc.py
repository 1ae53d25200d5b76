"""docs/architecture.md names every module of the product, and no module that is gone."""

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE_MD = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = ("beam_pipeline", "reader", "imagerecords")

# Every `...py` in backticks: `local_engine.py`, `reader/info.py`, `tests/conftest.py`.
NAMED = set(re.findall(r"`([\w./-]*\w\.py)`", ARCHITECTURE_MD))


def _modules() -> list[Path]:
    """Every .py file of the three packages, relative to the repository, but __init__.py."""
    return sorted(
        path.relative_to(ROOT)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    )


def test_every_module_is_named():
    modules = _modules()
    assert modules, "no modules found: is ROOT the repository?"
    # A name two packages share (info.py) says which one only with its package.
    shared = {name for name, n in Counter(m.name for m in modules).items() if n > 1}
    missing = [
        str(module)
        for module in modules
        if module.as_posix() not in NAMED and (module.name in shared or module.name not in NAMED)
    ]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_every_named_module_exists():
    def exists(name: str) -> bool:
        if "/" in name:
            return (ROOT / name).is_file()
        return any((ROOT / where / name).is_file() for where in (*PACKAGES, "."))

    stale = sorted(name for name in NAMED if not exists(name))
    assert not stale, f"docs/architecture.md names files that do not exist: {', '.join(stale)}"
