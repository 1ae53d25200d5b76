"""`make beam-range`: the installed converter, with whatever Beam it got, converts a folder.

Run with a venv's Python from outside the repository (so that the installed
package is the one imported, as a user's is): it makes a small image folder,
converts it with the local engine and with ``--runner DirectRunner``, and
checks that both exit 0, write ``imagerecords.json`` last and write the same
bytes. Prints the Beam version and one line per run; exits 1 on a failure.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from PIL import Image

RUNS = {"local engine": [], "DirectRunner": ["--runner", "DirectRunner"]}


def make_folder(root: Path, per_class: int = 6) -> None:
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            image = Image.effect_noise((64 + 8 * i, 48 + 4 * i), 40 + i).convert("RGB")
            image.save(root / label / f"{label}_{i}.jpg", quality=90)


def same_files(a: Path, b: Path) -> list[str]:
    """The files that differ or exist on one side only (empty: identical trees)."""
    names = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()})
    names_b = sorted({p.relative_to(b) for p in b.rglob("*") if p.is_file()})
    if names != names_b:
        return sorted(set(map(str, names)) ^ set(map(str, names_b)))
    return [str(n) for n in names if not filecmp.cmp(a / n, b / n, shallow=False)]


def main() -> int:
    print(f"apache-beam {metadata.version('apache-beam')}, imagerecords from {_where()}")
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        make_folder(base / "images")
        outputs = {}
        for name, flags in RUNS.items():
            out = base / name.replace(" ", "-")
            command = [sys.executable, "-m", "beam_pipeline", "--input", str(base / "images")]
            command += ["--output", str(out), "--quiet", *flags]
            run = subprocess.run(command, capture_output=True, text=True, cwd=folder)
            last = (run.stderr.strip().splitlines() or [""])[-1]
            if run.returncode != 0 or not (out / "imagerecords.json").exists():
                print(f"{name}: FAILED, exit {run.returncode}: {last}\n{run.stderr[-3000:]}")
                return 1
            warnings = [line for line in run.stderr.splitlines() if "beam_private" in line]
            print(f"{name}: exit 0, {len(list(out.rglob('*.tfrecord*')))} shards")
            for line in warnings:
                print(f"  {line}")
            outputs[name] = out
        differ = same_files(*outputs.values())
        if differ:
            print(f"the two runs wrote different files: {', '.join(differ)}")
            return 1
        print("both runs wrote the same bytes")
    return 0


def _where() -> str:
    import beam_pipeline

    return os.path.dirname(beam_pipeline.__file__)


if __name__ == "__main__":
    sys.exit(main())
