"""End to end through the command line on generated image folders."""

import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import keys
from imagerecords import codec
from tests import contract
from tests.image_factory import add_bad_files, make_class_folders

IN_MEMORY = "--direct_running_mode=in_memory"


def convert(input_root, output, *extra, mode=IN_MEMORY):
    argv = ["--input", str(input_root), "--output", str(output), "--quiet", *extra]
    if mode:
        argv.append(mode)
    return main(argv)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """60 images in 3 classes (some nested) + a corrupt and a non-image file."""
    base = tmp_path_factory.mktemp("cli")
    root = base / "images"
    ids = make_class_folders(str(root), per_class=20)
    bad = add_bad_files(str(root))
    out = base / "out"
    assert convert(root, out, "--max_reject_fraction", "0.1") == 0
    return root, out, ids, bad


@pytest.mark.e2e
def test_every_input_is_exactly_once_a_record_or_a_rejection(dataset):
    root, out, ids, bad = dataset
    by_split = contract.check_output(str(out), str(root))
    written = [i for rows in by_split.values() for i in contract.ids(rows)]
    rejected = [r["id"] for r in contract.read_rejects(str(out))]
    assert sorted(written + rejected) == sorted(ids + list(bad))
    assert len(set(written)) == len(written)
    assert sorted(written) == sorted(ids)


def test_rejections_carry_reasons(dataset):
    root, out, _, bad = dataset
    rejects = {r["id"]: r for r in contract.read_rejects(str(out))}
    assert set(rejects) == set(bad)
    for image_id, reason in bad.items():
        assert rejects[image_id]["reason"].startswith(reason)
        assert rejects[image_id]["path"] == os.path.join(str(root), image_id)
    info = contract.load_info(str(out))
    assert info["rejected"]["count"] == len(bad)


def test_labels_follow_sorted_class_folders(dataset):
    root, out, _, _ = dataset
    info = contract.load_info(str(out))
    assert info["classes"] == sorted(os.listdir(root))
    for rows in contract.check_output(str(out), decode=False).values():
        for row in rows:
            folder = row["image/filename"].decode().split("/")[0]
            assert info["classes"][row["image/class/label"]] == folder


def test_splits_follow_the_hash_and_order_is_the_seeded_shuffle(dataset):
    root, out, ids, _ = dataset
    fractions = keys.parse_splits(keys.DEFAULT_SPLITS)
    for split, rows in contract.check_output(str(out), decode=False).items():
        got = contract.ids(rows)
        assert all(keys.assign_split(42, i, fractions) == split for i in got)
        order = [keys.order_key(42, i) for i in got]
        assert order == sorted(order)
    train = contract.ids(contract.check_output(str(out), decode=False)["train"])
    assert train != sorted(train), "records are in listing order, not shuffled"


def test_metadata_describes_the_run(dataset):
    _, out, _, _ = dataset
    info = contract.load_info(str(out))
    assert info["seed"] == 42
    assert info["image"]["resize"] == "shorter" and info["image"]["size"] == 256
    assert set(info["splits"]) == {"train", "val", "test"}
    assert set(info["features"]) >= {"image/encoded", "image/class/label", "image/key/sha256"}
    assert not [n for n in os.listdir(out) if n.startswith(".") or "tmp" in n]


@pytest.mark.e2e
def test_rerun_with_default_local_mode_is_byte_identical(dataset, tmp_path):
    root, out, _, _ = dataset
    # Through the real entry point, with the CLI's own DirectRunner default (a
    # process per core); without --runner the local engine runs (test_local_engine.py).
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "beam_pipeline",
            "--input",
            str(root),
            "--output",
            str(tmp_path / "o"),
            "--max_reject_fraction",
            "0.1",
            "--runner",
            "DirectRunner",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"in_memory, {os.cpu_count()} conversion processes" in result.stderr
    assert "images/s" in result.stdout and "train" in result.stdout
    if (os.cpu_count() or 1) > 1:  # one core: no pool, nothing converted ahead
        # Images converted while Beam loaded went into the same records, byte for byte.
        assert "images_converted_ahead=62" in result.stdout
    assert contract.all_files(str(tmp_path / "o")) == contract.all_files(str(out))


@pytest.mark.e2e
def test_rerun_in_multi_processing_mode_is_byte_identical(dataset, tmp_path):
    root, out, _, _ = dataset
    mode = "--direct_running_mode=multi_processing"
    assert convert(root, tmp_path / "o", "--max_reject_fraction", "0.1", mode=mode) == 0
    assert contract.all_files(str(tmp_path / "o")) == contract.all_files(str(out))


_CRASH_ON = None


_REAL_DECODE = None


def _crashing_decode(path, *args):
    if path.endswith(_CRASH_ON):
        os._exit(139)  # dies like a segfault: no exception, no clean-up
    return _REAL_DECODE(path, *args)


@pytest.mark.e2e
@pytest.mark.parametrize("ahead", [0, 1024], ids=["in-pipeline", "converted-ahead"])
def test_a_crashing_decoder_costs_one_image_not_the_job(dataset, tmp_path, monkeypatch, ahead):
    """A worker process that dies (as on a decoder segfault) rejects that image only."""
    from beam_pipeline.cli import job
    from beam_pipeline.stages import convert as convert_module

    monkeypatch.setattr(job, "CONVERT_AHEAD_LIMIT", ahead)

    root, out, ids, bad = dataset
    victim = sorted(ids)[3]
    monkeypatch.setattr(sys.modules[__name__], "_CRASH_ON", victim)
    monkeypatch.setattr(sys.modules[__name__], "_REAL_DECODE", convert_module.decode_path)
    monkeypatch.setattr(convert_module, "decode_path", _crashing_decode)
    assert (
        convert(root, tmp_path / "o", "--local_processes", "2", "--max_reject_fraction", "0.1") == 0
    )
    rejects = {r["id"]: r["reason"] for r in contract.read_rejects(str(tmp_path / "o"))}
    assert set(rejects) == set(bad) | {victim}
    assert "crashed" in rejects[victim]
    written = [
        i
        for rows in contract.check_output(str(tmp_path / "o")).values()
        for i in contract.ids(rows)
    ]
    assert sorted(written) == sorted(set(ids) - {victim})


@pytest.mark.e2e
def test_adding_images_moves_no_image_to_another_split(dataset, tmp_path):
    root, out, ids, _ = dataset
    grown = tmp_path / "grown"
    shutil.copytree(root, grown)
    make_class_folders(
        str(grown), classes=("cat", "dog", "fish"), per_class=30, seed=9, nested=False
    )
    make_class_folders(
        str(grown), classes=("cat",), per_class=30, seed=10, nested=False
    )  # overwrite some
    assert convert(grown, tmp_path / "o", "--max_reject_fraction", "0.1") == 0

    def split_of(folder):
        return {
            i: split
            for split, rows in contract.check_output(str(folder), decode=False).items()
            for i in contract.ids(rows)
        }

    before, after = split_of(out), split_of(tmp_path / "o")
    assert len(after) > len(before)
    assert all(after[i] == split for i, split in before.items())


@pytest.mark.e2e
def test_small_target_shard_size_gives_expected_shard_count(dataset, tmp_path):
    root, _, _, _ = dataset
    assert (
        convert(root, tmp_path / "o", "--target_shard_mb", "0.05", "--max_reject_fraction", "0.1")
        == 0
    )
    info = contract.load_info(str(tmp_path / "o"))
    by_split = contract.check_output(str(tmp_path / "o"), decode=False)
    train = info["splits"]["train"]
    expected = math.ceil(train["num_bytes"] / int(0.05 * 2**20))
    assert expected >= 3
    assert len(train["shards"]) == expected  # exactly: no hash range left empty
    sizes = [s["num_examples"] for s in train["shards"]]
    assert min(sizes) > 0 and max(sizes) - min(sizes) <= 1
    order = [keys.order_key(42, i) for i in contract.ids(by_split["train"])]
    assert order == sorted(order)  # shard i holds the i-th run of keys


@pytest.mark.e2e
def test_min_shards_is_exact(dataset, tmp_path):
    root, _, _, _ = dataset
    assert convert(root, tmp_path / "o", "--min_shards", "8", "--max_reject_fraction", "0.1") == 0
    info = contract.load_info(str(tmp_path / "o"))
    for split, entry in contract.check_output(str(tmp_path / "o"), decode=False).items():
        # max(min_shards, ceil(bytes/target)), capped only by the records of the split
        assert len(info["splits"][split]["shards"]) == min(8, len(entry)), split
        order = [keys.order_key(42, i) for i in contract.ids(entry)]
        assert order == sorted(order)


@pytest.mark.e2e
def test_other_seed_other_order(dataset, tmp_path):
    root, out, _, _ = dataset
    assert convert(root, tmp_path / "o", "--seed", "7", "--max_reject_fraction", "0.1") == 0
    a = contract.ids(contract.check_output(str(out), decode=False)["train"])
    b = contract.ids(contract.check_output(str(tmp_path / "o"), decode=False)["train"])
    assert a != b


@pytest.mark.e2e
def test_too_many_rejections_fail_without_dataset_info(dataset, tmp_path, capsys):
    root, _, _, bad = dataset
    assert convert(root, tmp_path / "o", "--max_reject_fraction", "0.01") == 1
    err = capsys.readouterr().err
    assert "too many rejected images: 2 of 62" in err
    assert not (tmp_path / "o" / "imagerecords.json").exists()
    assert {r["id"] for r in contract.read_rejects(str(tmp_path / "o"))} == set(bad)


@pytest.mark.e2e
def test_lost_record_is_caught_by_the_books(dataset, tmp_path, capsys, monkeypatch):
    """Simulates a runner that drops a record: the job must fail and name it."""
    from beam_pipeline.engines import pipeline

    root, _, ids, _ = dataset
    victim = sorted(ids)[0]
    original = pipeline._ConvertFn.process

    def lossy(self, ref):
        if ref.image_id != victim:
            yield from original(self, ref)

    monkeypatch.setattr(pipeline._ConvertFn, "process", lossy)
    assert convert(root, tmp_path / "o", "--max_reject_fraction", "0.1") == 1
    err = capsys.readouterr().err
    assert "books do not balance" in err and victim in err
    assert not (tmp_path / "o" / "imagerecords.json").exists()


@pytest.mark.e2e
def test_doubled_record_is_caught_in_the_pooled_mode(dataset, tmp_path, capsys, monkeypatch):
    """The pooled step sends spill references; a doubled one still fails the books."""
    from beam_pipeline.core.elements import Converted, SpillLocation
    from beam_pipeline.engines import pipeline

    root, _, ids, _ = dataset
    victim = sorted(ids)[0]
    original = pipeline._PooledConvertFn._emit

    def doubling(self, outcome, how):
        result = outcome.result
        yield from original(self, outcome, how)
        if isinstance(result, Converted) and result.entry.image_id == victim:
            assert isinstance(result.entry.data, SpillLocation)  # only a reference travels
            yield from original(self, outcome, how)

    monkeypatch.setattr(pipeline._PooledConvertFn, "_emit", doubling)
    argv = ["--max_reject_fraction", "0.1", "--local_processes", "2", "--runner", "DirectRunner"]
    assert convert(root, tmp_path / "o", *argv, mode=None) == 1
    err = capsys.readouterr().err
    assert "books do not balance" in err and f"doubled (2 records, 0 rejections): {victim}" in err
    assert not (tmp_path / "o" / "imagerecords.json").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input", "{tmp}/missing", "--output", "{tmp}/o"], "does not exist"),
        (["--input", "{tmp}/empty", "--output", "{tmp}/o"], "no class folders"),
        (["--input", "{tmp}/noimages", "--output", "{tmp}/o"], "no image files"),
        (["--input", "{root}", "--output", "{tmp}/o", "--splits", "train=0.8,val=0.1"], "sum to 1"),
        (
            ["--input", "{root}", "--output", "{tmp}/o", "--resize", "stretch"],
            "--resize must be one of",
        ),
        (["--input", "{root}", "--output", "{tmp}/o", "--jpeg_quality", "0"], "--jpeg_quality"),
        (["--input", "{root}", "--output", "{tmp}/o", "--jpeg_quality", "101"], "--jpeg_quality"),
        (["--input", "{root}", "--output", "{out}"], "holds a finished dataset"),
        (["--input", "{root}", "--output", "{root}/cat/o"], "inside --input"),
        (
            ["--input", "{root}", "--output", "{tmp}/o", "--image-size", "3"],
            "did you mean --image_size",
        ),
        (["--input", "{root}", "--output", "{tmp}/o", "--image_size", "big"], "invalid int"),
        (["--output", "{tmp}/o"], "--input is required"),
        (["--input", "{root}"], "--output"),
        (
            ["--input", "{root}", "--output", "{tmp}/o", "--target_shard_mb", "0"],
            "--target_shard_mb",
        ),
        (
            ["--input", "{root}", "--output", "{tmp}/o", "--max_reject_fraction", "2"],
            "--max_reject_fraction",
        ),
        (["--manifest", "{tmp}/nope.csv", "--output", "{tmp}/o"], "does not exist"),
    ],
)
def test_bad_arguments_give_one_clear_message(dataset, tmp_path, capsys, args, message):
    root, out, _, _ = dataset
    (tmp_path / "empty").mkdir()
    (tmp_path / "noimages" / "cat").mkdir(parents=True)
    argv = [a.format(tmp=tmp_path, root=root, out=out) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err, err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists(), "work started despite bad arguments"


@pytest.mark.e2e
def test_overwrite_replaces_an_earlier_run(dataset, tmp_path):
    root, _, _, _ = dataset
    out = tmp_path / "o"
    assert convert(root, out, "--min_shards", "3", "--max_reject_fraction", "0.1") == 0
    (out / "notes.md").write_text("mine")
    # Not ours: the folder is refused (a dataset beside it would fail its --verify).
    assert convert(root, out, "--overwrite", "--max_reject_fraction", "0.1") == 2
    assert (out / "notes.md").read_text() == "mine"
    (out / "notes.md").unlink()
    assert convert(root, out, "--overwrite", "--max_reject_fraction", "0.1") == 0
    info = contract.load_info(str(out))
    assert len(info["splits"]["train"]["shards"]) == 1
    assert sorted(n for n in os.listdir(out) if n.startswith("train")) == [
        "train-00000-of-00001.tfrecord"
    ]


@pytest.mark.e2e
def test_presplit_layout_keeps_its_splits(tmp_path):
    root = tmp_path / "in"
    train = make_class_folders(str(root / "train"), classes=("a", "b"), per_class=6, nested=False)
    val = make_class_folders(
        str(root / "validation"), classes=("a", "b", "c"), per_class=3, seed=3, nested=False
    )
    assert convert(root, tmp_path / "o") == 0
    info = contract.load_info(str(tmp_path / "o"))
    assert info["classes"] == ["a", "b", "c"]
    by_split = contract.check_output(str(tmp_path / "o"), str(root))
    assert set(by_split) == {"train", "validation"}
    assert sorted(contract.ids(by_split["train"])) == sorted(f"train/{i}" for i in train)
    assert sorted(contract.ids(by_split["validation"])) == sorted(f"validation/{i}" for i in val)


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_manifest(tmp_path, kind):
    root = tmp_path / "pool"
    ids = make_class_folders(str(root), classes=("x", "y"), per_class=8, nested=False)
    rows = [
        (f"pool/{i}", "odd" if n % 2 else "even", "test" if n < 4 else "")
        for n, i in enumerate(ids)
    ]
    manifest = tmp_path / f"list.{kind}"
    if kind == "csv":
        with open(manifest, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "label", "split"])
            writer.writerows(rows)
    else:
        with open(manifest, "w") as f:
            for path, label, split in rows:
                f.write(
                    json.dumps(
                        {"path": path, "label": label, **({"split": split} if split else {})}
                    )
                    + "\n"
                )
    assert (
        main(["--manifest", str(manifest), "--output", str(tmp_path / "o"), "--quiet", IN_MEMORY])
        == 0
    )
    info = contract.load_info(str(tmp_path / "o"))
    assert info["classes"] == ["even", "odd"]
    by_split = contract.check_output(str(tmp_path / "o"), str(tmp_path))
    assert sorted(contract.ids(by_split["test"]))[:4] == sorted(r[0] for r in rows[:4])[:4]
    got = {
        i: r for rows_ in by_split.values() for r in rows_ for i in [r["image/filename"].decode()]
    }
    assert set(got) == {r[0] for r in rows}
    for path, label, _ in rows:
        assert info["classes"][got[path]["image/class/label"]] == label


@pytest.mark.e2e
def test_folder_names_with_wildcard_characters(tmp_path):
    """Class folders named like glob patterns list only their own files."""
    root = tmp_path / "in"
    ids = make_class_folders(str(root), classes=("a[1]", "a_1]", "b*", "c d"), per_class=3)
    assert main(["--input", str(root), "--output", str(tmp_path / "o"), "--quiet", IN_MEMORY]) == 0
    info = contract.load_info(str(tmp_path / "o"))
    by_split = contract.check_output(str(tmp_path / "o"), str(root))
    assert sorted(i for rows in by_split.values() for i in contract.ids(rows)) == sorted(ids)
    assert sum(info["splits"][s]["class_counts"]["a[1]"] for s in info["splits"]) == 3


@pytest.mark.e2e
def test_portable_runner_gives_the_same_bytes(dataset, tmp_path):
    """Any portable runner (here Beam's embedded job server) runs the same graph."""
    root, out, _, _ = dataset
    portable = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]
    assert convert(root, tmp_path / "o", "--max_reject_fraction", "0.1", *portable, mode=None) == 0
    assert contract.all_files(str(tmp_path / "o")) == contract.all_files(str(out))


@pytest.mark.e2e
def test_index_files_locate_every_record(dataset, tmp_path):
    """--index_files writes DALI-style 'offset length' lines that frame each record."""
    import reader

    root, _, _, _ = dataset
    assert convert(root, tmp_path / "o", "--index_files", "--max_reject_fraction", "0.1") == 0
    info = contract.load_info(str(tmp_path / "o"))
    for split in info["splits"].values():
        for shard in split["shards"]:
            assert shard["index"] == shard["file"] + ".idx"
            data = (tmp_path / "o" / shard["file"]).read_bytes()
            lines = (tmp_path / "o" / shard["index"]).read_text().splitlines()
            assert len(lines) == shard["num_examples"]
            end = 0
            for line in lines:
                offset, length = map(int, line.split())
                assert offset == end  # records are back to back
                (record,) = codec.iter_records(io.BytesIO(data[offset : offset + length]))
                assert len(record) == length - codec.FRAME_OVERHEAD
                end = offset + length
            assert end == len(data)
    # The reader ignores the extra files and keys.
    assert (
        reader.load_info(str(tmp_path / "o")).num_examples("train")
        == info["splits"]["train"]["num_examples"]
    )


def test_local_default_skips_construction_type_checks_unless_asked():
    from beam_pipeline.beam_internals.beam_options import check
    from beam_pipeline.engines.choice import with_local_defaults

    beam, _ = with_local_defaults(check([]), None)
    assert "--no_pipeline_type_check" in beam.args and IN_MEMORY in beam.args
    assert beam.direct_running_mode == "in_memory" and beam.get("pipeline_type_check") is False
    beam, _ = with_local_defaults(check(["--no_pipeline_type_check"]), None)
    assert beam.args.count("--no_pipeline_type_check") == 1
    beam, processes = with_local_defaults(check(["--runner=DataflowRunner"]), None)
    assert beam.args == ("--runner=DataflowRunner",) and processes == 1


@pytest.mark.parametrize(
    "requested, cpus, expected",
    [(1, 1, 1), (4, 1, 4), (5, 1, 4), (32, 8, 32), (33, 8, 32), (100000, 2, 8)],
)
def test_local_processes_beyond_four_per_core_are_capped(requested, cpus, expected):
    from beam_pipeline.cli.arguments import capped_processes

    processes, note = capped_processes(requested, cpus)
    assert processes == expected
    if requested == expected:
        assert note is None
    else:
        assert f"--local_processes {requested} is more than {expected}" in note
        assert note.endswith(f"running {expected}")


def test_too_many_local_processes_are_capped_with_one_line_and_the_run_finishes(tmp_path, capsys):
    from beam_pipeline.cli import arguments

    root = tmp_path / "in"
    ids = make_class_folders(str(root), classes=("a", "b"), per_class=3, nested=False)
    cap = arguments.MAX_PROCESSES_PER_CORE * (os.cpu_count() or 1)
    argv = ["--input", str(root), "--output", str(tmp_path / "o")]
    assert main([*argv, "--local_processes", str(cap + 1)]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"imagerecords: --local_processes {cap + 1} is more than {cap}")
    assert first.endswith(f"running {cap}")
    written = contract.check_output(str(tmp_path / "o"), str(root))
    assert sorted(i for rows in written.values() for i in contract.ids(rows)) == sorted(ids)


@pytest.mark.parametrize(
    "total, resumed, seconds, cpu, expected",
    [
        (
            100,
            0,
            10.0,
            None,
            "100 images read in 10.0 s wall time: 10.0 images/s (CPU time not measured: the "
            "work ran on the runner's workers)",
        ),
        (
            100,
            90,
            10.0,
            5.0,
            "10 images read in 10.0 s wall time: 1.0 images/s (90 more taken from the "
            "unfinished run, not counted), 0.5000 CPU-s/image (5.0 CPU-s in this process and "
            "its local worker processes)",
        ),
        (
            5,
            5,
            0.0,
            0.0,
            "0 images read in 0.0 s wall time: 0.0 images/s (5 more taken from the unfinished "
            "run, not counted), 0.0000 CPU-s/image (0.0 CPU-s in this process and its local "
            "worker processes)",
        ),
    ],
)
def test_the_summary_rate_counts_only_this_runs_images(total, resumed, seconds, cpu, expected):
    from beam_pipeline.cli import summary

    assert summary.rate_line(total, resumed, seconds, cpu) == expected
