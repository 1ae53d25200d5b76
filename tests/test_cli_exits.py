"""Every way out of the command line: one `error:` line, the right status, no process left.

Process checks run the real entry point in its own session and then look for
any process still in that session (psutil), so a child reparented to PID 1
after the CLI exited is still found.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.beam_internals import beam_options
from beam_pipeline.cli import job
from beam_pipeline.core import metadata
from beam_pipeline.core.errors import UsageError
from beam_pipeline.engines import local_pool
from tests import held_run
from tests.image_factory import add_bad_files, make_class_folders

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("exits") / "images"
    make_class_folders(str(root), per_class=10, nested=False)
    add_bad_files(str(root))
    return root


def _session_processes(sid: int) -> list[str]:
    left = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.pid != os.getpid() and os.getsid(process.pid) == sid:
                left.append(" ".join(process.info["cmdline"] or []))
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return left


def _connected_workers(sid: int, module: str) -> int:
    """Python processes of session ``sid`` running ``module`` that have connected over TCP
    (Beam's SDK workers to their runner: from then on they are handed bundles)."""
    count = 0
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if process.pid == os.getpid() or os.getsid(process.pid) != sid:
                continue
            command = process.info["cmdline"] or []
            if module not in " ".join(command) or not process.info["name"].startswith("python"):
                continue  # the shell that starts the worker, or another process
            connections = getattr(process, "net_connections", process.connections)("tcp")
            count += any(c.status == psutil.CONN_ESTABLISHED for c in connections)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return count


def _assert_no_process_left(sid: int) -> None:
    deadline = time.monotonic() + 5  # a killed process may take a moment to go
    while (left := _session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes of the CLI outlived it: {left}"


def _default_sigint() -> None:
    # A test run started in the background of a non-interactive shell (`make
    # test &`, some CI runners) inherits SIGINT ignored, and so would the CLI:
    # Python then never raises KeyboardInterrupt. The CLI gets what a terminal
    # gives it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(*args: str, command: list[str] | None = None) -> subprocess.Popen:
    """``python -m beam_pipeline args`` (or ``command``) as a terminal would start it."""
    return subprocess.Popen(
        command or [sys.executable, "-m", "beam_pipeline", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,  # its own session: children are found even when orphaned
        preexec_fn=_default_sigint,
    )


def _finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    _, err = process.communicate(timeout=timeout)
    _assert_no_process_left(process.pid)
    return process.returncode, err


BAD_FLAGS = [
    (["--image-size", "128"], "did you mean --image_size"),
    (["--bogus_flag", "3"], "unknown option --bogus_flag"),
    (["--runner", "NoSuchRunner"], "--runner NoSuchRunner: unknown runner"),
    (["--direct_num_workers=abc"], "--direct_num_workers must be an integer"),
    (["--direct_running_mode", "fast"], "--direct_running_mode must be one of"),
    (["--local_processes", "0"], "--local_processes must be at least 1"),
    (["--quiet=maybe"], "expected true or false"),
    (["--splits", "all=0.9,test=0.1"], "'all' is reserved by TFDS"),
    (["--dedupe", "nearr"], "--dedupe must be one of"),
    (["--dedupe=fuzzy"], "--dedupe must be one of"),
    (["--image_siz", "128"], "unknown option --image_siz (did you mean --image_size?)"),
    (["--dryrun"], "unknown option --dryrun (did you mean --dry_run?)"),
    (["--num_worker=3"], "unknown option --num_worker (did you mean --num_workers?)"),
]


@pytest.mark.parametrize("flags, message", BAD_FLAGS, ids=[f[0][0] for f in BAD_FLAGS])
def test_a_bad_flag_forks_nothing(images, tmp_path, capsys, monkeypatch, flags, message):
    forked = []
    monkeypatch.setattr(local_pool, "start", lambda n: forked.append(n))
    monkeypatch.setattr(local_pool, "new", lambda n: forked.append(n))
    argv = ["--input", str(images), "--output", str(tmp_path / "o"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    assert not forked, "conversion processes were forked before the flags were checked"
    assert not (tmp_path / "o").exists()


def test_a_misspelt_output_is_named_not_called_missing(images, capsys):
    assert main(["--input", str(images), "--ouput", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unknown option --ouput (did you mean --output?)"


def test_a_missing_output_is_still_called_missing(images, capsys):
    assert main(["--input", str(images)]) == 2
    assert (
        capsys.readouterr().err.strip() == "error: the following arguments are required: --output"
    )


@pytest.mark.parametrize(
    "name, near",
    [
        ("--ouput", "--output"),
        ("--image-size", "--image_size"),
        ("--dryrun", "--dry_run"),
        ("--Output", "--output"),
        ("--xyz", None),
        ("--bogus_flag", None),
    ],
)
def test_closest_flag(name, near):
    known = ["--output", "--image_size", "--dry_run", "--input", "--runner"]
    assert beam_options.closest_flag(name, known) == near


@pytest.mark.parametrize(
    "argv0, name",
    [
        ("/venv/bin/imagerecords", "imagerecords"),
        ("/repo/beam_pipeline/__main__.py", "python -m beam_pipeline"),
        ("-c", "python -m beam_pipeline"),
        ("", "python -m beam_pipeline"),
    ],
)
def test_the_usage_names_the_command_the_user_typed(argv0, name):
    from beam_pipeline.cli import arguments

    assert arguments.program_name(argv0) == name


@pytest.mark.e2e
def test_the_console_script_prints_its_own_name_in_usage(tmp_path):
    script = tmp_path / "imagerecords"
    script.write_text("import sys\nfrom beam_pipeline.__main__ import main\nsys.exit(main())\n")
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: imagerecords ")
    assert "example: imagerecords --input" in done.stdout and "python -m" not in done.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("flags", [["--bogus_flag", "3"], ["--direct_num_workers=abc"]])
def test_a_bad_flag_leaves_no_process(images, tmp_path, flags):
    status, err = _finish(_start("--input", str(images), "--output", str(tmp_path / "o"), *flags))
    assert status == 2
    assert err.strip().startswith("error: ") and len(err.strip().splitlines()) == 1, err


@pytest.mark.e2e
def test_too_many_rejects_names_the_reasons_and_the_flag(images, tmp_path):
    out = tmp_path / "o"
    status, err = _finish(_start("--input", str(images), "--output", str(out), "--quiet"))
    assert status == 1
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]]
    assert lines[-1].startswith("error: too many rejected images: 2 of 32 (6.2%)")
    assert "--max_reject_fraction 0.07" in lines[-1]  # the value that accepts this run
    assert str(out / "rejects.jsonl") in lines[-1]
    assert "reasons=" not in err
    reasons = lines[lines.index("most common reasons for rejection:") + 1 : -1]
    assert len(reasons) == 2
    assert sorted(r.split(None, 1)[1].split(":")[0] for r in reasons) == [
        "corrupt image data",
        "not an image",
    ]
    assert all(r.split()[0] == "1" for r in reasons)
    assert not (out / "imagerecords.json").exists()


@pytest.mark.e2e
def test_verbose_shows_the_traceback(images, tmp_path):
    out = tmp_path / "o"
    status, err = _finish(
        _start("--input", str(images), "--output", str(out), "--quiet", "--verbose")
    )
    assert status == 1
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: too many")


@pytest.fixture(scope="module")
def busy_images(tmp_path_factory):
    """More images than a Beam run converts ahead of its pipeline (job.CONVERT_AHEAD_LIMIT),
    so that its conversion step is at work when interrupted."""
    root = tmp_path_factory.mktemp("busy") / "images"
    make_class_folders(str(root), per_class=600, nested=False, size_range=(300, 500))
    return root


CTRL_C_RUNS = {
    "local-engine": [],
    # What `make demo` and the README's Beam path use: in_memory with a local pool.
    "direct-runner": ["--runner", "DirectRunner"],
    "multi-processing": [
        "--runner",
        "DirectRunner",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    ],
}

# Where a run on the local pool is held (tests/held_run.py) until its Ctrl-C. On
# the local engine, after a few images. On Beam, after more than were converted
# while Beam loaded: the conversion step itself is at work, and the Ctrl-C lands
# in it (where Beam wraps the KeyboardInterrupt in a RuntimeError).
HELD_AFTER = {"local-engine": 50, "direct-runner": job.CONVERT_AHEAD_LIMIT + 50}


def _start_until_interruptible(runner: str, args: list[str], gate) -> subprocess.Popen:
    """Starts the run; returns once it converts, and cannot end before a Ctrl-C."""
    deadline = time.monotonic() + 180
    if runner not in HELD_AFTER:
        # multi_processing converts in Beam's worker processes, which are not
        # forked from the command line (no hold reaches them): the pipeline is
        # at work once they have connected, with most of the images to go.
        process = _start(*args)
        while _connected_workers(process.pid, "sdk_worker_main") < 2:
            assert process.poll() is None, "the run ended before its workers started"
            assert time.monotonic() < deadline, "the run never started its workers"
            time.sleep(0.05)
        return process
    # Held, GATE never created: every conversion process waits, and so does the run.
    process = _start(command=held_run.command(gate, HELD_AFTER[runner], args))
    while not os.path.exists(held_run.held_marker(gate)):
        assert process.poll() is None, "the run ended before it was held"
        assert time.monotonic() < deadline, "the run was never held"
        time.sleep(0.02)
    return process


@pytest.mark.e2e
@pytest.mark.parametrize("runner", list(CTRL_C_RUNS))
def test_ctrl_c_exits_130_with_how_to_go_on(busy_images, tmp_path, runner):
    out = tmp_path / "o"
    args = ["--input", str(busy_images), "--output", str(out), "--local_processes", "2"]
    process = _start_until_interruptible(runner, [*args, *CTRL_C_RUNS[runner]], tmp_path / "gate")
    # Interrupt as a terminal does: the whole process group.
    os.killpg(process.pid, signal.SIGINT)
    try:
        status, err = _finish(process, timeout=60)
    finally:
        if process.poll() is None:  # hung: not left running for the rest of the suite
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert status == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "CRITICAL" not in err, err
    last = err.strip().splitlines()[-1]
    assert last == (
        f"error: interrupted; no {metadata.INFO_FILE} was written; rerun the same command to resume"
    ), err
    assert not (out / metadata.INFO_FILE).exists()
    assert not (out / ".imagerecords-tmp" / "lock").exists()  # given back
    workers_log = out / ".imagerecords-tmp" / job.WORKERS_LOG
    if workers_log.exists():  # Beam's workers ignore the Ctrl-C: the CLI stops them
        assert "KeyboardInterrupt" not in workers_log.read_text()


_CTRL_C_TO_ANOTHER_THREAD = """
import signal, sys, threading
from beam_pipeline.__main__ import _CtrlC

waiting = threading.Event()

def ctrl_c_to_this_thread():  # the kernel may give a process's SIGINT to any thread
    waiting.wait()
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)

with _CtrlC(verbose=False):
    try:
        threading.Thread(target=ctrl_c_to_this_thread, daemon=True).start()
        waiting.set()
        threading.Event().wait()  # as Beam's runner waits on its bundles: no timeout
    except KeyboardInterrupt:
        print("interrupted")
        sys.exit(0)
"""


@pytest.mark.e2e
def test_a_ctrl_c_another_thread_receives_wakes_the_main_thread(tmp_path):
    """A main thread asleep on a lock is woken for a SIGINT that another thread took.

    Python runs signal handlers in the main thread only, and a wait there is
    interrupted only by a signal to that thread: without a wake the run slept on
    (a multi_processing run hung after its Ctrl-C)."""
    try:
        result = _run_script(tmp_path, _CTRL_C_TO_ANOTHER_THREAD, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the main thread slept through the Ctrl-C")
    assert result.returncode == 0 and result.stdout.split() == ["interrupted"], (
        result.stdout + result.stderr
    )


@pytest.mark.e2e
def test_a_killed_cli_takes_its_workers_with_it(tmp_path):
    root = tmp_path / "images"
    # Enough work that the run is still converting when interrupted (the local
    # engine starts in a fraction of a second).
    make_class_folders(str(root), per_class=150, nested=False, size_range=(500, 800))
    process = _start(
        "--input", str(root), "--output", str(tmp_path / "o"), "--local_processes", "2"
    )
    deadline = time.monotonic() + 120
    while len(psutil.Process(process.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    _finish(process, timeout=60)


def test_shutdown_all_stops_a_started_pool():
    executor = local_pool.start(2).take()
    pids = list(executor._processes)
    assert len(pids) == 2
    local_pool.shutdown_all()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def _run_script(
    tmp_path, text: str, *args: str, timeout: float = 120, **kwargs
) -> subprocess.CompletedProcess:
    """Runs ``text`` as a Python script from the repository, SIGINT at its default."""
    script = tmp_path / "script.py"
    script.write_text(text)
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_default_sigint,
        **kwargs,
    )


_CTRL_C_WHILE_WORKERS_START = """
import os, pathlib, signal, sys, threading, time
import psutil
from beam_pipeline.engines import local_pool

events = pathlib.Path(sys.argv[1])
go = events / "go"
real_init = local_pool._init_worker

def slow_init(*args):  # a loaded machine: the workers take a while to start
    real_init(*args)
    (events / f"started-{os.getpid()}").touch()
    # Starting until the parent has seen the Ctrl-C (or, if it swallowed it,
    # for long enough that the test fails rather than hangs).
    for _ in range(3000):
        if go.exists():
            break
        time.sleep(0.01)

def ctrl_c_once_both_are_starting():
    while len(list(events.glob("started-*"))) < 2:
        time.sleep(0.01)
    # Ctrl-C reaches the whole process group: the workers too.
    os.killpg(os.getpgid(0), signal.SIGINT)

local_pool._init_worker = slow_init
threading.Thread(target=ctrl_c_once_both_are_starting, daemon=True).start()
try:
    local_pool.new(2)
except KeyboardInterrupt:
    children = psutil.Process().children()
    alive = [c for c in children if c.status() != psutil.STATUS_ZOMBIE]
    go.touch()
    local_pool.shutdown_all()
    print("interrupted", len(alive))
    sys.exit(0)
go.touch()
print("swallowed")
sys.exit(1)
"""


@pytest.mark.e2e
def test_ctrl_c_while_the_workers_start_is_not_lost(tmp_path):
    """A Ctrl-C that comes while the pool's workers are still starting stops the run.

    A parent that ignored SIGINT until its workers had started would drop a Ctrl-C
    in that window (long on a loaded machine), and the run would go on.
    The workers, which get the same Ctrl-C, must survive it (the parent stops them).
    """
    # Its own process group, so the Ctrl-C reaches only it.
    events = tmp_path / "events"
    events.mkdir()
    result = _run_script(tmp_path, _CTRL_C_WHILE_WORKERS_START, str(events), start_new_session=True)
    assert result.returncode == 0 and result.stdout.split() == ["interrupted", "2"], (
        result.stdout + result.stderr
    )


_CTRL_C_WHILE_FORKING = """
import concurrent.futures, os, signal, sys, time
import psutil
from beam_pipeline.engines import local_pool

real_submit = concurrent.futures.ProcessPoolExecutor.submit

def submit(self, *args, **kwargs):  # Ctrl-C lands while the workers are being forked
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    return real_submit(self, *args, **kwargs)

concurrent.futures.ProcessPoolExecutor.submit = submit
try:
    local_pool.new(2)
except KeyboardInterrupt:
    children = psutil.Process().children()
    started = len([c for c in children if c.status() != psutil.STATUS_ZOMBIE])
    local_pool.shutdown_all()
    print("interrupted after starting", started)
    sys.exit(0)
print("swallowed")
sys.exit(1)
"""


@pytest.mark.e2e
def test_ctrl_c_while_the_workers_are_forked_is_raised_after(tmp_path):
    """Noted during the fork, raised once both workers exist (none half-started)."""
    result = _run_script(tmp_path, _CTRL_C_WHILE_FORKING)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["interrupted", "after", "starting", "2"]


_CTRL_C_WHILE_IMPORTING = """
import runpy, sys

class CtrlC:  # Ctrl-C lands while the CLI's modules are being imported
    def find_spec(self, name, path=None, target=None):
        if name == "beam_pipeline.cli.job":
            raise KeyboardInterrupt

sys.meta_path.insert(0, CtrlC())
sys.argv = ["beam_pipeline", "--input", sys.argv[1] + "/in", "--output", sys.argv[1] + "/out"]
runpy.run_module("beam_pipeline", run_name="__main__", alter_sys=True)
"""


@pytest.mark.e2e
def test_ctrl_c_while_the_cli_starts_is_one_line(tmp_path):
    result = _run_script(tmp_path, _CTRL_C_WHILE_IMPORTING, str(tmp_path))
    assert result.returncode == 130, result.stderr
    assert result.stderr.splitlines() == [
        "error: interrupted before the job started; nothing was written"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value, quiet", [("--quiet=true", True), ("--quiet=false", False)])
def test_quiet_with_a_value(images, tmp_path, value, quiet):
    logger = logging.getLogger("beam_pipeline")
    logger.setLevel(logging.WARNING)
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x").write_text("")
    try:  # refused after parsing (output not empty): the log level is already set
        assert main(["--input", str(images), "--output", str(tmp_path / "o"), value]) == 2
        assert (logger.level == logging.INFO) is not quiet
    finally:
        logger.setLevel(logging.NOTSET)


def test_class_folder_with_a_newline_is_refused(tmp_path, capsys):
    root = tmp_path / "in"
    make_class_folders(str(root), classes=("cat", "dog\nevil"), per_class=2, nested=False)
    assert main(["--input", str(root), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "'dog\\nevil'" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("name", ["a\tb", "x\x1by", " "])
def test_class_names_with_control_characters_are_refused(name):
    from beam_pipeline.storage import discovery

    with pytest.raises(UsageError, match="control character"):
        discovery.check_class_name(name, "class folder")
    discovery.check_class_name("caf\u00e9 au lait", "class folder")  # not a control character


def test_manifest_label_with_a_newline_is_refused(images, tmp_path, capsys):
    manifest = tmp_path / "list.jsonl"
    manifest.write_text(json.dumps({"path": str(images / "cat" / "cat_0000.jpg"), "label": "a\nb"}))
    assert main(["--manifest", str(manifest), "--output", str(tmp_path / "o")]) == 2
    assert "'a\\nb'" in capsys.readouterr().err


@pytest.mark.parametrize("split", [1, None, ["train"], True])
def test_jsonl_manifest_with_a_non_string_split(images, tmp_path, capsys, split):
    manifest = tmp_path / "list.jsonl"
    row = {"path": str(images / "cat" / "cat_0000.jpg"), "label": "cat", "split": split}
    manifest.write_text(json.dumps(row) + "\n")
    status = main(["--manifest", str(manifest), "--output", str(tmp_path / "o"), "--quiet"])
    if split is None:  # no split: the hash decides
        assert status == 0
        return
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --manifest {manifest}:1: split must be a string"), err


@pytest.mark.parametrize(
    "splits, message",
    [
        (["train", "all"], ":2: the split name 'all' is reserved by TFDS"),
        (["train", "Train"], "the splits 'train' and 'Train' differ only in case"),
    ],
)
def test_a_manifest_split_tfds_cannot_carry_is_refused_before_work(
    images, tmp_path, capsys, monkeypatch, splits, message
):
    forked = []
    monkeypatch.setattr(local_pool, "start", lambda n: forked.append(n))
    manifest = tmp_path / "list.csv"
    rows = [f"{images / 'cat' / f'cat_000{n}.jpg'},cat,{split}" for n, split in enumerate(splits)]
    manifest.write_text("\n".join(rows) + "\n")
    assert main(["--manifest", str(manifest), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --manifest ") and len(err.splitlines()) == 1, err
    assert message in err and "rename" in err
    assert not forked and not (tmp_path / "o").exists()


# ----------------------------------------------------- Beam flags without Beam


def test_the_beam_flag_table_matches_the_installed_beam():
    """If this fails after a Beam upgrade: python -m beam_pipeline.beam_internals.beam_options; make format."""
    from beam_pipeline.beam_internals import _beam_option_table

    assert _beam_option_table.TABLE == beam_options.snapshot()


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--runner", "DataflowRunner", "--project", "p", "--region", "us-central1"],
        ["--runner=direct", "--direct_num_workers", "4", "--direct_running_mode=in_memory"],
        ["--experiments=a,b", "--no_pipeline_type_check", "--save_main_session"],
        ["--runner=my.module.MyRunner", "--update_compatibility_version"],
        ["--update_compatibility_version", "2.60.0", "--num_workers=3"],
        ["--environment_config", '{"a": 1}', "--max_num_workers", "10"],
    ],
)
def test_good_beam_flags_pass(args):
    beam_options.check(args)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num_workers=x"], "--num_workers must be an integer"),
        (["--runner=Fast"], "unknown runner"),
        (["--direct_running_mode=fast"], "must be one of"),
        (["--save_main_session=yes"], "takes no value"),
        (["--project"], "--project needs a value"),
        (["stray"], "unexpected argument 'stray'"),
        (["-x"], "unknown option -x"),
        (["--num-workers", "3"], "did you mean --num_workers"),
    ],
)
def test_bad_beam_flags_fail(args, message):
    with pytest.raises(UsageError, match=message):
        beam_options.check(args)


def test_lenient_mode_warns_and_skips_the_unknown_flag_with_its_value(caplog):
    beam_options.check(["--launcher_flag", "v", "--num_workers", "2"], lenient=True)
    assert "unknown option --launcher_flag" in caplog.text


@pytest.mark.e2e
@pytest.mark.parametrize("given, expected", [(None, "1"), ("3", "3")])
def test_numpy_loads_with_openblas_at_one_thread_unless_told(given, expected):
    """OpenBLAS reads the variable when NumPy loads: what the command line sets
    must be in place by then, so that the forked conversion processes do not
    spin BLAS threads over the fingerprint's tiny products. A value the user
    set is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    # An import hook notes the variable at the moment NumPy is first imported.
    code = (
        "import importlib.abc, os, runpy, sys\n"
        "seen = []\n"
        "class Watch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'numpy' and not seen:\n"
        "            seen.append(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
        "            print('NUMPY_LOADED_WITH', seen, flush=True)\n"
        "sys.meta_path.insert(0, Watch())\n"
        "sys.argv = ['beam_pipeline', '--input', sys.argv[1], '--output', sys.argv[2]]\n"
        "runpy.run_module('beam_pipeline', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "/nonexistent/in", "/nonexistent/out"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert f"NUMPY_LOADED_WITH [{expected!r}]" in done.stdout.splitlines(), done.stderr
