"""Writes what is derived from the flag table (beam_pipeline/core/flags.py): `make flags`.

* ``deploy/metadata.json``'s ``parameters`` (the Flex Template's), the rest of
  the file kept;
* the README's flag table, between its two markers;
* the settings in the README's dry-run sample (``converted in memory (...)``):
  the image settings its command asks for, as the dry run prints them.

``--check`` writes nothing and exits 1 when a file differs from what it would
write (tests/test_flags.py makes the same comparison).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's table, not an installed copy's

from beam_pipeline.core import flags, images, settings  # noqa: E402

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


# The dry-run command's block, then its output block, then the sample's settings.
_DRY_RUN_SAMPLE = re.compile(
    r"(```bash\n(?P<command>[^`]*--dry_run)\n```\n```\n[^`]*?converted in memory \()"
    r"(?P<settings>[^)\n]*)(\))"
)


def asked_image(command: str) -> images.ImageSpec:
    """The ImageSpec a command line asks for: its image flags, the others' defaults."""
    given = dict(re.findall(r"--(\w+)[ =]([^\s-]\S*)", command))
    image = {}
    for flag in flags.FLAGS:
        if flag.field and flag.field.startswith("image."):
            text = given.get(flag.name)
            if flag.kind == "bool":  # a switch: given or not
                value = f"--{flag.name}" in command.split() or flag.default
            elif text is None:
                value = flag.default
            else:
                value = {"int": int, "float": float}.get(flag.kind, str)(text)
            image[flag.field.removeprefix("image.")] = flag.field_value(value)
    return images.ImageSpec(**image)


def _sample_settings(match: re.Match) -> str:
    shown = settings.describe(settings.image_settings(asked_image(match.group("command"))))
    return match.group(1) + shown + match.group(4)


def readme_text(current: str) -> str:
    """The README with the text between the markers the table's, and the dry-run
    sample's settings those its command asks for."""
    begin, end = current.index(flags.README_BEGIN), current.index(flags.README_END)
    current = current[:begin] + flags.readme_table() + current[end + len(flags.README_END) :]
    return _DRY_RUN_SAMPLE.sub(_sample_settings, current, count=1)


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
