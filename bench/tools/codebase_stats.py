"""A checkout's size and shape: lines per package, the longest modules and functions,
and the project files one local run enters (issue 44's before/after table).

``python -m bench.tools.codebase_stats [--root DIR] [--json OUT] [--compare OLD.json]``;
for another commit, run this file by path with ``--root`` at that commit's checkout.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Where the lines are counted; beam_pipeline's sub-packages get a row each too.
PACKAGES = ("beam_pipeline", "reader", "imagerecords", "deploy", "scripts", "tests", "bench")
# The product: its modules and functions are the ones ranked, as in tests/test_architecture_doc.py.
PRODUCT = ("beam_pipeline", "reader", "imagerecords")
TOP = 8
# The traced runs: a name and the flags after --input/--output; "{old}" is the plain run's output.
RUNS = (
    ("default", ()),
    ("--dedupe near", ("--dedupe", "near")),
    ("--reuse", ("--reuse", "{old}")),
)
TRACE = "--_trace"
CO_OPTIMIZED = 0x1  # inspect.CO_OPTIMIZED, without importing inspect into the traced run
COMPREHENSIONS = frozenset({"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"})


def nonblank_lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip())


def docstring_lines(source: str) -> int:
    """A module docstring's lines, blank ones inside it included; 0 for none (the tests' rule)."""
    doc = ast.get_docstring(ast.parse(source), clean=False)
    return len(doc.strip().splitlines()) if doc else 0


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines from ``def`` to the end) of every function and method."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def package_of(path: str) -> str | None:
    """The row a file's lines count in: beam_pipeline/<sub> for a sub-package's, else the top folder."""
    parts = path.split("/")
    if parts[0] not in PACKAGES or len(parts) == 1:
        return None
    if parts[0] == "beam_pipeline":
        return "/".join(parts[:2]) if len(parts) > 2 else "beam_pipeline (top level)"
    return parts[0]


def tracked_python(root: Path) -> list[str]:
    """The checkout's .py files, relative and sorted: git's list where it is a checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "*.py"], capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [
            p.relative_to(root).as_posix()
            for p in root.rglob("*.py")
            if ".venv" not in p.parts and "__pycache__" not in p.parts
        ]
    return sorted(p for p in out if (root / p).is_file())


def static_stats(root: Path, files: list[str]) -> dict:
    """Everything that reading the files tells: lines, longest modules and functions, docstrings."""
    lines: dict[str, int] = {}
    counts: dict[str, int] = {}
    modules, functions, docstrings = [], [], []
    for path in files:
        source = (root / path).read_text(encoding="utf-8")
        row = package_of(path)
        if row:
            for name in {row, path.split("/")[0]}:
                lines[name] = lines.get(name, 0) + nonblank_lines(source)
                counts[name] = counts.get(name, 0) + 1
        if path.split("/")[0] in PRODUCT:
            modules.append((path, len(source.splitlines())))
            functions += [
                (f"{path}:{line} {name}", n) for name, line, n in function_lengths(source)
            ]
            docstrings.append(docstring_lines(source))
    order = [p for p in PACKAGES if p in lines]
    order[1:1] = sorted(k for k in lines if k.startswith("beam_pipeline") and k != "beam_pipeline")
    by_length = sorted(functions, key=lambda item: (-item[1], item[0]))
    return {
        "packages": [{"package": k, "files": counts[k], "lines": lines[k]} for k in order],
        "longest_modules": sorted(modules, key=lambda item: (-item[1], item[0]))[:TOP],
        "longest_functions": by_length[:TOP],
        "functions": len(functions),
        "function_median": statistics.median(n for _, n in functions) if functions else 0,
        "docstring_median": statistics.median(docstrings) if docstrings else 0,
        "docstring_max": max(docstrings, default=0),
    }


def project_file(filename: str, root: Path, skip: Path) -> str | None:
    """``filename`` relative to ``root`` when it is the project's (not the venv's, not this tool)."""
    try:
        path = Path(filename).resolve()
        rel = path.relative_to(root)
    except (OSError, ValueError):
        return None
    if path == skip or rel.parts[0].startswith(".venv") or path.suffix != ".py":
        return None
    return rel.as_posix()


def is_function(code) -> bool:
    """Whether ``code`` is a function's or a lambda's: not a module's or a class body's (they run
    on import, not optimized), nor a comprehension's (its function is entered too, or it ran
    on import)."""
    return bool(code.co_flags & CO_OPTIMIZED) and code.co_name not in COMPREHENSIONS


def _trace_child(out: str, root: str, argv: list[str]) -> None:
    """Runs ``python -m beam_pipeline argv`` with a profiler that appends to ``out`` each project
    file, once per process, the first time a function of it is entered ("F path pid") or only
    its module or a class body runs ("M path pid"). Appended as found: forked pool workers inherit the profiler and may
    leave by os._exit."""
    import runpy
    import threading

    base, skip = Path(root).resolve(), Path(__file__).resolve()
    seen_code: set = set()
    seen: set = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in seen_code:
            return
        seen_code.add(code)
        rel = project_file(code.co_filename, base, skip)
        if rel is None:
            return
        key = ("F " if is_function(code) else "M ") + rel
        if (os.getpid(), key) not in seen:
            seen.add((os.getpid(), key))
            with open(out, "a", encoding="utf-8") as f:
                f.write(f"{key} {os.getpid()}\n")

    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != skip.parent]
    sys.argv = ["beam_pipeline", *argv]
    threading.setprofile(profile)
    sys.setprofile(profile)
    runpy.run_module("beam_pipeline", run_name="__main__", alter_sys=True)


def make_images(folder: Path) -> None:
    """Two classes of four small images of random blocks, and a resized, re-encoded copy of one."""
    import random

    from PIL import Image

    rng = random.Random(44)
    for label in ("cat", "dog"):
        (folder / label).mkdir(parents=True)
        for k in range(4):
            blocks = Image.new("RGB", (6, 5))
            blocks.putdata([tuple(rng.randrange(256) for _ in "rgb") for _ in range(30)])
            image = blocks.resize((48, 40), Image.Resampling.BILINEAR)
            image.save(folder / label / f"{k}.png")
            if k == 0 and label == "cat":
                image.resize((40, 33)).save(folder / label / "0-copy.jpg", quality=90)


def traced_run(root: Path, flags: list[str], work: Path) -> dict:
    """Runs the CLI of ``root``'s checkout under the tracer and names the project files it entered."""
    out = work / f"trace-{len(list(work.glob('trace-*')))}.txt"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    )
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        TRACE,
        str(out),
        str(root),
        "--",
        *flags,
    ]
    done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(flags)} failed:\n{done.stderr[-2000:]}")
    lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    entered = sorted({line.split()[1] for line in lines if line.startswith("F ")})
    imported = sorted({line.split()[1] for line in lines} - set(entered))
    processes = len({line.split()[2] for line in lines})
    if not entered:
        raise SystemExit(
            f"error: the traced run entered no file under {root}: is it the checkout run?"
        )
    return {"flags": flags, "processes": processes, "entered": entered, "imported_only": imported}


def follow_runs(root: Path) -> dict:
    """The plain local run, --dedupe near and --reuse of the plain run's output, each traced."""
    with tempfile.TemporaryDirectory(prefix="codebase-stats-") as tmp:
        work = Path(tmp)
        make_images(work / "in")
        runs = {}
        for name, extra in RUNS:
            output = work / f"out-{len(runs)}"
            flags = ["--input", str(work / "in"), "--output", str(output)]
            flags += [flag.format(old=work / "out-0") for flag in extra]
            runs[name] = traced_run(root, flags, work)
        for run in runs.values():  # the temporary folder's name is not part of the figure
            run["flags"] = [flag.replace(tmp, "TMP") for flag in run["flags"]]
        return runs


def commit_of(root: Path) -> str:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() or "unknown"


def entered(run: dict | None) -> str:
    if run is None:
        return "-"
    return f"{len(run['entered'])} (+{len(run['imported_only'])} only imported)"


def number(value: float) -> str:
    """``8``, ``8.5``, ``1,062``: a median without a trailing ``.0``."""
    return f"{value:,.1f}".removesuffix(".0")


def render(stats: dict, old: dict | None = None) -> str:
    """The markdown table; with ``old``, the old figures in a column before this checkout's."""
    heads = [f"`{old['commit']}`", f"`{stats['commit']}`"] if old else [f"`{stats['commit']}`"]
    both = [old, stats] if old else [stats]

    def row(label: str, values: list) -> str:
        return "| " + " | ".join([label, *map(str, values)]) + " |"

    lines = [row("", heads), "|" + "---|" * (len(heads) + 1)]
    names = list(dict.fromkeys(p["package"] for s in both for p in s["packages"]))
    for name in names:
        cells = []
        for s in both:
            found = [p for p in s["packages"] if p["package"] == name]
            cells.append(f"{found[0]['lines']:,} ({found[0]['files']})" if found else "-")
        lines.append(row(f"lines (.py files) {name}", cells))
    lines.append(
        row(
            "functions; median length",
            [f"{s['functions']:,}; {number(s['function_median'])}" for s in both],
        )
    )
    lines.append(
        row(
            "module docstrings: median, max",
            [f"{number(s['docstring_median'])}, {s['docstring_max']}" for s in both],
        )
    )
    for name in stats.get("runs", {}):
        cells = [entered(s.get("runs", {}).get(name)) for s in both]
        lines.append(row(f"files entered by a {name} local run", cells))
    for key, title in (("longest_modules", "lines"), ("longest_functions", "lines")):
        lines += [
            "",
            row(f"{key.replace('_', ' ')} ({title})", heads),
            "|" + "---|" * (len(heads) + 1),
        ]
        for k in range(TOP):
            cells = [f"{s[key][k][0]} {s[key][k][1]}" if k < len(s[key]) else "-" for s in both]
            lines.append(row(str(k + 1), cells))
    return "\n".join(lines)


def collect(root: Path, trace: bool = True) -> dict:
    stats = {"commit": commit_of(root), "date": datetime.date.today().isoformat()}
    stats |= static_stats(root, tracked_python(root))
    if trace:
        stats["runs"] = follow_runs(root)
    return stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.codebase_stats", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--compare", type=Path, help="an earlier --json: shown in a column before")
    parser.add_argument("--no_runs", action="store_true", help="skip the traced runs")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not (root / "beam_pipeline").is_dir():
        parser.error(f"--root {root} is not a checkout of the project (no beam_pipeline/)")
    old = json.loads(args.compare.read_text()) if args.compare else None
    stats = collect(root, trace=not args.no_runs)
    if args.json:
        args.json.write_text(json.dumps(stats, indent=1) + "\n")
    print(render(stats, old))


if __name__ == "__main__":
    if sys.argv[1:2] == [TRACE]:
        _trace_child(sys.argv[2], sys.argv[3], sys.argv[5:])
    else:
        main()
