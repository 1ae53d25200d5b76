"""Every ```python block of README.md and docs/*.md runs as a reader pastes it.

How the blocks run: the blocks of one file run in order in one Python process
and one namespace (each may use what the blocks above it defined, as when they
are pasted into one session), with the working directory a folder that holds

* ``./photos``: the ``make demo`` photos (301 files in 6 classes, one broken;
  ``scripts/demo.py``), and
* ``./photos-records``: them converted by the README's walkthrough command
  (``python -m beam_pipeline --input ./photos --output ./photos-records
  --image_size 160``; 257 train records, 21 val, 22 test).

A block that raises fails its own test, with the traceback pointing at the
Markdown file's lines; the blocks after it still run.

A block that cannot run here as written says so in HTML comments (GitHub
renders them as nothing) on the lines directly above its opening fence, one
per line:

``<!-- snippet: needs-gpu -->``, ``needs-tpu``, ``needs-cloud``
    Not run: it needs a GPU, a TPU, or a Google Cloud project (a bucket,
    credentials). The block must still compile.
``<!-- snippet: needs-torch -->``
    Needs torch and torchvision, which ``make test`` does not install: left out
    there (tests/conftest.py ends the run with one line of how to run them);
    ``make test-torch`` (pytest ``-m torch``) runs it. Such a block runs in a process of its own with the
    file's other torch blocks (and its saved files), so it must not use what
    the file's other blocks define.
``<!-- snippet: replace OLD NEW -->``
    Run with the text OLD replaced by NEW (shell quoting; OLD must occur).
    For data paths (``replace gs://bucket/records ./photos-records``) and for
    budgets (``replace epochs=10 epochs=1``), so that a block runs in seconds.
``<!-- snippet: given CODE -->``
    CODE runs first: what the text around the block says the reader brings
    (``given def train_step(images, labels): return 0.0``).

A block whose first line is a file name in a comment (``# augment.py``) is not
run: it is saved under that name in the folder, for the blocks after it to
import, as the text around it tells the reader to do (docs/trainers.md).

Anything else after ``snippet:`` is an error, and so is a marker that no
```python fence follows: ``test_markers_are_well_formed`` names them.

``test_readme_dry_run_sample_is_what_the_command_prints`` compares the
README's dry-run sample (written by ``make samples``, scripts/write_samples.py)
with what that command prints on the same photos: every line, word and
figure must match but for what the machine decides (durations, speeds, CPU,
core counts and the cost that follows).

``test_links_and_named_sections_resolve`` checks the references between the
docs: every Markdown link of README.md and docs/*.md reaches its file and
section, and every mention such as ``docs/performance.md, "Local engine"``
(in code comments too, wrapped or not) names the start of a heading there.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/docs/*.md"))]

# file -> why its blocks are not run yet (see the module docstring).
SKIPS = {
    "needs-gpu": "needs a GPU",
    "needs-tpu": "needs a TPU",
    "needs-cloud": "needs a Google Cloud project",
}
FILE_TIMEOUT_S = 300  # all blocks of one file; they take seconds

_MARKER = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


@dataclasses.dataclass
class Block:
    path: str  # relative to the repository root
    line: int  # 1-based line of the block's first code line
    code: str
    skip: str | None = None  # the reason, for a needs-* block
    torch: bool = False  # needs-torch: run by make test-torch
    replace: list = dataclasses.field(default_factory=list)  # (old, new) pairs
    given: list = dataclasses.field(default_factory=list)  # code run before it

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def file(self) -> str | None:
        """The file name a block is to be saved as (its first line ``# name.py``)."""
        match = re.fullmatch(r"# (\w+\.py)", self.code.split("\n", 1)[0])
        return match.group(1) if match else None

    def runnable_code(self) -> str:
        code = textwrap.dedent(self.code)  # a block indented in a list item
        for old, new in self.replace:
            code = code.replace(old, new)
        # Leading newlines put each line at its line number in the Markdown
        # file, so a traceback shows the file's own line.
        return "\n" * (self.line - 1) + code


def _apply(block: Block, directive: str) -> str | None:
    """Adds one marker's directive to ``block``; returns an error, or None."""
    word, _, rest = directive.partition(" ")
    if word in SKIPS and not rest:
        block.skip = SKIPS[word]
    elif word == "needs-torch" and not rest:
        block.torch = True
    elif word == "given" and rest.strip():
        block.given.append(rest.strip())
    elif word == "replace":
        try:
            args = shlex.split(rest)
        except ValueError as error:
            return f"replace: {error}"
        if len(args) != 2:
            return f"replace takes OLD and NEW, got {args}"
        if args[0] not in block.code:
            return f"replace: {args[0]!r} is not in the block"
        block.replace.append(tuple(args))
    else:
        return f"unknown directive {directive!r}"
    return None


def parse(path: str) -> tuple[list[Block], list[str]]:
    """The ```python blocks of one file with their markers applied, and the marker errors."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as stream:
        lines = stream.read().splitlines()
    blocks, errors, attached = [], [], []  # attached: (block, line, directive)
    markers: list[tuple[int, str]] = []  # (line, directive) waiting for the next fence
    fence, block = None, None  # inside a fenced block: its fence, and the Block if python
    for number, text in enumerate(lines, 1):
        if fence is not None:
            if text.strip() == fence:
                fence = None
            elif block is not None:
                block.code += text + "\n"
            continue
        opening = _FENCE.match(text)
        marker = _MARKER.match(text.strip())
        if opening:
            fence, block = opening.group(1), None
            if opening.group(2) == "python":
                block = Block(path, number + 1, "")
                blocks.append(block)
            if block is None and markers:
                errors.append(f"{path}:{markers[0][0]}: snippet marker above a non-python block")
            attached += [(block, line, directive) for line, directive in markers if block]
            markers = []
        elif marker:
            markers.append((number, marker.group(1)))
        elif markers:
            errors.append(f"{path}:{markers[0][0]}: snippet marker not directly above a fence")
            markers = []
    if markers:
        errors.append(f"{path}:{markers[0][0]}: snippet marker at the end of the file")
    for block, line, directive in attached:  # now that each block's code is known
        error = _apply(block, directive)
        if error:
            errors.append(f"{path}:{line}: {error}")
    return blocks, errors


ALL = {path: parse(path) for path in DOCS}
BLOCKS = [block for blocks, _ in ALL.values() for block in blocks]


def test_markers_are_well_formed():
    assert [error for _, errors in ALL.values() for error in errors] == []


# ------------------------------------------------------------------ running

# The child: runs the blocks of one file in order in one namespace, one JSON
# line per block on stdout.
_CHILD = r"""
import importlib, json, sys, time, traceback
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "__main__"}
for block in blocks:
    result = {"name": block["name"], "ok": True}
    print("SNIPPET-START " + block["name"], flush=True)
    start = time.process_time()
    try:
        for given in block["given"]:
            exec(compile(given, "<given for " + block["name"] + ">", "exec"), namespace)
        if block["file"]:  # saved for the blocks below to import, not run
            with open(block["file"], "w", encoding="utf-8") as stream:
                stream.write(block["code"])
            importlib.invalidate_caches()
        else:
            exec(compile(block["code"], block["path"], "exec"), namespace)
    except BaseException:  # report it and go on with the next block
        result = {"name": block["name"], "ok": False, "error": traceback.format_exc()}
    result["cpu_s"] = round(time.process_time() - start, 1)
    print("SNIPPET-RESULT " + json.dumps(result), flush=True)
"""


def _load_demo():
    spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "scripts", "demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "beam_pipeline", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=FILE_TIMEOUT_S,
    )


# The README's walkthrough command (steps 1 and 2).
WALKTHROUGH = ["--input", "./photos", "--output", "./photos-records", "--image_size", "160"]


@dataclasses.dataclass
class Walkthrough:
    folder: object  # pathlib.Path holding ./photos and ./photos-records
    dry_run: str  # what the README's --dry_run command printed there


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory) -> Walkthrough:
    """The README's walkthrough, steps 1 and 2, on the demo photos."""
    folder = tmp_path_factory.mktemp("snippets")
    _load_demo().build_sample(str(folder / "photos"))
    dry_run = _cli(*WALKTHROUGH, "--dry_run", cwd=folder)
    assert dry_run.returncode == 0, dry_run.stderr
    done = _cli(*WALKTHROUGH, cwd=folder)
    assert done.returncode == 0, done.stderr
    return Walkthrough(folder, dry_run.stdout)


@pytest.fixture(scope="module")
def results(walkthrough):
    """(file, torch) -> {block name -> result}, each file's blocks run once, on first use.

    A file's torch blocks run apart from the others: without them where torch
    is missing, and alone (with the saved files) for ``make test-torch``.
    """
    cache: dict[tuple[str, bool], dict] = {}

    def of(path: str, torch: bool = False) -> dict:
        if (path, torch) not in cache:
            cache[path, torch] = _run_file(path, walkthrough.folder, torch)
        return cache[path, torch]

    return of


def _run_file(path: str, workdir, torch: bool = False) -> dict:
    blocks = [b for b in ALL[path][0] if b.skip is None and (b.torch == torch or b.file)]
    spec = [
        {
            "name": b.name,
            "path": os.path.join(ROOT, b.path),
            "code": b.runnable_code(),
            "given": b.given,
            "file": b.file,
        }
        for b in blocks
    ]
    spec_path = workdir / f"{path.replace('/', '_')}{'-torch' if torch else ''}.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(spec_path)],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=FILE_TIMEOUT_S,
        )
        stdout, why = done.stdout, f"exit status {done.returncode}"
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        why = f"still running after {FILE_TIMEOUT_S} s"
    out = {}
    started = None
    for line in (stdout or "").splitlines():
        if line.startswith("SNIPPET-START "):
            started = line.split(" ", 1)[1]
        elif line.startswith("SNIPPET-RESULT "):
            result = json.loads(line.split(" ", 1)[1])
            out[result["name"]] = result
    for block in blocks:  # the block that was running when the process ended, and the rest
        if block.name not in out:
            where = "while it ran" if block.name == started else "before it ran"
            out[block.name] = {"ok": False, "error": f"the process ended {where}: {why}"}
    return out


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(
    "block",
    [pytest.param(b, marks=pytest.mark.torch) if b.torch else b for b in BLOCKS],
    ids=[b.name for b in BLOCKS],
)
def test_snippet_runs(block, results):
    compile(block.runnable_code(), block.path, "exec")  # even a skipped block must parse
    if block.skip:
        pytest.skip(block.skip)
    result = results(block.path, block.torch)[block.name]
    assert result["ok"], f"{block.name} failed when run as pasted:\n{result['error']}"


# ------------------------------------------------------- the dry run's sample


def _samples():
    path = os.path.join(ROOT, "scripts", "write_samples.py")
    spec = importlib.util.spec_from_file_location("write_samples", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SAMPLES = _samples()


@pytest.mark.e2e
@pytest.mark.slow
def test_readme_dry_run_sample_is_what_the_command_prints(walkthrough):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as stream:
        readme = stream.read()
    assert SAMPLES.command(readme)[3:] == [*WALKTHROUGH, "--dry_run"]
    printed = SAMPLES.shown(walkthrough.dry_run, walkthrough.folder.resolve())
    assert SAMPLES.steady(SAMPLES.sample_of(readme)) == SAMPLES.steady(printed), (
        "README.md's dry-run sample is stale: run make samples"
    )


@pytest.mark.parametrize(
    "line, steady",
    [
        (
            "listed 301 images, 18.4 MB in 6 classes in 0.0 s",
            "listed 301 images, 18.4 MB in 6 classes in N s",
        ),
        ("val  21  21  0   263.9 kB  1   263.9 kB", "val  21  21  0   263.9 kB  1   263.9 kB"),
        (
            "speed on this machine: 211 images/s per core, 4.7 ms CPU per image",
            "speed on this machine: N images/s per core, N ms CPU per image",
        ),
        (
            "local run (local engine, 2 conversion processes): about 1 s",
            "local run (local engine, N conversion processes): about N s",
        ),
        (
            "~0.000792 vCPU-hours, ~7.4 MB shuffled, under $0.01 plus",
            "~N vCPU-hours, ~7.4 MB shuffled, under $N plus",
        ),
        (
            "$0.056/vCPU-h, $0.011/GB shuffled; 2x this machine's CPU",
            "$0.056/vCPU-h, $0.011/GB shuffled; 2x this machine's CPU",
        ),
    ],
)
def test_the_sample_compares_all_but_the_machines_figures(line, steady):
    assert SAMPLES.steady(line) == steady


def test_the_sample_is_written_between_its_markers():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as stream:
        readme = stream.read()
    sample = SAMPLES.sample_of(readme)
    stale = SAMPLES.with_sample(readme, sample.replace("dry run", "dry walk"))
    assert stale != readme and SAMPLES.with_sample(stale, sample) == readme


# ------------------------------------------------- references between the docs


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _sections(path: str) -> tuple[list[str], set[str]]:
    """A Markdown file's headings (outside code blocks) and its anchors."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as stream:
        text = stream.read()
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)
    headings = [h.strip() for h in re.findall(r"^#+ (.*)$", text, re.M)]
    anchors, seen = set(), {}
    for heading in headings:
        slug = _slug(heading)
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    anchors |= set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    return headings, anchors


def _doc_link_problems(path: str) -> list[str]:
    """Links of one Markdown file to a missing file, or to a section that is not there."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as stream:
        text = stream.read()
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        linked = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(os.path.join(ROOT, linked)):
            problems.append(f"{path}: link to {target}: no such file")
        elif anchor and linked.endswith(".md") and anchor not in _sections(linked)[1]:
            problems.append(f"{path}: link to {target}: no such section")
    return problems


def _named_section_problems(path: str) -> list[str]:
    """Mentions like `docs/performance.md, "Local engine"` whose section is not there.

    Comment markers at line starts are dropped first, so a mention may wrap.
    The quoted name must begin a heading of the named document.
    """
    with open(os.path.join(ROOT, path), encoding="utf-8") as stream:
        text = stream.read()
    text = re.sub(r"\n\s*(?:#|//|\*)?\s*", " ", text)
    problems = []
    for doc, name in re.findall(r"([\w/]*\b\w+\.md)(?:,\s*|\s*\(\s*)\"([^\"]{2,80})\"", text):
        candidates = [doc, f"docs/{os.path.basename(doc)}"]
        found = next((c for c in candidates if os.path.exists(os.path.join(ROOT, c))), None)
        if found is None:
            continue
        if not any(h.startswith(name) for h in _sections(found)[0]):
            problems.append(f'{path}: {doc}, "{name}": no such section')
    return problems


def _sources() -> list[str]:
    """The project's code and docs, relative to the repository root."""
    found = ["README.md", "Makefile"]
    for top in ("beam_pipeline", "reader", "bench", "tests", "scripts", "deploy", "docs"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            found += [
                os.path.relpath(os.path.join(folder, f), ROOT)
                for f in files
                if f.endswith((".py", ".cc", ".md"))
            ]
    return sorted(found)


def test_links_and_named_sections_resolve():
    problems = [p for path in DOCS for p in _doc_link_problems(path)]
    problems += [p for path in _sources() for p in _named_section_problems(path)]
    assert problems == []


@pytest.mark.e2e
def test_ruff_format_leaves_every_markdown_file_as_it_is():
    """`make lint` runs `ruff format --check .`, which formats the Python blocks of
    Markdown files too: a block it would rewrite fails the lint."""
    markdown = [path for path in _sources() if path.endswith(".md")]
    assert "README.md" in markdown and "docs/trainers.md" in markdown
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--force-exclude", *markdown],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------- pages, not logs

# The two pages a newcomer reads first: short, and current (the history of
# runs lives in dated files under bench/results/, where commits are named).
PAGE_LINES = {"README.md": 300, "docs/performance.md": 300}
# A commit hash: 7-40 hex digits with at least one letter and one digit.
_COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


@pytest.mark.parametrize(
    "text, found",
    [
        ("at commit 2d93c7e, load 0.7", ["2d93c7e"]),
        ("1,280,000 images; 1280000 too", []),
        ("phash19-v3, sha256, deadbeef, decade", []),
        ("git show 85ec5bc:docs/performance.md", ["85ec5bc"]),
    ],
)
def test_a_commit_hash_is_told_from_other_words(text, found):
    assert _COMMIT.findall(text) == found


@pytest.mark.parametrize("path", sorted(PAGE_LINES))
def test_a_first_page_is_short_and_names_no_commit(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as stream:
        text = stream.read()
    assert len(text.splitlines()) <= PAGE_LINES[path], f"{path}: move reference to a docs page"
    assert _COMMIT.findall(text) == [], f"{path}: commits belong in bench/results/ history"


def test_the_readme_starts_with_its_two_commands():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as stream:
        head = "".join(stream.readlines()[:40])
    assert "make demo" in head and "make test" in head
