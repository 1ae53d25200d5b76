"""Writes the output samples README.md shows, by running their commands: `make samples`.

Today one: the walkthrough's ``--dry_run`` on the ``make demo`` photos, between
the README's sample markers. ``--check`` writes nothing and exits 1 when the
README's sample differs from a fresh run in anything but what the machine
decides (:func:`steady`); tests/test_doc_snippets.py makes the same comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SAMPLE_BEGIN = "<!-- sample: dry run, made by `make samples` (scripts/write_samples.py) -->"
SAMPLE_END = "<!-- /sample -->"
# Where the sample says the photos are: the reader's home, not a temporary folder.
SHOWN_FOLDER = "/home/you"

# What the machine decides, not the code: durations, speeds, CPU, core counts
# and the cost that follows from the CPU. Everything else must match exactly.
_MACHINE = [
    r"\d[\d,.]* s\b",
    r"\d[\d,.]* images/s",
    r"\d[\d,.]* ms CPU",
    r"\d+ conversion process(es)?",
    r"~\d[\d,.]* vCPU-hours",
    r"(under |~)\$\d[\d,.]*",
]


def steady(text: str) -> str:
    """``text`` with each machine-dependent figure replaced by ``N``."""
    for pattern in _MACHINE:
        text = re.sub(pattern, lambda m: re.sub(r"\d[\d,.]*", "N", m.group(0)), text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def command(readme: str) -> list[str]:
    """The walkthrough's dry-run command: the bash line just above the sample."""
    found = re.search(r"```bash\n([^`]*--dry_run)\n```\n" + re.escape(SAMPLE_BEGIN), readme)
    if found is None:
        raise ValueError("README.md: no ```bash --dry_run block directly above the sample")
    return shlex.split(found.group(1).replace("\\\n", " "))


def sample_of(readme: str) -> str:
    """The sample the README shows now (the text of its fenced block)."""
    begin, end = readme.index(SAMPLE_BEGIN), readme.index(SAMPLE_END)
    block = readme[begin + len(SAMPLE_BEGIN) : end].strip()
    return block.removeprefix("```").removesuffix("```").strip("\n")


def with_sample(readme: str, sample: str) -> str:
    """The README with ``sample`` between its markers."""
    begin, end = readme.index(SAMPLE_BEGIN), readme.index(SAMPLE_END)
    block = f"{SAMPLE_BEGIN}\n```\n{sample.rstrip()}\n```\n"
    return readme[:begin] + block + readme[end:]


def shown(output: str, folder: str) -> str:
    """What a run in ``folder`` printed, as the README shows it (its folder the reader's)."""
    return output.replace(str(folder), SHOWN_FOLDER)


def _build_photos(folder: Path) -> None:
    spec = importlib.util.spec_from_file_location("demo", ROOT / "scripts" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.build_sample(str(folder / "photos"))


def run_sample(readme: str, folder: Path | None = None) -> str:
    """The README's dry-run command run on the demo photos in ``folder`` (built there
    when missing), its output as the README shows it."""
    argv = command(readme)
    if argv[:3] != ["python", "-m", "beam_pipeline"]:
        raise ValueError(f"README.md: the sample's command is not python -m beam_pipeline: {argv}")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(folder or scratch)
        if not (folder / "photos").is_dir():
            _build_photos(folder)
        # This checkout's code, as the README's reader runs it from the venv.
        paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        done = subprocess.run(
            [sys.executable, *argv[1:]], cwd=folder, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"the sample's command failed:\n{done.stderr}")
        return shown(done.stdout, folder.resolve())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    args = parser.parse_args(argv)
    readme = README.read_text()
    fresh = run_sample(readme)
    if args.check:
        if steady(sample_of(readme)) != steady(fresh):
            print("error: README.md's dry-run sample is stale: run make samples", file=sys.stderr)
            return 1
        return 0
    README.write_text(with_sample(readme, fresh))
    return 0


if __name__ == "__main__":
    sys.exit(main())
