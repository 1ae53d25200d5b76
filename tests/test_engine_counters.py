"""Both engines count the same things: every counter, not only the output bytes.

Each case runs the real entry point on the same messy folders (bad images,
a file that is not an image, identical files, a file outside any class
folder) on the local engine and on Beam's DirectRunner, on its pooled path
(a local pool of 2 processes) and on its shuffle path (``--local_processes
1``), and compares the counters the summary prints (core/counters.py) and
every output file.
"""

from __future__ import annotations

import ast
import os
import pickle
import shutil
from pathlib import Path

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.cli import summary
from beam_pipeline.core import counters
from tests import contract
from tests.image_factory import add_bad_files, jpeg_bytes, make_class_folders, photo

LOCAL = ("--local_processes", "2")
POOLED = ("--runner", "DirectRunner", "--local_processes", "2")
SHUFFLE = ("--runner", "DirectRunner", "--local_processes", "1")


def _messy(root: str) -> None:
    make_class_folders(root, per_class=6, seed=5, size_range=(60, 120))
    add_bad_files(root)
    with open(os.path.join(root, "cat", "cat_0001.jpg"), "rb") as f:
        first = f.read()
    with open(os.path.join(root, "dog", "copy of cat.jpg"), "wb") as f:  # a duplicate
        f.write(first)
    with open(os.path.join(root, "dog", "README.txt"), "w") as f:  # skipped
        f.write("not an image by its extension\n")
    with open(os.path.join(root, "loose.jpg"), "wb") as f:  # outside any class folder
        f.write(first)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The messy folder, and a copy of it with one image changed and one added (--reuse)."""
    base = tmp_path_factory.mktemp("counters")
    root, changed = str(base / "images"), str(base / "changed")
    _messy(root)
    shutil.copytree(root, changed)
    with open(os.path.join(changed, "fish", "new.jpg"), "wb") as f:
        f.write(jpeg_bytes(photo(90, 70, seed=11)))
    with open(os.path.join(changed, "cat", "cat_0002.jpg"), "wb") as f:
        f.write(jpeg_bytes(photo(80, 60, seed=12)))
    return root, changed


def _run(capsys, root: str, output, *extra) -> dict[str, int]:
    """One run through the entry point; the counters its summary printed."""
    capsys.readouterr()
    argv = ["--input", root, "--output", str(output), "--quiet", "--max_reject_fraction", "0.5"]
    assert main([*argv, *extra]) == 0, capsys.readouterr().err
    return summary.read_counters(capsys.readouterr().out)


def _assert_agree(local: dict[str, int], beam: dict[str, int], engine: str) -> None:
    assert set(local) <= set(counters.MEANING) and set(beam) <= set(counters.MEANING)
    # Converting ahead happens on Beam's pooled path alone: some of the images it converted
    # or rejected.
    done = beam.get(counters.CONVERTED, 0) + beam.get(counters.REJECTED, 0)
    assert beam.get(counters.CONVERTED_AHEAD, 0) <= done
    ours = {k: v for k, v in local.items() if k not in counters.ENGINE_ONLY}
    theirs = {k: v for k, v in beam.items() if k not in counters.ENGINE_ONLY}
    assert ours == theirs, f"the local engine's counters differ from {engine}'s"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "extra", [(), ("--dedupe", "--min_shards", "3")], ids=["defaults", "dedupe"]
)
def test_every_counter_agrees_on_every_path(folders, tmp_path, capsys, extra):
    root, _ = folders
    local = _run(capsys, root, tmp_path / "local", *LOCAL, *extra)
    assert local[counters.LISTED] == 6 * 3 + 3  # 18 images, 2 bad files, 1 copy
    assert local[counters.REJECTED] == 2 and local[counters.SHARDS_WRITTEN] >= 2
    assert (counters.DROPPED_AS_DUPLICATES in local) == bool(extra)
    for name, flags in (("the pooled path", POOLED), ("the shuffle path", SHUFFLE)):
        out = tmp_path / name.split()[1]
        beam = _run(capsys, root, out, *flags, *extra)
        _assert_agree(local, beam, name)
        assert contract.all_files(str(out)) == contract.all_files(str(tmp_path / "local"))
        if flags == POOLED:  # the command line's pool, handed to the step, converted them all
            assert beam[counters.CONVERTED_AHEAD] == local[counters.LISTED]


@pytest.mark.e2e
def test_every_counter_agrees_with_reuse(folders, tmp_path, capsys):
    root, changed = folders
    old = str(tmp_path / "old")
    _run(capsys, root, old, *LOCAL)
    local = _run(capsys, changed, tmp_path / "local", *LOCAL, "--reuse", old)
    assert local[counters.CONVERTED] == 2 and local[counters.REUSED] == 6 * 3 + 1 - 1
    for name, flags in (("the pooled path", POOLED), ("the shuffle path", SHUFFLE)):
        out = tmp_path / name.split()[1]
        _assert_agree(local, _run(capsys, changed, out, *flags, "--reuse", old), name)
        assert contract.all_files(str(out)) == contract.all_files(str(tmp_path / "local"))


@pytest.mark.e2e
def test_every_counter_agrees_when_resuming(folders, tmp_path, capsys, monkeypatch):
    """An interrupted local run resumed by each engine (the shuffle path keeps no spill
    files, so it starts over: not compared here)."""
    from beam_pipeline.stages import finalize

    root, _ = folders
    resumed = {}
    for name, flags in (("local", LOCAL), ("pooled", POOLED)):
        out = tmp_path / name
        with monkeypatch.context() as patch:

            def crash(self, *args):
                raise KeyboardInterrupt  # every image converted, nothing published

            patch.setattr(finalize.Finalizer, "run", crash)
            assert main(["--input", root, "--output", str(out), "--quiet", *LOCAL]) == 130
        resumed[name] = _run(capsys, root, out, *flags)
    assert resumed["local"][counters.RESUMED] == resumed["local"][counters.LISTED]
    assert counters.CONVERTED not in resumed["local"]
    _assert_agree(resumed["local"], resumed["pooled"], "the pooled path")
    assert contract.all_files(str(tmp_path / "pooled")) == contract.all_files(
        str(tmp_path / "local")
    )


# imagerecords.json's field of the same name (docs/format.md), not the counter.
_FORMAT_FIELDS = {
    ("features/reuse/feature.py", counters.REUSED),
    ("cli/summary.py", counters.REUSED),
}


def test_no_module_but_the_table_spells_a_counters_name():
    package = Path(__file__).resolve().parent.parent / "beam_pipeline"
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where == "core/counters.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in counters.MEANING:
                if (where, node.value) not in _FORMAT_FIELDS:
                    found.append(f"{where}:{node.lineno} {node.value!r}")
    assert not found, "counter names belong in core/counters.py"


def test_a_pool_crosses_beams_pickling_as_a_handle_to_itself():
    """The pooled path's conversion step gets the command line's pool as an argument;
    Beam pickles the step, and the in-memory runner unpickles it in this process."""
    from beam_pipeline.engines import local_pool

    pool = local_pool.start(1)
    try:
        assert isinstance(pool, local_pool.Pool)
        pickled = pickle.dumps(pool)
        assert pickle.loads(pickled) is pool
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # another process finds no pool: its step forks its own
            os.write(write, b"none" if pickle.loads(pickled) is None else b"some")
            os._exit(0)
        os.waitpid(child, 0)
        assert os.read(read, 4) == b"none"
    finally:
        local_pool.shutdown_all()


def test_the_summarys_counters_line_reads_back():
    printed = "total 60\n" + summary.COUNTERS_PREFIX + "bytes_read=288368, images_listed=63\n"
    assert summary.read_counters(printed) == {"bytes_read": 288368, "images_listed": 63}
    assert summary.read_counters("a run that printed no counters\n") == {}
