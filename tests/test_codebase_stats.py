"""bench/tools/codebase_stats.py: what it counts as lines, functions, docstrings and files entered."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.tools import codebase_stats as stats

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("source", "lines"),
    [("", 0), ("x = 1\n", 1), ("x = 1\n\n   \ny = 2\n", 2), ("# note\n\n", 1)],
)
def test_nonblank_lines(source, lines):
    assert stats.nonblank_lines(source) == lines


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("import os\n", 0),
        ('"""One line."""\n', 1),
        ('"""Summary.\n\nMore,\non two lines.\n"""\nx = 1\n', 4),
        ('x = 1\n"""Not a docstring."""\n', 0),
    ],
)
def test_docstring_lines(source, lines):
    assert stats.docstring_lines(source) == lines


def test_function_lengths_name_methods_and_nested_functions_and_skip_decorators():
    source = (
        "def f():\n    return 1\n\n"
        "class C:\n    @staticmethod\n    def m():\n        def inner():\n            pass\n"
        "        return inner\n\n"
        "async def g(): pass\n"
        "if True:\n    def h():\n        pass\n"
    )
    assert stats.function_lengths(source) == [
        ("f", 1, 2),
        ("C.m", 6, 4),
        ("C.m.inner", 7, 2),
        ("g", 11, 1),
        ("h", 13, 2),
    ]


@pytest.mark.parametrize(
    ("path", "row"),
    [
        ("beam_pipeline/core/flags.py", "beam_pipeline/core"),
        ("beam_pipeline/__main__.py", "beam_pipeline (top level)"),
        ("reader/info.py", "reader"),
        ("bench/tools/interleave.py", "bench"),
        ("tests/test_cli.py", "tests"),
        ("setup.py", None),
        ("docs/conf.py", None),
    ],
)
def test_package_of(path, row):
    assert stats.package_of(path) == row


def test_static_stats_count_lines_per_package_and_rank_the_products_modules(tmp_path):
    files = {
        "beam_pipeline/core/a.py": '"""A."""\n\ndef f():\n    x = 1\n    return x\n',
        "beam_pipeline/cli/b.py": "def g():\n    pass\n",
        "reader/c.py": '"""C.\n\nand more.\n"""\n',
        "tests/test_a.py": "def test_f():\n\n    pass\n" * 3,
    }
    for path, source in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
    figures = stats.static_stats(tmp_path, sorted(files))
    assert figures["packages"] == [
        {"package": "beam_pipeline", "files": 2, "lines": 6},
        {"package": "beam_pipeline/cli", "files": 1, "lines": 2},
        {"package": "beam_pipeline/core", "files": 1, "lines": 4},
        {"package": "reader", "files": 1, "lines": 3},
        {"package": "tests", "files": 1, "lines": 6},
    ]
    assert figures["longest_modules"] == [
        ("beam_pipeline/core/a.py", 5),
        ("reader/c.py", 4),
        ("beam_pipeline/cli/b.py", 2),
    ]
    assert figures["longest_functions"] == [
        ("beam_pipeline/core/a.py:3 f", 3),
        ("beam_pipeline/cli/b.py:1 g", 2),
    ]
    assert (figures["functions"], figures["function_median"]) == (2, 2.5)
    assert (figures["docstring_median"], figures["docstring_max"]) == (1, 3)


@pytest.mark.parametrize(
    ("filename", "rel"),
    [
        ("beam_pipeline/core/flags.py", "beam_pipeline/core/flags.py"),
        (".venv/lib/python3.11/site-packages/PIL/Image.py", None),
        ("bench/tools/codebase_stats.py", None),  # the tracer itself
        ("beam_pipeline/core/data.json", None),
        ("/usr/lib/python3.11/os.py", None),
        ("<string>", None),
    ],
)
def test_project_file(filename, rel):
    name = filename if filename.startswith(("/", "<")) else str(REPO / filename)
    assert stats.project_file(name, REPO, REPO / "bench/tools/codebase_stats.py") == rel


class _Body:
    code = __import__("sys")._getframe().f_code


def _function():
    return __import__("sys")._getframe().f_code


@pytest.mark.parametrize(
    ("code", "function"),
    [
        (compile("x = 1", "m.py", "exec"), False),  # a module's body
        (_Body.code, False),  # a class body
        (_function(), True),
        ((lambda: __import__("sys")._getframe().f_code)(), True),
        (next(__import__("sys")._getframe().f_code for _ in "x"), False),  # a comprehension
    ],
)
def test_is_function(code, function):
    assert stats.is_function(code) is function


def test_render_puts_the_old_figures_first_and_dashes_what_one_side_lacks():
    def figures(commit, packages, runs):
        return {
            "commit": commit,
            "packages": [{"package": p, "files": 1, "lines": n} for p, n in packages],
            "functions": 1200,
            "function_median": 8.0,
            "docstring_median": 11.5,
            "docstring_max": 66,
            "longest_modules": [("a.py", 9)],
            "longest_functions": [],
            "runs": runs,
        }

    run = {"entered": ["a.py", "b.py"], "imported_only": ["c.py"]}
    old = figures("aaa", [("beam_pipeline", 1200), ("reader", 5)], {"default": run})
    new = figures("bbb", [("beam_pipeline", 900)], {"default": run, "--reuse": run})
    table = stats.render(new, old).splitlines()
    assert table[0] == "|  | `aaa` | `bbb` |"
    assert "| lines (.py files) beam_pipeline | 1,200 (1) | 900 (1) |" in table
    assert "| lines (.py files) reader | 5 (1) | - |" in table
    assert "| functions; median length | 1,200; 8 | 1,200; 8 |" in table
    assert "| module docstrings: median, max | 11.5, 66 | 11.5, 66 |" in table
    assert (
        "| files entered by a default local run | 2 (+1 only imported) | 2 (+1 only imported) |"
        in table
    )
    assert "| files entered by a --reuse local run | - | 2 (+1 only imported) |" in table
    assert "| 1 | a.py 9 | a.py 9 |" in table


@pytest.mark.e2e
def test_a_traced_run_names_the_files_the_parent_and_its_workers_enter():
    runs = stats.follow_runs(REPO)
    plain = runs["default"]
    assert plain["processes"] >= 2  # the CLI and at least one forked conversion worker
    assert "beam_pipeline/engines/local_engine.py" in plain["entered"]
    assert "beam_pipeline/__init__.py" in plain["imported_only"]
    assert not set(plain["entered"]) & set(plain["imported_only"])
    assert set(runs) == {"default", "--dedupe near", "--reuse"}
    assert runs["--reuse"]["flags"][-2:] == ["--reuse", "TMP/out-0"]
