"""Writes what is derived from the flag table (beam_pipeline/core/flags.py): `make flags`.

* ``deploy/metadata.json``'s ``parameters`` (the Flex Template's), the rest of
  the file kept;
* the README's flag table, between its two markers.

``--check`` writes nothing and exits 1 when a file differs from what it would
write (tests/test_flags.py makes the same comparison).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's table, not an installed copy's

from beam_pipeline.core import flags  # noqa: E402

METADATA = ROOT / "deploy" / "metadata.json"
README = ROOT / "README.md"


def metadata_text(current: str) -> str:
    """metadata.json with its parameters the table's, one parameter a line."""
    document = json.loads(current)
    document["parameters"] = flags.template_parameters()
    head = {key: value for key, value in document.items() if key != "parameters"}
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    rows = [f"    {json.dumps(p, ensure_ascii=False)}" for p in document["parameters"]]
    return "{\n" + "\n".join(lines) + '\n  "parameters": [\n' + ",\n".join(rows) + "\n  ]\n}\n"


def readme_text(current: str) -> str:
    """The README with the text between the markers the table's."""
    begin, end = current.index(flags.README_BEGIN), current.index(flags.README_END)
    return current[:begin] + flags.readme_table() + current[end + len(flags.README_END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for path, render in ((METADATA, metadata_text), (README, readme_text)):
        current = path.read_text()
        wanted = render(current)
        if wanted != current:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(wanted)
    if args.check and stale:
        names = ", ".join(map(str, stale))
        print(
            f"error: {names} differ from beam_pipeline/core/flags.py: run make flags",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
