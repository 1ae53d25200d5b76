"""The fuzz test's child: mutates a dataset's metadata and runs every reader on each mutation.

``python -m tests.fuzz_readers PRISTINE WORK OUTSIDE SEED COUNT`` copies the
dataset PRISTINE to WORK/ds once per mutation, mutates its metadata (JSON
values, types, numbers, nesting, names, templates, ``.idx`` lines, special
files; drawn from ``random.Random(SEED)``), then runs RecordSource,
``reader.make_dataset`` (one batch), ``reader.inspect --verify`` and the
``--reuse`` scan on it. Per mutation and reader it prints ``start N READER``,
then ``done N READER MAXRSS_KB OUTCOME`` (or ``bad N READER ...`` and the
traceback, for an error of any other type), flushed: the test watches these
lines for hangs. OUTSIDE holds the sentinel files the mutations point at.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import resource
import shutil
import stat
import subprocess
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INFO = "imagerecords.json"
JSON_FILES = (INFO, "dataset_info.json", "features.json")
DEEP = 100_000


def make_dataset(base: Path) -> Path:
    """A converted dataset of two splits, two shards each, with ``.idx`` files (12 images)."""
    from tests.image_factory import make_class_folders

    images = base / "images"
    make_class_folders(str(images), classes=("cat", "dog"), per_class=6, size_range=(20, 40))
    out = base / "ds"
    subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "--input", str(images), "--output", str(out)]
        + ["--image_size", "16", "--min_shards", "2", "--splits", "train=0.5,val=0.5"]
        + ["--index_files", "--quiet"],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    return out


def make_sentinels(outside: Path, dataset: Path) -> None:
    """The files outside the dataset that the mutations name: a shard, an index, a
    metadata file's copy, and a FIFO nothing writes to (opening it to read blocks)."""
    outside.mkdir(parents=True)
    shard = sorted(dataset.glob("*.tfrecord"))[0]
    shutil.copy(shard, outside / "sentinel.tfrecord")
    shutil.copy(shard.with_name(shard.name + ".idx"), outside / "sentinel.idx")
    shutil.copy(dataset / INFO, outside / "sentinel.json")
    os.mkfifo(outside / "sentinel.fifo")


def _nodes(value, path=()):
    """Every (path, value) of a parsed JSON document, the root included."""
    yield path, value
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in children:
        yield from _nodes(child, path + (key,))


def _set(doc, path, value):
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _delete(doc, path):
    node = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]


def hostile_values(outside: Path) -> list:
    """Values a hostile dataset puts where metadata has a name, a number or a block."""
    names = [
        "../outside/sentinel.tfrecord",
        "../outside/sentinel.fifo",
        "a/../../outside/sentinel.idx",
        str(outside / "sentinel.tfrecord"),
        str(outside / "sentinel.fifo"),
        str(outside / "sentinel.json"),
        "/dev/zero",
        "/dev/null",
        "gs://other-bucket/x.tfrecord",
        "file:///etc/passwd",
        "link-out/sentinel.tfrecord",
        "",
        ".",
        "..",
        "sub/",
        "x\x00y",
        "\x1b[2J",
        "C:\\x",
        "a" * 5000,
    ]
    templates = [
        "{SPLIT:>3000000000}",
        "{SPLIT:>30}",
        "{SPLIT!r}",
        "{SPLIT[0]}",
        "{0}",
        "{",
        "}",
        "{DATASET}" * 200,
        "{SPLIT.__class__}",
        "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}",
        "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
    ]
    numbers = [0, -1, 1, 3, 2**31, 2**62, 2**63, 2**64, 2**70, 10**30, 1.5, 257.9, 1e308]
    numbers += [float("nan"), float("inf"), True, False, "257", "4", "-1", "9" * 5000]
    shapes = [None, [], {}, [1], {"a": 1}, [[1]], "x", "x" * 100_000, {"file": "../x"}]
    return names + templates + numbers + shapes


def _deep(kind: str) -> str:
    return ("[" * DEEP + "]" * DEEP) if kind == "list" else ('{"a":' * DEEP + "1" + "}" * DEEP)


def mutate(ds: Path, outside: Path, rng: random.Random) -> str:
    """Applies 1-3 random mutations to the dataset at ``ds``; returns what was done."""
    done = []
    values = hostile_values(outside)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.choices(
            ("value", "shard", "delete", "wrap", "deep", "file", "idx", "template"),
            weights=(25, 25, 6, 8, 4, 12, 10, 10),
        )[0]
        if kind == "file":
            done.append(_mutate_file(ds, outside, rng))
            continue
        if kind == "idx":
            done.append(_mutate_idx(ds, rng))
            continue
        name = {"template": "dataset_info.json", "shard": INFO}.get(kind) or rng.choice(JSON_FILES)
        if not _plain(ds / name):
            continue  # an earlier mutation made it a link, a FIFO or a folder
        text = (ds / name).read_text()
        if text.lstrip()[:1] not in ("{", "["):
            continue
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            continue  # an earlier mutation of this case made it unreadable
        nodes = [p for p, _ in _nodes(doc) if p]
        if kind == "shard":  # a name or number of a shard row: what readers open and allocate by
            fields = ("file", "index", "num_examples", "num_bytes", "sha256")
            paths = [p for p in nodes if p[-1] in fields and "shards" in p] or nodes
            path = rng.choice(paths)
            _set(doc, path, rng.choice(values))
        elif kind == "template":
            paths = [p for p in nodes if p[-1] == "filepathTemplate"] or nodes
            path = rng.choice(paths)
            _set(doc, path, rng.choice(values[19:30]))
        elif kind == "deep":
            path = rng.choice(nodes)
            _set(doc, path, "DEEP-MARK")
        else:
            path = rng.choice(nodes)
            if kind == "delete":
                _delete(doc, path)
            elif kind == "wrap":
                node = doc
                for key in path:
                    node = node[key]
                _set(doc, path, rng.choice(([node], {"v": node}, str(node), json.dumps(node))))
            else:
                _set(doc, path, rng.choice(values))
        text = json.dumps(doc)
        if kind == "deep":
            text = text.replace('"DEEP-MARK"', _deep(rng.choice(("list", "dict"))))
        (ds / name).write_text(text)
        done.append(f"{kind} {name}:{'/'.join(map(str, path))}")
    return "; ".join(done) or "none"


def _plain(path: Path) -> bool:
    """A regular file, not a link: what the mutator itself may read without opening the outside."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _mutate_file(ds: Path, outside: Path, rng: random.Random) -> str:
    """A published file replaced by a link out, a FIFO, a folder or a device link."""
    files = sorted(p.name for p in ds.iterdir() if _plain(p))
    target = ds / rng.choice(files)
    how = rng.choice(("link-out", "link-fifo", "fifo", "folder", "dev-zero", "link-dir"))
    target.unlink()
    if how == "link-out":
        target.symlink_to(outside / rng.choice(("sentinel.tfrecord", "sentinel.json")))
    elif how == "link-fifo":
        target.symlink_to(outside / "sentinel.fifo")
    elif how == "fifo":
        os.mkfifo(target)
    elif how == "folder":
        target.mkdir()
    elif how == "dev-zero":
        target.symlink_to("/dev/zero")
    else:
        (ds / "link-out").symlink_to(outside)
        target.symlink_to(Path("link-out") / "sentinel.tfrecord")
    return f"file {target.name}->{how}"


def _mutate_idx(ds: Path, rng: random.Random) -> str:
    indexes = sorted(p for p in ds.glob("*.idx") if _plain(p))
    if not indexes:
        return "idx none"
    target = rng.choice(indexes)
    lines = target.read_bytes().splitlines()
    line = rng.randrange(len(lines))
    lines[line] = rng.choice(
        (b"9" * 5000 + b" 100", b"0 " + str(2**70).encode(), b"-1 100", b"0", b"0 1_000")
        + (b"", b"0 16 16", b"\xff\xfe", b"00000000000000000000 20", lines[line] * 3)
    )
    target.write_bytes(b"\n".join(lines) + b"\n")
    return f"idx {target.name}:{line}"


def _source(ds: Path):
    from imagerecords import RecordSource

    source = RecordSource(str(ds), "train")
    if len(source):
        source[0]
        source.__getitems__(list(range(min(3, len(source)))))
    source.close()
    return f"{len(source)} records"


_BUILT: dict[str, str] = {}


def _dataset(ds: Path):
    """``make_dataset`` and one batch; its outcome kept per accepted metadata.

    Every mutation is read by ``load_info`` (what ``make_dataset`` reads
    first). Once accepted, the pipeline is a function of what it read (the
    split's shards, counts, classes and image settings: all in the key) and
    of the shards' bytes (a mutation that replaces a shard is refused by
    ``load_info``), so a key seen before has that outcome again: this saves
    TensorFlow's half a second of tracing per build.
    """
    import reader

    info = reader.load_info(str(ds))
    key = repr((info.classes, info.image, info.split("train"), info.format_version))
    if key not in _BUILT:
        batches = reader.make_dataset(info, "train", batch_size=2, image_size=16, training=False)
        images, _ = next(iter(batches))
        _BUILT[key] = f"batch {tuple(images.shape)}"
    return _BUILT[key]


def _verify(ds: Path):
    from reader import inspect

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = inspect.main([str(ds), "--verify", "--workers", "2"])
    return f"status {status}"


def _reuse(ds: Path):
    from beam_pipeline.core import images
    from beam_pipeline.features.near.feature import PIXELS
    from beam_pipeline.features.reuse import scan as reuse_scan
    from beam_pipeline.features.reuse import stage as reuse

    old = reuse.open_old(str(ds), images.ImageSpec(pixels=PIXELS))
    index = reuse_scan.build_index(old.shards)
    found = len(index)
    index.close()
    return f"{found} records"


READERS = {"source": _source, "dataset": _dataset, "verify": _verify, "reuse": _reuse}


def allowed_errors(reader: str) -> tuple[type[BaseException], ...]:
    """What each reader may raise for a dataset it cannot read: its one-line errors."""
    from imagerecords import DatasetError

    if reader == "reuse":
        from beam_pipeline.core.errors import OldDatasetChanged, UsageError

        return (DatasetError, UsageError, OldDatasetChanged)
    return (DatasetError,)


def run_one(reader: str, ds: Path) -> tuple[bool, str]:
    """``(clean, outcome)`` of one reader on the dataset at ``ds``."""
    try:
        return True, READERS[reader](ds)
    except allowed_errors(reader) as error:
        text = str(error)
        return "\n" not in text.strip(), f"{type(error).__name__}"
    except Exception as error:
        if reader == "dataset" and _is_named_read_error(error, ds):
            return True, f"{type(error).__name__} naming a shard"
        return False, f"{type(error).__name__}: {str(error)[:300]!r}\n{traceback.format_exc()}"


def _is_named_read_error(error: Exception, ds: Path) -> bool:
    """A tf.data read error of a shard of the dataset (reader/counting.py: it names the file)."""
    import tensorflow as tf

    return isinstance(error, tf.errors.OpError) and str(ds) in error.message


def main(argv: list[str]) -> int:
    pristine, work, outside = Path(argv[0]), Path(argv[1]), Path(argv[2])
    seed, count = int(argv[3]), int(argv[4])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    ds = work / "ds"
    for reader in READERS:  # warm up (imports, TensorFlow's first graph) on the clean dataset
        shutil.rmtree(ds, ignore_errors=True)
        shutil.copytree(pristine, ds)
        clean, outcome = run_one(reader, ds)
        print(f"warm {reader} {clean} {outcome.splitlines()[0]}", flush=True)
    # What the readers hold once warm (TensorFlow alone is 0.6-1.6 GB, by its build and
    # oneDNN): the parent holds each mutation to its growth past this.
    print(f"baseline {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)
    rng = random.Random(seed)
    for number in range(count):
        shutil.rmtree(ds, ignore_errors=True)
        shutil.copytree(pristine, ds, symlinks=True)
        what = mutate(ds, outside, random.Random(rng.getrandbits(64)))
        print(f"case {number} {what!r}", flush=True)
        for reader in READERS:
            print(f"start {number} {reader}", flush=True)
            clean, outcome = run_one(reader, ds)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            word = "done" if clean else "bad"
            print(f"{word} {number} {reader} {rss} {outcome}", flush=True)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
