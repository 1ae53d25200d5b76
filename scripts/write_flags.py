"""Writes what is derived from the flag table (beam_pipeline/core/flags.py): `make flags`.

* ``deploy/metadata.json``'s ``parameters`` (the Flex Template's), the rest of
  the file kept;
* docs/flags.md's flag table, between its two markers.

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
FLAGS_PAGE = ROOT / "docs" / "flags.md"
TABLE_BEGIN = "<!-- flags: made by `make flags` from beam_pipeline/core/flags.py -->"
TABLE_END = "<!-- /flags -->"
# A template value's shape where the flag's check gives none: by its kind.
KIND_REGEX = {
    "bool": "^(" + "|".join(flags.BOOLEAN_WORDS) + ")$",
    "int": "^-?[0-9]+$",
    "float": r"^[0-9]+(\.[0-9]+)?$",
}


# ------------------------------------------------ the Flex Template's parameters


def template_parameters() -> list[dict]:
    """``deploy/metadata.json``'s parameters: one per flag the template offers."""
    found = []
    for flag in flags.FLAGS:
        if flag.template is None:
            continue
        regex = (
            flag.template.regex or (flag.check and flag.check.regex) or KIND_REGEX.get(flag.kind)
        )
        entry = {
            "name": flag.name,
            "label": flag.template.label,
            "helpText": flag.template.help or flag.help_text,
            "isOptional": not flag.required,
        }
        if regex:
            entry["regexes"] = [regex]
        found.append(entry)
    return found


def metadata_text(current: str) -> str:
    """metadata.json with its parameters the table's, one parameter a line."""
    document = json.loads(current)
    document["parameters"] = template_parameters()
    head = {key: value for key, value in document.items() if key != "parameters"}
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    rows = [f"    {json.dumps(p, ensure_ascii=False)}" for p in document["parameters"]]
    return "{\n" + "\n".join(lines) + '\n  "parameters": [\n' + ",\n".join(rows) + "\n  ]\n}\n"


# ------------------------------------------------------------ the flag table


def _markdown(text: str) -> str:
    """Help text as a table cell shows it: no HTML tags, emphasis or column breaks."""
    for plain, escaped in (("<", "&lt;"), (">", "&gt;"), ("*", "\\*"), ("|", "\\|")):
        text = text.replace(plain, escaped)
    return text


def _help_without_default(flag: flags.Flag) -> str:
    """The help, less its default (the table's own column)."""
    text = flag.help.replace(" (default {default})", "")
    for said in ("default {default}; ", "default {default}: ", "default {default}"):
        text = text.replace(said, "")
    return text


def _default_cell(flag: flags.Flag) -> str:
    if flag.required:
        return "required"
    if isinstance(flag.default, bool):
        return "on" if flag.default else "off"
    return flag.default_text


def flag_table() -> str:
    """The flag table, one row per flag, between its markers."""
    rows = [TABLE_BEGIN, "", "| flag | default | meaning |", "|---|---|---|"]
    for flag in flags.FLAGS:
        name = f"`{flag.option}`" + (f" {flag.metavar}" if flag.metavar else "")
        cells = (name, _markdown(_default_cell(flag)), _markdown(_help_without_default(flag)))
        rows.append("| " + " | ".join(cells) + " |")
    rows += ["", TABLE_END]
    return "\n".join(rows)


def flags_page_text(current: str) -> str:
    """docs/flags.md with the text between the markers the table's."""
    begin, end = current.index(TABLE_BEGIN), current.index(TABLE_END)
    return current[:begin] + flag_table() + current[end + len(TABLE_END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for path, render in ((METADATA, metadata_text), (FLAGS_PAGE, flags_page_text)):
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
