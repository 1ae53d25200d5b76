"""The local engine (no Beam) writes what Beam's DirectRunner writes, byte for byte.

Each case runs the same arguments twice through the real entry point: once
with no Beam flag (the local engine) and once with ``--runner DirectRunner``
(Beam), and compares every output file. The inputs are messy on purpose:
bad images, files that are not images, hidden files, symlinks, nested
folders, identical files across classes and splits.
"""

import os
import subprocess
import sys

import pytest
from PIL import Image

from beam_pipeline.__main__ import main
from beam_pipeline.cli import summary
from beam_pipeline.engines import choice, local_engine, pooled
from beam_pipeline.storage import discovery, listing
from tests import contract
from tests.image_factory import add_bad_files, jpeg_bytes, make_class_folders, photo

BEAM = ("--runner", "DirectRunner")


def _messy_folder(root: str) -> dict[str, str]:
    """Class folders with every kind of input the listing and conversion must handle."""
    make_class_folders(root, per_class=12, seed=3)
    bad = add_bad_files(root)
    cat, dog = os.path.join(root, "cat"), os.path.join(root, "dog")
    with open(os.path.join(cat, "cat_0001.jpg"), "rb") as f:
        first = f.read()
    for copy in ("dog/copy of cat [1].jpg", "fish/copy*2?.jpg"):  # identical bytes
        with open(os.path.join(root, copy), "wb") as f:
            f.write(first)
    Image.new("RGBA", (90, 60), (10, 200, 30, 128)).save(os.path.join(dog, "alpha.png"))
    Image.new("L", (70, 50), 128).save(os.path.join(dog, "grey.gif"))
    with open(os.path.join(dog, "progressive.jpeg"), "wb") as f:
        f.write(jpeg_bytes(photo(150, 100, seed=9), progressive=True))
    with open(os.path.join(dog, "README.txt"), "w") as f:
        f.write("skipped: not an image by its extension\n")
    with open(os.path.join(dog, ".hidden.jpg"), "wb") as f:
        f.write(first)
    os.makedirs(os.path.join(dog, ".thumbs"))
    with open(os.path.join(dog, ".thumbs", "t.jpg"), "wb") as f:
        f.write(first)
    os.symlink(os.path.join(cat, "cat_0002.jpg"), os.path.join(dog, "linked.jpg"))
    os.symlink(os.path.join(root, "nowhere.jpg"), os.path.join(dog, "broken.jpg"))
    os.symlink(cat, os.path.join(dog, "linked_folder"))  # not followed (Beam does not)
    with open(os.path.join(root, "loose.jpg"), "wb") as f:  # outside any class folder
        f.write(first)
    return bad


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("engine") / "images")
    bad = _messy_folder(root)
    return root, bad


def _run_both(root: str, base, *extra) -> tuple[str, str]:
    local, beam = str(base / "local"), str(base / "beam")
    common = ["--input", root, "--quiet", "--max_reject_fraction", "0.5", *extra]
    assert main([*common, "--output", local]) == 0
    assert main([*common, "--output", beam, *BEAM]) == 0
    return local, beam


@pytest.mark.e2e
@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("--dedupe", "--min_shards", "3", "--index_files"),
        ("--splits", "train=0.5,val=0.5", "--seed", "7", "--resize", "crop", "--image_size", "64"),
    ],
    ids=["defaults", "dedupe-shards-index", "splits-seed-crop"],
)
def test_the_local_engine_writes_what_beam_writes(messy, tmp_path, extra):
    root, bad = messy
    local, beam = _run_both(root, tmp_path, *extra)
    written = contract.all_files(local)
    assert written == contract.all_files(beam)
    rejected = {r["id"] for r in contract.read_rejects(local)}
    assert set(bad) <= rejected
    by_split = contract.check_output(local, root)
    ids = {i for rows in by_split.values() for i in contract.ids(rows)}
    assert "dog/linked.jpg" in ids | rejected  # a symlinked file is an image like any other
    assert not any("hidden" in i or ".thumbs" in i or "linked_folder" in i for i in ids)
    assert "skipped.jsonl" in written and b"README.txt" in written["skipped.jsonl"]


@pytest.mark.e2e
def test_a_presplit_folder_and_one_process(tmp_path):
    root = str(tmp_path / "images")
    for split in ("train", "validation"):
        make_class_folders(os.path.join(root, split), per_class=5, seed=len(split))
    local, beam = _run_both(root, tmp_path, "--local_processes", "1")
    assert contract.all_files(local) == contract.all_files(beam)
    assert set(contract.load_info(local)["splits"]) == {"train", "validation"}


@pytest.mark.e2e
def test_a_plain_run_does_not_import_beam(messy, tmp_path):
    root, _ = messy
    code = (
        "import sys\n"
        "from beam_pipeline.__main__ import main\n"
        f"status = main(['--input', {root!r}, '--output', {str(tmp_path / 'o')!r},"
        " '--max_reject_fraction', '0.5'])\n"
        "assert status == 0, status\n"
        "print('beam imported:', any(m.split('.')[0] == 'apache_beam' for m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "beam imported: False" in done.stdout
    assert "running on the local engine" in done.stderr
    assert "images_converted=" in done.stdout  # the summary's counters, as on Beam


def test_which_engine_runs(messy, tmp_path):
    root, _ = messy
    layout = discovery.discover(root)
    out = str(tmp_path / "o")
    assert choice.choose_engine([], layout, out) == choice.LOCAL_ENGINE
    for beam_flags in (["--runner", "DirectRunner"], ["--direct_running_mode=in_memory"]):
        assert choice.choose_engine(beam_flags, layout, out) == choice.BEAM
    assert choice.choose_engine([], layout, "gs://bucket/out") == choice.BEAM
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label\ncat/cat_0000.jpg,cat\n")
    local_manifest = discovery.discover(root, str(manifest))
    assert choice.choose_engine([], local_manifest, out) == choice.LOCAL_ENGINE
    assert choice.choose_engine([], local_manifest, "gs://bucket/out") == choice.BEAM
    manifest.write_text("path,label\ncat/cat_0000.jpg,cat\ngs://bucket/dog/1.jpg,dog\n")
    assert choice.choose_engine([], discovery.discover(root, str(manifest)), out) == choice.BEAM


@pytest.mark.e2e
def test_a_manifest_of_local_files_runs_locally_and_writes_what_beam_writes(messy, tmp_path):
    root, bad = messy
    manifest = tmp_path / "images.jsonl"
    rows = [
        '{"path": "cat/cat_0004.jpg", "label": "cat", "split": "val"}',
        '{"path": "dog/copy of cat [1].jpg", "label": "dog"}',
        '{"path": "dog/linked.jpg", "label": "dog"}',
        '{"path": "cat/not there.jpg", "label": "cat"}',  # listed, never readable
        f'{{"path": "{os.path.join(root, "dog", "alpha.png")}", "label": "dog"}}',  # absolute
        *(f'{{"path": "{b}", "label": "fish"}}' for b in sorted(bad)[:3]),
        *(f'{{"path": "cat/cat_{i:04d}.jpg", "label": "cat"}}' for i in (1, 2, 5, 7, 8, 10, 11)),
        '{"path": "cat/batch1/cat_0003.jpg", "label": "cat", "split": "val"}',
    ]
    manifest.write_text("\n".join(rows) + "\n")
    assert (
        choice.choose_engine([], discovery.discover(root, str(manifest)), "out")
        == choice.LOCAL_ENGINE
    )
    local, beam = _run_both(root, tmp_path, "--manifest", str(manifest), "--seed", "5")
    written = contract.all_files(local)
    assert written == contract.all_files(beam)
    rejected = {r["id"] for r in contract.read_rejects(local)}
    assert "cat/not there.jpg" in rejected
    by_split = contract.check_output(local, root)
    ids = {i for rows in by_split.values() for i in contract.ids(rows)}
    assert len(ids | rejected) == len(rows)
    assert rejected == {"cat/not there.jpg", *sorted(bad)[:3]}
    assert {"cat/cat_0004.jpg", "cat/batch1/cat_0003.jpg"} <= set(contract.ids(by_split["val"]))


def test_a_lost_record_fails_the_books_and_names_it(messy, tmp_path, capsys, monkeypatch):
    root, _ = messy
    victim = "cat/cat_0005.jpg"
    original = pooled.PoolConverter.add

    def lossy(self, ref, old=None):
        if ref[0] != victim:
            yield from original(self, ref, old)

    monkeypatch.setattr(pooled.PoolConverter, "add", lossy)
    argv = ["--input", root, "--output", str(tmp_path / "o"), "--max_reject_fraction", "0.5"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "books do not balance" in err and victim in err
    assert not (tmp_path / "o" / "imagerecords.json").exists()


def test_a_doubled_record_fails_the_books(messy, tmp_path, capsys, monkeypatch):
    root, _ = messy
    victim = "dog/dog_0004.jpg"
    original = local_engine._convert

    def doubling(*args):
        batches, rejects = original(*args)
        doubled = [
            b._replace(entries=b.entries + tuple(e for e in b.entries if e.image_id == victim))
            for b in batches
        ]
        return doubled, rejects

    monkeypatch.setattr(local_engine, "_convert", doubling)
    argv = ["--input", root, "--output", str(tmp_path / "o"), "--max_reject_fraction", "0.5"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"doubled (2 records, 0 rejections): {victim}" in err
    assert not (tmp_path / "o" / "imagerecords.json").exists()


def test_the_listing_matches_beams_on_odd_names(tmp_path):
    """Local folders are walked without Beam; the files found are the ones Beam's match finds."""
    from apache_beam.io.filesystems import FileSystems

    folder = tmp_path / "cls [1]*?"
    for rel in ("a.jpg", "sub/b c.jpg", "sub/deeper/ü.png", ".h/x.jpg", "[x].jpg"):
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * len(rel))
    os.symlink(folder / "a.jpg", folder / "sub" / "link.jpg")
    os.symlink(tmp_path / "missing", folder / "broken.jpg")
    os.symlink(folder / "sub", folder / "linked_sub")
    sibling = tmp_path / "cls [1]*?x"  # what the escaped pattern also matches
    sibling.mkdir()
    (sibling / "other.jpg").write_bytes(b"o")
    ours = sorted(listing.sized_files_under(str(folder)))
    prefix = str(folder)
    pattern = "".join("?" if c in "*?[" else c for c in prefix) + "/**"
    found = FileSystems.match([pattern])[0].metadata_list
    beams = sorted((m.path, m.size_in_bytes) for m in found if m.path.startswith(prefix + "/"))
    assert ours == beams
    assert len(ours) == 6  # 5 files + the symlinked file; not the broken link, not linked_sub


@pytest.mark.e2e
def test_an_interrupted_local_run_resumes_on_beam_with_the_same_bytes(
    messy, tmp_path, capsys, monkeypatch
):
    """Spill files are one format: what a local run converted, a Beam run resumes from."""
    from beam_pipeline.stages import finalize

    root, _ = messy
    common = ["--input", root, "--max_reject_fraction", "0.5"]
    reference = tmp_path / "reference"
    assert main([*common, "--quiet", "--output", str(reference)]) == 0

    def crash(self, *args):
        raise KeyboardInterrupt  # after every image is converted, before anything is published

    out = tmp_path / "o"
    with monkeypatch.context() as patch:
        patch.setattr(finalize.Finalizer, "run", crash)
        assert main([*common, "--output", str(out)]) == 130
    assert not (out / "imagerecords.json").exists()
    capsys.readouterr()
    assert main([*common, "--output", str(out), *BEAM]) == 0
    captured = capsys.readouterr()
    assert "resuming the unfinished run" in captured.err
    counted = summary.read_counters(captured.out)
    listed = counted["images_listed"]
    assert counted["images_resumed"] == listed and "images_converted" not in counted
    assert contract.all_files(str(out)) == contract.all_files(str(reference))
