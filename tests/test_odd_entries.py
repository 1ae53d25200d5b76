"""Odd entries under --input: each is converted, skipped with a reason, or refused
before work starts; none is dropped silently, opened when it is not a file, or
allowed to stop the job (docs/images.md, "What happens to each kind of entry").

The runs that could hang (a FIFO opened by a worker blocks forever) start the
CLI as a subprocess in its own session with a timeout, so that a regression
fails the test instead of stalling the suite. An unreadable folder needs a
process that the permission bits bind: tests run as root here (and in CI), so
those subprocesses drop the two capabilities that let root read any folder.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import keys
from beam_pipeline.core.errors import UsageError
from beam_pipeline.storage import discovery, listing, paths
from tests import contract
from tests.image_factory import jpeg_bytes, make_class_folders, photo

BEAM = ("--runner", "DirectRunner")
TIMEOUT_S = 300
_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def _bound_by_permissions() -> None:
    """preexec_fn: as root, drop the capabilities that ignore permission bits, so the
    program this child executes cannot read a chmod-000 folder (a no-op for others)."""
    if os.geteuid() != 0:
        return
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _can_lock_folders(tmp_path_factory) -> bool:
    """Whether a chmod-000 folder is unreadable to a child started with _bound_by_permissions."""
    folder = tmp_path_factory.mktemp("probe") / "locked"
    folder.mkdir()
    folder.chmod(0)
    try:
        probe = subprocess.run(
            [sys.executable, "-c", f"import os; os.listdir({str(folder)!r})"],
            preexec_fn=_bound_by_permissions,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        folder.chmod(0o755)
    return probe.returncode != 0 and b"PermissionError" in probe.stderr


@pytest.fixture(scope="module")
def can_lock(tmp_path_factory) -> bool:
    return _can_lock_folders(tmp_path_factory)


def _cli(*argv: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python -m beam_pipeline ARGV`` bound by permission bits, killed (with the
    conversion processes it forked) if it runs past ``timeout``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_bound_by_permissions,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"python -m beam_pipeline {' '.join(argv)} still ran after {timeout} s")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _write(path: bytes | str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _lock(folder: str) -> None:
    os.chmod(folder, 0)


def _skipped_rows(out) -> dict[str, str]:
    with open(os.path.join(out, "skipped.jsonl"), encoding="utf-8") as f:
        return {row["path"]: row["reason"] for row in map(json.loads, f)}


# ------------------------------------------------------------ one messy input


@pytest.fixture(scope="module")
def odd(tmp_path_factory, can_lock):
    """Class folders holding every kind of entry that is not a plain image file.

    Returns (root, the IDs that must become records, {skipped path: reason}).
    """
    base = tmp_path_factory.mktemp("odd")
    root = str(base / "in")
    ids = make_class_folders(root, per_class=5, size_range=(60, 120))
    image = jpeg_bytes(photo(64, 48, seed=5))
    unreadable = "folder cannot be read (Permission denied): the files in it are unknown"
    skipped = {}

    os.mkfifo(os.path.join(root, "cat", "x.jpg"))  # a worker that opens it blocks forever
    skipped[f"{root}/cat/x.jpg"] = "not a regular file (FIFO)"
    server = socket.socket(socket.AF_UNIX)
    server.bind(os.path.join(root, "cat", "s.sock"))
    server.close()
    skipped[f"{root}/cat/s.sock"] = "not a regular file (socket)"

    os.symlink(os.path.join(root, "nowhere.jpg"), os.path.join(root, "dog", "broken.jpg"))
    skipped[f"{root}/dog/broken.jpg"] = listing.BROKEN_SYMLINK
    os.symlink(os.path.join(root, "cat"), os.path.join(root, "dog", "linked_folder"))
    skipped[f"{root}/dog/linked_folder"] = listing.SYMLINKED_FOLDER
    outside = str(base / "outside.jpg")  # a file link out of --input is followed
    _write(outside, image)
    os.symlink(outside, os.path.join(root, "dog", "linked.jpg"))
    ids.append("dog/linked.jpg")

    fish = os.fsencode(os.path.join(root, "fish"))
    _write(os.path.join(fish, b"caf\xff.jpg"), image)  # Latin-1 bytes, not UTF-8
    skipped[f"{root}/fish/caf\\xff.jpg"] = listing.NOT_TEXT
    _write(os.path.join(fish, b"b\xe9d", b"img.jpg"), image)
    skipped[f"{root}/fish/b\\xe9d/img.jpg"] = listing.IN_NOT_TEXT_FOLDER

    if can_lock:
        _write(os.path.join(root, "cat", "locked", "in.jpg"), image)
        _lock(os.path.join(root, "cat", "locked"))
        skipped[f"{root}/cat/locked"] = unreadable
        _write(os.path.join(root, "locked_class", "in.jpg"), image)
        _lock(os.path.join(root, "locked_class"))
        skipped[f"{root}/locked_class"] = unreadable
    return root, ids, skipped


def _convert(root, out, *extra):
    argv = ["--input", root, "--output", str(out), "--quiet", *extra]
    return _cli(*argv, "--skip_unreadable_folders")


@pytest.fixture(scope="module")
def local_run(odd, tmp_path_factory):
    root, _, _ = odd
    out = tmp_path_factory.mktemp("odd-out") / "local"
    done = _convert(root, out)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.e2e
def test_every_odd_entry_is_skipped_with_its_reason_and_nothing_is_opened(odd, local_run):
    root, ids, skipped = odd
    assert _skipped_rows(local_run) == skipped
    info = contract.load_info(str(local_run))
    assert info["skipped"]["count"] == len(skipped)
    assert info["rejected"]["count"] == 0
    written = [i for rows in contract.check_output(str(local_run)).values() for i in rows]
    assert sorted(contract.ids(written)) == sorted(ids)
    # An unreadable class folder keeps its class (ids stay those of the sorted names).
    assert ("locked_class" in info["classes"]) == (f"{root}/locked_class" in skipped)


@pytest.mark.e2e
def test_beam_lists_the_odd_entries_as_the_local_engine_does(odd, local_run, tmp_path):
    root, _, _ = odd
    done = _convert(root, tmp_path / "beam", *BEAM)
    assert done.returncode == 0, done.stderr
    assert contract.all_files(str(tmp_path / "beam")) == contract.all_files(str(local_run))


@pytest.mark.e2e
def test_the_dry_run_counts_the_odd_entries_and_does_not_hang(odd, tmp_path):
    root, ids, skipped = odd
    if f"{root}/locked_class" in skipped:  # as a real run would, it stops before work
        done = _cli("--input", root, "--output", str(tmp_path / "o"), "--dry_run")
        assert done.returncode == 2 and "--skip_unreadable_folders" in done.stderr
    done = _cli(
        "--input", root, "--output", str(tmp_path / "o"), "--dry_run", "--skip_unreadable_folders"
    )
    assert done.returncode == 0, done.stderr
    assert f"listed {len(ids)} images" in done.stdout
    assert "skipped (not a regular file (FIFO)): 1 file, e.g. cat/x.jpg" in done.stdout
    assert "fish/caf\\xff.jpg" in done.stdout
    assert not (tmp_path / "o").exists()


@pytest.mark.e2e
def test_the_files_converted_ahead_are_only_regular_files(odd):
    """The conversion processes open these while Beam loads, before the pipeline lists."""
    root, ids, _ = odd
    layout = discovery.discover(root, skip_unreadable_folders=True)
    refs = discovery.local_refs(layout, 1000, 1 << 30, 42, keys.parse_splits(keys.DEFAULT_SPLITS))
    found = {ref.image_id for ref in refs}
    # (this process, unlike the CLI runs above, may read the locked folders: root can)
    assert set(ids) <= found <= set(ids) | {"cat/locked/in.jpg", "locked_class/in.jpg"}


# ------------------------------------------------------------ on each engine, one at a time

ENGINES = {"local": (), "beam": BEAM, "dry_run": ("--dry_run",)}


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ENGINES)
def test_a_fifo_in_a_class_folder_is_skipped_without_opening_it(tmp_path, engine):
    root = tmp_path / "in"
    ids = make_class_folders(str(root), per_class=2, size_range=(60, 100), nested=False)
    os.mkfifo(root / "cat" / "x.jpg")
    out = tmp_path / "o"
    done = _cli("--input", str(root), "--output", str(out), "--quiet", *ENGINES[engine])
    assert done.returncode == 0, done.stderr
    if engine == "dry_run":
        assert f"listed {len(ids)} images" in done.stdout
        assert "skipped (not a regular file (FIFO)): 1 file, e.g. cat/x.jpg" in done.stdout
        return
    assert _skipped_rows(out) == {f"{root}/cat/x.jpg": "not a regular file (FIFO)"}
    assert contract.load_info(str(out))["skipped"]["by_reason"] == {"not a regular file (FIFO)": 1}


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ENGINES)
def test_a_file_name_that_is_not_utf8_is_skipped_and_the_job_goes_on(tmp_path, engine):
    root = tmp_path / "in"
    ids = make_class_folders(str(root), per_class=2, size_range=(60, 100), nested=False)
    _write(os.path.join(os.fsencode(root), b"dog", b"\xff\xfe.jpg"), jpeg_bytes(photo(50, 40, 1)))
    out = tmp_path / "o"
    done = _cli("--input", str(root), "--output", str(out), "--quiet", *ENGINES[engine])
    assert done.returncode == 0, done.stderr
    if engine == "dry_run":
        assert f"listed {len(ids)} images" in done.stdout
        assert "skipped (name is not valid UTF-8): 1 file, e.g. dog/\\xff\\xfe.jpg" in done.stdout
        return
    assert _skipped_rows(out) == {f"{root}/dog/\\xff\\xfe.jpg": "name is not valid UTF-8"}
    written = [i for rows in contract.check_output(str(out)).values() for i in contract.ids(rows)]
    assert sorted(written) == sorted(ids)


# ------------------------------------------------------------ unreadable folders


@pytest.fixture
def locked_input(tmp_path, can_lock):
    if not can_lock:
        pytest.skip("cannot make a folder this process's children cannot read")
    root = str(tmp_path / "in")
    make_class_folders(root, per_class=4, size_range=(60, 100), nested=False)
    return root


@pytest.mark.e2e
def test_an_unreadable_class_folder_stops_the_job_before_work(locked_input, tmp_path):
    _lock(os.path.join(locked_input, "dog"))
    done = _cli("--input", locked_input, "--output", str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: --input: cannot read the class folder '{locked_input}/dog' (Permission "
        "denied); fix its permissions, or pass --skip_unreadable_folders to convert the rest "
        "and list it in skipped.jsonl"
    ]
    assert not (tmp_path / "o").exists()


@pytest.mark.e2e
def test_an_unreadable_sub_folder_is_a_skipped_row(locked_input, tmp_path):
    _write(os.path.join(locked_input, "dog", "more", "a.jpg"), jpeg_bytes(photo(60, 50, seed=2)))
    _lock(os.path.join(locked_input, "dog", "more"))
    done = _cli("--input", locked_input, "--output", str(tmp_path / "o"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert _skipped_rows(tmp_path / "o") == {
        f"{locked_input}/dog/more": "folder cannot be read (Permission denied): "
        "the files in it are unknown"
    }


@pytest.mark.e2e
def test_an_unreadable_split_folder_of_a_presplit_layout(tmp_path, can_lock):
    if not can_lock:
        pytest.skip("cannot make a folder this process's children cannot read")
    root = str(tmp_path / "in")
    make_class_folders(os.path.join(root, "train"), classes=("a", "b"), per_class=3)
    make_class_folders(os.path.join(root, "val"), classes=("a", "b"), per_class=2)
    _lock(os.path.join(root, "val"))
    out = str(tmp_path / "o")
    done = _cli("--input", root, "--output", out, "--quiet")
    assert done.returncode == 2 and "cannot read the split folder" in done.stderr
    done = _cli("--input", root, "--output", out, "--quiet", "--skip_unreadable_folders")
    assert done.returncode == 0, done.stderr
    assert list(_skipped_rows(out)) == [f"{root}/val"]
    assert contract.load_info(out)["classes"] == ["a", "b"]


# ------------------------------------------------------------ over-long paths


def _deep_folder(root: str, limit: int, left: int) -> tuple[int, str]:
    """Nested folders below ``root`` (made relative to a descriptor, as their paths
    grow too long to name) whose deepest path is ``limit - left`` bytes long;
    returns an open descriptor of the deepest folder and its path."""
    fd, path = os.open(root, os.O_RDONLY | os.O_DIRECTORY), root
    while (room := limit - len(os.fsencode(path))) > left:
        excess = room - left - 1  # a name this long ends the walk down
        name = "d" * (excess if excess <= 200 else 200 if excess > 201 else 100)
        os.mkdir(name, dir_fd=fd)
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd, path = inner, os.path.join(path, name)
    return fd, path


def test_paths_longer_than_the_system_allows_are_skipped_rows(tmp_path):
    root = str(tmp_path / "in")
    make_class_folders(root, per_class=4, size_range=(60, 100), nested=False)
    limit = os.pathconf(root, "PC_PATH_MAX")
    fd, deep = _deep_folder(os.path.join(root, "cat"), limit, left=240)
    image = jpeg_bytes(photo(60, 50, seed=4))
    try:
        name = "f" * 239  # the path: limit bytes, one more than open() takes (with its NUL)
        with open(os.open(name, os.O_WRONLY | os.O_CREAT, dir_fd=fd), "wb") as f:
            f.write(image)
        os.mkdir("g" * 250, dir_fd=fd)  # its path is too long to list it
        inner = os.open("g" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        with open(os.open("h.jpg", os.O_WRONLY | os.O_CREAT, dir_fd=inner), "wb") as f:
            f.write(image)
        os.close(inner)
    finally:
        os.close(fd)
    out = tmp_path / "o"
    assert main(["--input", root, "--output", str(out), "--quiet"]) == 0
    assert _skipped_rows(out) == {
        os.path.join(deep, name): listing.path_too_long_reason(limit),
        os.path.join(deep, "g" * 250): (
            "folder cannot be read (path longer than the system allows): "
            "the files in it are unknown"
        ),
    }


# ------------------------------------------------------------ names that are not text


def test_a_class_folder_name_that_is_not_utf8_is_refused_naming_it(tmp_path, capsys):
    root = tmp_path / "in"
    make_class_folders(str(root), per_class=2, nested=False)
    _write(os.path.join(os.fsencode(root), b"caf\xe9", b"a.jpg"), jpeg_bytes(photo(50, 40, 1)))
    assert main(["--input", str(root), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: --input: class folder 'caf\\xe9' is not")


def test_a_manifest_path_that_is_not_utf8_is_refused_naming_its_line(tmp_path, capsys):
    manifest = tmp_path / "list.jsonl"
    manifest.write_text('{"path": "a.jpg", "label": "x"}\n{"path": "b\\udcff.jpg", "label": "x"}\n')
    assert main(["--manifest", str(manifest), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "list.jsonl:2: the path 'b\\xff.jpg' is not valid UTF-8" in err


def test_an_id_that_is_not_utf8_is_named_by_the_hash():
    with pytest.raises(ValueError, match=r"image ID 'cat/caf\\xff\.jpg' is not valid UTF-8"):
        keys.order_key(42, os.fsdecode(b"cat/caf\xff.jpg"))


@pytest.mark.e2e
def test_a_fifo_named_in_a_manifest_is_skipped_not_opened(tmp_path):
    root = tmp_path / "in"
    ids = make_class_folders(str(root), per_class=3, nested=False)
    os.mkfifo(root / "cat" / "x.jpg")
    manifest = tmp_path / "list.csv"
    manifest.write_text("".join(f"{i},{i.split('/')[0]}\n" for i in [*ids, "cat/x.jpg"]))
    out = tmp_path / "o"
    done = _cli("--manifest", str(manifest), "--input", str(root), "--output", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    assert _skipped_rows(out) == {f"{root}/cat/x.jpg": "not a regular file (FIFO)"}


# ------------------------------------------------------------ class names


@pytest.mark.parametrize(
    "name",
    [
        "a\u2028b",  # line separator: str.splitlines() splits on it
        "a\u2029b",
        "a\x85b",  # NEL
        "a\x1cb",
        "a\x0bb",
        "a\x0cb",
        "a\x9bb",  # a C1 control that splitlines() keeps
        "cat ",  # a reader's strip() would lose the space
        "\u00a0cat",
        "\ufeffcat",
        os.fsdecode(b"caf\xe9"),
        "",
        "   ",
    ],
)
def test_class_names_that_labels_txt_cannot_hold_are_refused(name):
    with pytest.raises(UsageError) as refused:
        discovery.check_class_name(name, "--input: class folder")
    message = str(refused.value)
    assert message.startswith(f"--input: class folder {paths.shown(name)} ")
    assert message.isprintable()  # one line, whatever the name holds


@pytest.mark.parametrize("name", ["café au lait", "n° 1", "犬", "👩\u200d👩\u200d👧", "a  b"])
def test_class_names_that_round_trip_are_accepted(name):
    discovery.check_class_name(name, "--input: class folder")
    assert (name + "\n").splitlines() == [name] and name.strip() == name


def test_a_class_folder_with_a_line_separator_is_refused_before_work(tmp_path, capsys):
    root = tmp_path / "in"
    make_class_folders(str(root), classes=("cat", "dog\u2028evil"), per_class=2, nested=False)
    assert main(["--input", str(root), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "class folder 'dog\\u2028evil' holds a line break" in err[0]
    assert not (tmp_path / "o").exists()


def test_a_manifest_label_with_a_next_line_character_is_refused(tmp_path, capsys):
    root = tmp_path / "in"
    make_class_folders(str(root), classes=("cat",), per_class=1, nested=False)
    manifest = tmp_path / "list.jsonl"
    manifest.write_text(json.dumps({"path": "cat/cat_0000.jpg", "label": "x\x85y"}) + "\n")
    argv = ["--manifest", str(manifest), "--input", str(root), "--output", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "label 'x\\x85y' holds a line break" in capsys.readouterr().err
