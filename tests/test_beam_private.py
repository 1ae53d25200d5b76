"""beam_private: the tricks that reach into Beam's internals, each with its fallback.

The tripwire test fails whenever the installed Beam is not the one the module
was written against. The fallback tests break one trick's private target (as
a Beam upgrade could) and check that a real run still writes the same bytes,
with one warning line naming the trick and the Beam version.
"""

import logging
import os
import re
import shutil
import subprocess
import sys

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.beam_internals import beam_private
from tests import contract
from tests.image_factory import make_class_folders

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ("--quiet", "--local_processes", "2", "--direct_running_mode=in_memory")


def test_installed_beam_is_the_one_the_tricks_were_written_against():
    import apache_beam

    assert apache_beam.__version__ == beam_private.BEAM_VERSION, (
        f"apache-beam {apache_beam.__version__} is installed: re-check "
        f"beam_pipeline/beam_internals/beam_private.py against Beam {apache_beam.__version__} (every trick "
        f"there was read against Beam {beam_private.BEAM_VERSION}), then move BEAM_VERSION"
    )


def test_the_test_lock_and_the_container_pin_the_same_beam():
    with open(os.path.join(ROOT, "constraints", "test.txt"), encoding="utf-8") as f:
        pins = re.findall(r"^apache-beam==([\d.]+)$", f.read(), re.M)
    with open(os.path.join(ROOT, "deploy", "Dockerfile"), encoding="utf-8") as f:
        container = re.findall(r"ARG BEAM_VERSION=([\d.]+)", f.read())
    assert pins == container == [beam_private.BEAM_VERSION], (
        f"constraints/test.txt pins {pins}, deploy/Dockerfile {container}: re-check "
        f"beam_pipeline/beam_internals/beam_private.py against that Beam (written against "
        f"{beam_private.BEAM_VERSION})"
    )


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """18 images in 3 classes and the output of a run with every trick in place."""
    base = tmp_path_factory.mktemp("private")
    root = base / "images"
    make_class_folders(str(root), per_class=6)
    out = base / "normal"
    assert main(["--input", str(root), "--output", str(out), *FLAGS]) == 0
    return root, contract.all_files(str(out))


def _warnings(caplog, trick):
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "beam_pipeline.beam_internals.beam_private" and r.levelno == logging.WARNING
    ]
    assert len(lines) == 1, lines
    assert f"beam_private.{trick} skipped" in lines[0]
    assert beam_private.BEAM_VERSION in lines[0] and "\n" not in lines[0]
    return lines[0]


# ------------------------------------------------------------- state sampling


def test_local_runner_samples_state_often_enough_not_to_idle_bundle_ends(monkeypatch):
    from apache_beam.runners.worker import statesampler
    from apache_beam.utils.counters import CounterFactory

    # The rewrite is process-wide: put Beam's default back for the rest of this worker.
    init = statesampler.StateSampler.__init__
    monkeypatch.setattr(init, "__defaults__", (statesampler.DEFAULT_SAMPLING_PERIOD_MS,))
    assert beam_private.shorten_state_sampling()
    sampler = statesampler.StateSampler("step", CounterFactory())
    assert sampler.sampling_period_ms == beam_private.LOCAL_STATE_SAMPLING_MS < 50


def _renamed_period_parameter(monkeypatch, statesampler):
    real = statesampler.StateSampler.__init__

    def changed(self, prefix, counter_factory, period_ms=statesampler.DEFAULT_SAMPLING_PERIOD_MS):
        real(self, prefix, counter_factory, period_ms)

    monkeypatch.setattr(statesampler.StateSampler, "__init__", changed)


def _default_constant_gone(monkeypatch, statesampler):
    monkeypatch.delattr(statesampler, "DEFAULT_SAMPLING_PERIOD_MS")


@pytest.mark.e2e
@pytest.mark.parametrize("change", [_renamed_period_parameter, _default_constant_gone])
def test_state_sampling_falls_back_to_beams_period(images, tmp_path, monkeypatch, caplog, change):
    from apache_beam.runners.worker import statesampler
    from apache_beam.utils.counters import CounterFactory

    init = statesampler.StateSampler.__init__
    monkeypatch.setattr(init, "__defaults__", (statesampler.DEFAULT_SAMPLING_PERIOD_MS,))
    change(monkeypatch, statesampler)
    root, normal = images
    assert main(["--input", str(root), "--output", str(tmp_path / "o"), *FLAGS]) == 0
    assert "keeping Beam's sampling period" in _warnings(caplog, "shorten_state_sampling")
    assert statesampler.StateSampler("s", CounterFactory()).sampling_period_ms == 200
    assert contract.all_files(str(tmp_path / "o")) == normal


# ------------------------------------------------------ DirectRunner, no Prism


@pytest.mark.e2e
def test_direct_runner_never_tries_prism(images, tmp_path, monkeypatch):
    """DirectRunner would first try to download and start Prism; the CLI goes to FnApiRunner."""
    from apache_beam.runners.portability import prism_runner

    tried = []
    monkeypatch.setattr(
        prism_runner.PrismRunner, "run_pipeline", lambda *args: tried.append(args) or 1 / 0
    )
    root, normal = images
    argv = ["--input", str(root), "--output", str(tmp_path / "o"), *FLAGS, "--runner=DirectRunner"]
    assert main(argv) == 0
    assert not tried
    assert contract.all_files(str(tmp_path / "o")) == normal


@pytest.mark.e2e
def test_a_changed_fn_api_runner_falls_back_to_beams_direct_runner(
    images, tmp_path, monkeypatch, caplog
):
    from apache_beam.runners.portability import prism_runner
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    # The trick's call fails as a changed signature would; DirectRunner's own
    # call (the fallback) succeeds.
    real, calls = fn_runner.ExtendedProvisionInfo, []

    def changed(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise TypeError("ExtendedProvisionInfo() takes no positional arguments")
        return real(*args, **kwargs)

    monkeypatch.setattr(fn_runner, "ExtendedProvisionInfo", changed)
    # Offline, as in CI: Beam's DirectRunner tries Prism first and falls back.
    tried = []

    def no_prism(*args):
        tried.append(args)
        raise RuntimeError("Unable to fetch remote prism binary")

    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", no_prism)
    root, normal = images
    assert main(["--input", str(root), "--output", str(tmp_path / "o"), *FLAGS]) == 0
    assert "using Beam's DirectRunner" in _warnings(caplog, "direct_fn_api_runner")
    assert tried and len(calls) == 2  # went through Beam's DirectRunner
    assert contract.all_files(str(tmp_path / "o")) == normal


# ------------------------------------------------------ subprocess: import, exit


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT
    )


@pytest.mark.e2e
@pytest.mark.parametrize("uses_gcs", [True, False], ids=["gcs", "all-local"])
def test_local_run_imports_beam_without_unused_extras(uses_gcs):
    """Beam loads without MongoDB/Pub/Sub/Arrow (and, all local, GCS), importable afterwards."""
    code = (
        "import sys\n"
        "from beam_pipeline.beam_internals.beam_private import (\n"
        "    _CLOUD_ONLY_MODULES, _UNUSED_BEAM_EXTRAS, import_beam_for_local_run)\n"
        f"import_beam_for_local_run(uses_gcs={uses_gcs})\n"
        "import apache_beam as beam\n"
        "from apache_beam.io.filesystems import FileSystems\n"
        "assert not [m for m in _UNUSED_BEAM_EXTRAS if m in sys.modules], sys.modules.keys()\n"
        "gcs = [m for m in _CLOUD_ONLY_MODULES if m in sys.modules]\n"
        "assert beam.Map(len)  # Beam works\n"
        "try:\n"
        "    FileSystems.get_filesystem('gs://bucket/x')\n"
        "    has_gs = True\n"
        "except ValueError:\n"
        "    has_gs = False\n"
        "import pyarrow, pymongo, google.cloud.bigquery, google.cloud.storage\n"  # importable
        "import apache_beam.io.gcp.bigquery\n"
        "print(bool(gcs), has_gs)\n"
    )
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    # All local: no GCS client loaded and no gs:// filesystem registered; else both.
    assert result.stdout.strip() == f"{uses_gcs} {uses_gcs}"
    assert "bson" not in result.stderr  # Beam's warning about the hidden package is silenced


@pytest.mark.e2e
@pytest.mark.parametrize("beam_changed", [False, True], ids=["hidden", "fallback"])
def test_another_beam_is_imported_with_all_its_packages(images, tmp_path, beam_changed):
    """With a Beam the hidden packages were not checked on, a full run imports Beam plainly."""
    root, normal = images
    argv = ["--input", str(root), "--output", str(tmp_path / "o"), *FLAGS]
    code = (
        "import sys\n"
        "from beam_pipeline.beam_internals import beam_private\n"
        f"beam_private.BEAM_VERSION = {'0.0.0' if beam_changed else beam_private.BEAM_VERSION!r}\n"
        "from beam_pipeline.__main__ import main\n"
        f"status = main({argv!r})\n"
        "print('pyarrow' in sys.modules)  # Beam loads it when nothing hides it\n"
        "sys.exit(status)\n"
    )
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == str(beam_changed)
    warnings = [line for line in result.stderr.splitlines() if "beam_private" in line]
    if beam_changed:
        assert len(warnings) == 1, result.stderr
        assert "beam_private.import_beam_for_local_run skipped" in warnings[0]
        assert "0.0.0" in warnings[0] and "importing Beam with all its packages" in warnings[0]
    else:
        assert not warnings, result.stderr
    assert contract.all_files(str(tmp_path / "o")) == normal


_AS_MAIN = (
    "import atexit, runpy, sys\n"
    "atexit.register(print, 'interpreter teardown ran')\n"
    "from beam_pipeline.beam_internals import beam_private\n"
    "{patch}"
    "sys.argv = ['beam_pipeline', *{argv!r}]\n"
    "runpy.run_module('beam_pipeline', run_name='__main__', alter_sys=True)\n"
)


@pytest.mark.e2e
@pytest.mark.parametrize("beam_changed", [False, True], ids=["fast", "fallback"])
def test_fast_exit_only_with_the_beam_it_was_checked_against(images, tmp_path, beam_changed):
    """``python -m beam_pipeline`` skips the interpreter's teardown, except with another Beam."""
    root, normal = images
    argv = ["--input", str(root), "--output", str(tmp_path / "o"), *FLAGS]
    patch = "beam_private.BEAM_VERSION = '0.0.0'\n" if beam_changed else ""
    result = _run_python(_AS_MAIN.format(patch=patch, argv=argv))
    assert result.returncode == 0, result.stderr
    assert ("interpreter teardown ran" in result.stdout) == beam_changed
    warnings = [line for line in result.stderr.splitlines() if "beam_private" in line]
    if beam_changed:  # the import trick says so too
        exits = [line for line in warnings if "beam_private.fast_exit skipped" in line]
        assert len(exits) == 1 and "exiting normally" in exits[0] and "0.0.0" in exits[0]
    else:
        assert not warnings, warnings
    assert contract.all_files(str(tmp_path / "o")) == normal


@pytest.mark.e2e
def test_the_local_engine_exits_fast_without_reading_beams_version(images, tmp_path):
    """No Beam in the process (no Beam flag): nothing of Beam's to check before os._exit."""
    root, normal = images
    argv = ["--input", str(root), "--output", str(tmp_path / "o"), "--quiet"]
    patch = "beam_private.BEAM_VERSION = '0.0.0'\n"  # would make a Beam run exit normally
    result = _run_python(_AS_MAIN.format(patch=patch, argv=argv))
    assert result.returncode == 0, result.stderr
    assert "interpreter teardown ran" not in result.stdout
    assert "beam_private" not in result.stderr
    assert contract.all_files(str(tmp_path / "o")) == normal


# ------------------------------------------- multi_processing: the workers' command


@pytest.mark.parametrize(
    "log, command",
    [
        (None, "trap '' INT; exec py -m w"),
        ("/tmp/o/workers.log", "trap '' INT; exec py -m w 2>>/tmp/o/workers.log"),
        ("/tmp/a b/it's.log", "trap '' INT; exec py -m w 2>>'/tmp/a b/it'\"'\"'s.log'"),
    ],
)
def test_the_worker_command_ignores_ctrl_c_and_appends_to_the_log(log, command):
    assert beam_private.worker_command("py -m w", log) == command


@pytest.mark.parametrize(
    "stat, parent",
    [
        (b"4242 (python3) S 17 4242 4242 0 -1 4194560", 17),
        (b"99 (a) b (c)) R 1 99 99 0 -1", 1),  # a command name holding ") "
        (b"7 (sh) Z 4242 7 7 0 -1\n", 4242),
    ],
)
def test_parent_pid_of_a_proc_stat_line(stat, parent):
    assert beam_private.parent_pid(stat) == parent


# ------------------------------------------- multi_processing: the workers' stderr

MULTI = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")


@pytest.mark.e2e
@pytest.mark.parametrize("verbose", [False, True], ids=["plain", "verbose"])
def test_failing_multi_processing_workers_print_no_traceback(images, tmp_path, verbose):
    """Beam's worker processes print each failed bundle's traceback; only --verbose shows it."""
    from tests.image_factory import add_bad_files
    from tests.test_cli_exits import _finish, _start

    root, _ = images
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    add_bad_files(str(bad))
    out = tmp_path / "o"
    argv = ["--input", str(bad), "--output", str(out), "--max_reject_fraction", "0", *MULTI]
    status, err = _finish(_start(*argv, *(["--verbose"] if verbose else [])))
    assert status == 1, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: too many rejected images: 2 of 20"), err
    log = out / ".imagerecords-tmp" / "workers.log"
    if verbose:  # Beam's plain behaviour: the workers' tracebacks on the CLI's stderr
        assert "Traceback" in err and not log.exists()
    else:
        assert "Traceback" not in err, err
        assert f"imagerecords: the worker processes' messages are in {log}" in lines
        assert "BooksDoNotBalance" in log.read_text()
    assert not (out / "imagerecords.json").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("beam_changed", [False, True], ids=["log", "fallback"])
def test_successful_multi_processing_run_writes_the_in_memory_bytes(
    images, tmp_path, monkeypatch, caplog, beam_changed
):
    """Same bytes as in_memory; when Beam starts its workers differently they print as before."""
    if beam_changed:
        monkeypatch.setattr(beam_private, "_SDK_WORKER_COMMAND", "{python} -m a.changed.main")
    root, normal = images
    argv = ["--input", str(root), "--output", str(tmp_path / "o"), "--quiet", *MULTI]
    assert main(argv) == 0
    if beam_changed:
        line = _warnings(caplog, "direct_fn_api_runner")
        assert "multi_processing's workers print to this process's stderr" in line
    else:
        assert not [
            r for r in caplog.records if r.name == "beam_pipeline.beam_internals.beam_private"
        ]
    assert contract.all_files(str(tmp_path / "o")) == normal  # no workers.log left either


# ------------------------------------------- every private name, in one inventory

PACKAGE = os.path.join(ROOT, "beam_pipeline")
INTERNALS = os.path.join(PACKAGE, "beam_internals")
_NAMED_IN_TEXT = re.compile(r"\bapache_beam(?:\.\w+)+")


def _beam_names_used(path: str) -> set[str]:
    """Every dotted name of Beam that the module at ``path`` uses: what it imports,
    the attributes it reads of those (up to the first dunder), and the names of
    Beam's modules and objects its strings hold (docstrings aside)."""
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read())
    bound, used = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "apache_beam":
                    used.add(alias.name)
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound["apache_beam"] = "apache_beam"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("apache_beam"):
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                used.add(f"{node.module}.{alias.name}")
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    # beam_private's lists of private modules and names are not uses themselves.
    lists = {
        id(constant)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", "") in ("PRIVATE_MODULES", "PRIVATE_NAMES") for t in node.targets)
        for constant in ast.walk(node.value)
    }
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain, current = [], node
            while isinstance(current, ast.Attribute):
                chain.insert(0, current.attr)
                current = current.value
            if isinstance(current, ast.Name) and current.id in bound:
                for index, part in enumerate(chain):
                    if part.startswith("__"):
                        chain = chain[:index]
                        break
                used.add(".".join([bound[current.id], *chain]))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings | lists
        ):
            used.update(_NAMED_IN_TEXT.findall(node.value))
    return used


def _is_private(name: str) -> bool:
    parts = name.split(".")
    return name.startswith(beam_private.PRIVATE_MODULES) or any(
        part.startswith("_") and not part.startswith("__") for part in parts
    )


def _trimmed(name: str) -> str:
    """``name`` up to a method of a builtin value (``_RUNNER_MAP.items``: ``_RUNNER_MAP``)."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for index in range(cut, len(parts)):
            if type(value).__module__ == "builtins" and hasattr(type(value), parts[index]):
                return ".".join(parts[:index])
            value = getattr(value, parts[index], None)
        return name
    return name


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute of one, in the installed Beam."""
    import importlib
    import importlib.util

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            continue
        if cut == len(parts):
            return True
        value = importlib.import_module(module)
        for attr in parts[cut:]:
            if not hasattr(value, attr):
                return False
            value = getattr(value, attr)
        return True
    return False


def _private_uses(folder: str, inside: bool) -> dict[str, set[str]]:
    uses = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            if not name.endswith(".py") or path.startswith(INTERNALS + os.sep) != inside:
                continue
            if name == "_beam_option_table.py":  # generated from Beam: data, not a use
                continue
            private = {_trimmed(n) for n in _beam_names_used(path) if _is_private(n)}
            if private:
                uses[os.path.relpath(path, ROOT)] = private
    return uses


def test_every_private_name_beam_internals_uses_is_listed_and_resolves():
    """After a Beam upgrade: re-read each listed use against the new Beam, then
    move BEAM_VERSION (the version test above fails until then)."""
    uses = _private_uses(INTERNALS, inside=True)
    used = set().union(*uses.values())
    assert used, uses  # the scan sees the imports (it found nothing: the scan is broken)
    unlisted = {
        path: sorted(names - set(beam_private.PRIVATE_NAMES)) for path, names in uses.items()
    }
    assert not any(unlisted.values()), f"not in beam_private.PRIVATE_NAMES: {unlisted}"
    assert len(set(beam_private.PRIVATE_NAMES)) == len(beam_private.PRIVATE_NAMES)
    missing = [name for name in beam_private.PRIVATE_NAMES if not _resolves(name)]
    assert not missing, f"gone from apache-beam {beam_private.installed_beam_version()}: {missing}"
    # A listed name the scan cannot see (an attribute of an object the code is
    # handed) must still be named in the source, or the list has gone stale.
    sources = "".join(
        open(os.path.join(INTERNALS, name), encoding="utf-8").read()
        for name in os.listdir(INTERNALS)
        if name.endswith(".py")
    )
    stale = [
        name
        for name in beam_private.PRIVATE_NAMES
        if name not in used and name.rsplit(".", 1)[-1] not in sources
    ]
    assert not stale, f"listed in beam_private.PRIVATE_NAMES, used nowhere: {stale}"


def test_no_module_outside_beam_internals_uses_beams_private_parts():
    uses = _private_uses(PACKAGE, inside=False)
    assert not uses, f"Beam's private names outside beam_pipeline/beam_internals/: {uses}"


@pytest.mark.parametrize(
    "source, private",
    [
        ("from apache_beam.runners.common import DoFnInvoker", True),
        ("from apache_beam.runners import runner\nrunner._RUNNER_MAP", True),
        ("import apache_beam as beam\nbeam.runners.worker.statesampler.StateSampler", True),
        ("import apache_beam.runners.dask.dask_runner", True),
        ("LOGGER = 'apache_beam.runners.portability.local_job_service'", True),
        ("from apache_beam.pvalue import AsList\nAsList._from_runtime_iterable", True),
        ("import apache_beam as beam\nbeam.Map(len)", False),
        ("from apache_beam.io.filesystems import FileSystems", False),
        ('"""A docstring naming apache_beam.runners.common."""', False),
    ],
)
def test_the_scan_finds_private_names_however_they_are_reached(tmp_path, source, private):
    path = tmp_path / "module.py"
    path.write_text(source + "\n")
    assert any(_is_private(name) for name in _beam_names_used(str(path))) == private


def test_the_dask_runner_is_refused_in_one_line_with_another_beam(tmp_path, monkeypatch, capsys):
    """No public path to fall back to: refused before any work, naming both versions."""
    root = tmp_path / "in"
    make_class_folders(str(root), classes=("a", "b"), per_class=2)
    monkeypatch.setattr(beam_private, "BEAM_VERSION", "0.0.0")
    argv = ["--input", str(root), "--output", str(tmp_path / "o"), "--runner", "DaskRunner"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    installed = beam_private.installed_beam_version()
    assert line.startswith(
        f"error: --runner DaskRunner needs apache-beam 0.0.0, installed is {installed}"
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.e2e
def test_the_dask_runner_module_refuses_another_beam():
    code = (
        "from beam_pipeline.beam_internals import beam_private\n"
        "beam_private.BEAM_VERSION = '0.0.0'\n"
        "from beam_pipeline.core.errors import UsageError\n"
        "try:\n"
        "    import beam_pipeline.beam_internals.dask_runner\n"
        "except UsageError as error:\n"
        "    print(error)\n"
        "import sys\n"
        "print('apache_beam.runners.common' in sys.modules)\n"
    )
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    refused, loaded = result.stdout.strip().splitlines()
    assert refused.startswith("--runner DaskRunner needs apache-beam 0.0.0")
    assert loaded == "False"  # refused before any of Beam's private modules was imported
