"""What this project uses of Apache Beam's private modules, fenced in one place.

:data:`PRIVATE_NAMES` lists every private name of Beam the package uses (here,
``beam_options.py``, ``dask_runner.py``), read against :data:`BEAM_VERSION`;
``tests/test_beam_private.py`` checks both. Each trick only makes a local run start or
end sooner or keeps its stderr to one ``error:`` line, and falls back to Beam's public
path with one warning when a Beam upgrade breaks it:

* :func:`import_beam_for_local_run`: optional packages hidden while Beam is imported;
* :func:`shorten_state_sampling`: a shorter state-sampler period;
* :func:`direct_fn_api_runner`: the FnApiRunner without DirectRunner's Prism attempt;
  ``multi_processing`` workers' stderr to ``workers.log``, SIGINT ignored;
* :func:`stop_sdk_workers`: those workers killed on the CLI's Ctrl-C;
* :func:`fast_exit`: ``os._exit`` once every output is closed.

Why each exists: docs/architecture.md, "Beam's private names".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time

# The Beam these tricks were read against. Move it only after re-reading each
# trick against the new Beam's source (tests/test_beam_private.py).
BEAM_VERSION = "2.77.0"

_log = logging.getLogger(__name__)

# Beam's modules that are not its public API: whatever this project uses of
# them, or of any name with a leading underscore, is listed in PRIVATE_NAMES.
PRIVATE_MODULES = (
    "apache_beam.internal",
    "apache_beam.runners.common",
    "apache_beam.runners.dask",
    "apache_beam.runners.direct",
    "apache_beam.runners.portability",
    "apache_beam.runners.worker",
    "apache_beam.transforms.sideinputs",
)

# Every name of Beam's private parts that beam_pipeline uses, all of them in
# beam_internals/ (read against BEAM_VERSION). tests/test_beam_private.py
# finds each use in the source (imports, attributes, names in strings), checks
# it is listed here and resolves on the installed Beam, and that no module
# outside beam_internals/ uses one.
PRIVATE_NAMES = (
    # beam_private.py: the local-speed tricks
    "apache_beam.runners.worker.statesampler",
    "apache_beam.runners.worker.statesampler.StateSampler",
    "apache_beam.runners.worker.statesampler.DEFAULT_SAMPLING_PERIOD_MS",
    "apache_beam.runners.portability.fn_api_runner.fn_runner",
    "apache_beam.runners.portability.fn_api_runner.fn_runner.ExtendedProvisionInfo",
    "apache_beam.runners.portability.fn_api_runner.fn_runner.FnApiRunner",
    "apache_beam.runners.portability.portable_runner.JobServiceHandle",
    "apache_beam.runners.portability.portable_runner.JobServiceHandle.encode_pipeline_options",
    "apache_beam.runners.worker.sdk_worker_main",
    # beam_private.py: Beam's loggers the command line quiets (__main__.py)
    "apache_beam.runners.common",
    "apache_beam.runners.portability.local_job_service",
    # beam_options.py: the table of Beam's flags
    "apache_beam.options.pipeline_options.PipelineOptions._add_argparse_args",
    "apache_beam.runners.runner._RUNNER_MAP",
    "apache_beam.runners.dask.dask_runner",
    "apache_beam.runners.dask.dask_runner.DaskRunner",
    # dask_runner.py: the fixed Dask translation
    "apache_beam.internal.pickler",
    "apache_beam.internal.pickler.dumps",
    "apache_beam.internal.pickler.loads",
    "apache_beam.runners.common.DoFnContext",
    "apache_beam.runners.common.DoFnInvoker",
    "apache_beam.runners.common.DoFnInvoker.create_invoker",
    "apache_beam.runners.common.DoFnSignature",
    "apache_beam.runners.common.Receiver",
    "apache_beam.runners.common._OutputHandler",
    "apache_beam.runners.dask.dask_runner.DaskOptions",
    "apache_beam.runners.dask.dask_runner.DaskOptions._extract_bag_kwargs",
    "apache_beam.runners.dask.dask_runner.DaskRunnerResult",
    "apache_beam.runners.dask.dask_runner.dask_overrides",
    "apache_beam.runners.dask.overrides._Reshuffle",
    "apache_beam.runners.dask.transform_evaluator",
    "apache_beam.runners.dask.transform_evaluator.Create",
    "apache_beam.runners.dask.transform_evaluator.Flatten",
    "apache_beam.runners.dask.transform_evaluator.NoOp",
    "apache_beam.runners.dask.transform_evaluator.TRANSLATIONS",
    "apache_beam.runners.dask.transform_evaluator.get_windowed_value",
    "apache_beam.transforms.sideinputs.SideInputMap",
    "apache_beam.pvalue.AsSideInput._view_options",
)

# Beam's loggers that the command line quiets (__main__.py): the one that logs
# an error raised in a step, with its traceback, before re-raising it; and the
# local job service's, which relays multi_processing workers' start-up chatter.
STEP_ERRORS_LOGGER = "apache_beam.runners.common"
JOB_SERVICE_LOGGER = "apache_beam.runners.portability.local_job_service"


@functools.cache
def installed_beam_version() -> str | None:
    """The installed apache-beam's version, read without importing Beam."""
    from importlib import metadata

    try:
        return metadata.version("apache-beam")
    except metadata.PackageNotFoundError:  # pragma: no cover - Beam is a dependency
        return None


def _fell_back(trick: str, problem: BaseException | str, fallback: str) -> None:
    """The one warning line of a trick that no longer fits the installed Beam."""
    if isinstance(problem, BaseException):
        text = str(problem).strip().splitlines()
        problem = f"{type(problem).__name__}: {text[0] if text else ''}".rstrip(": ")
    _log.warning(
        "beam_private.%s skipped (%s); %s. It was written against apache-beam %s, "
        "installed is %s: re-check beam_pipeline/beam_internals/beam_private.py",
        trick,
        problem,
        fallback,
        BEAM_VERSION,
        installed_beam_version(),
    )


def require_beam_version(what: str, instead: str) -> None:
    """Refuses ``what`` (something with no public fallback) unless the installed
    Beam is :data:`BEAM_VERSION`, in one line saying what to do instead.

    Raises:
        UsageError: another Beam is installed.
    """
    installed = installed_beam_version()
    if installed != BEAM_VERSION:
        from beam_pipeline.core.errors import UsageError

        raise UsageError(
            f"{what} needs apache-beam {BEAM_VERSION}, installed is {installed}: its fixes "
            f"to Beam's private modules were written against {BEAM_VERSION} "
            f"(pip install 'apache-beam[gcp]=={BEAM_VERSION}'), or {instead}"
        )


def require_beam_for_dask() -> None:
    """--runner DaskRunner: only with :data:`BEAM_VERSION` (dask_runner.py's fixes
    replace parts of Beam's Dask translation; there is no public path to fall back to)."""
    require_beam_version("--runner DaskRunner", "run the job on DirectRunner or DataflowRunner")


# ------------------------------------------------------------ import Apache Beam

# Optional packages that ``import apache_beam`` loads whenever they are installed
# (Beam guards each import with ``except ImportError``): MongoDB IO, Pub/Sub IO,
# Arrow type conversion, BigQuery IO and the Dataflow API client.
_UNUSED_BEAM_EXTRAS = (
    "pymongo",
    "bson",
    "pyarrow",
    "google.cloud.pubsub",
    "google.cloud.pubsub_v1",
    "google.cloud.bigquery",
    "google.cloud.bigquery_storage_v1",
    "google.cloud.dataflow",
    "google.cloud.dataflow_v1beta3",
)
# What only a run touching Google Cloud needs: Beam's GCS filesystem and GCP
# auth helpers (the Cloud Storage client and the API client library under them,
# with their HTTP and crypto stack), and Beam's BigQuery IO module, which
# apache_beam.io imports even without the BigQuery client (google.auth,
# requests, regex). Hidden only when the input and the output are both local,
# so Beam registers no gs:// filesystem in that process.
_CLOUD_ONLY_MODULES = ("google.cloud.storage", "apitools", "apache_beam.io.gcp.bigquery")


def import_beam_for_local_run(uses_gcs: bool = True) -> None:
    """Imports Apache Beam without the optional packages a local run never uses.

    The packages are hidden only during the import and importable again after
    it; Beam's modules that wanted them stay in their "not installed" state.
    Only with :data:`BEAM_VERSION`, whose imports were checked: if a Beam
    imported a hidden package unguarded, the failed import could not be
    undone in this process (Beam's compiled modules do not load twice), so
    any other Beam is imported plainly.

    Args:
        uses_gcs: Some path is on gs://: keep Beam's GCS filesystem.
    """
    if "apache_beam" in sys.modules:
        return
    installed = installed_beam_version()
    if installed != BEAM_VERSION:
        _fell_back(
            "import_beam_for_local_run",
            f"its hidden packages were checked on Beam {BEAM_VERSION} only",
            "importing Beam with all its packages",
        )
        import apache_beam  # noqa: F401

        return
    unused = _UNUSED_BEAM_EXTRAS if uses_gcs else _UNUSED_BEAM_EXTRAS + _CLOUD_ONLY_MODULES
    hidden = [name for name in unused if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # makes `import name` raise ImportError
    mongo_log = logging.getLogger("apache_beam.io.mongodbio")
    level = mongo_log.level
    mongo_log.setLevel(logging.ERROR)  # "Could not find a compatible bson package."
    try:
        import apache_beam  # noqa: F401
    finally:
        mongo_log.setLevel(level)
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


# ------------------------------------------------------------- state sampling

# The state sampler's period for bundles run in this process, instead of
# Beam's DEFAULT_SAMPLING_PERIOD_MS (200).
LOCAL_STATE_SAMPLING_MS = 20


def shorten_state_sampling() -> bool:
    """Lowers the state sampler's period for bundles run in this process.

    The sampler thread runs without the GIL, so sampling more often costs
    nothing measurable. Applied only while Beam's default is in place (or
    already lowered here).

    Returns:
        Whether the shorter period is in force.
    """
    try:
        from apache_beam.runners.worker import statesampler

        init = statesampler.StateSampler.__init__
        names = init.__code__.co_varnames[: init.__code__.co_argcount]
        if init.__defaults__ == (LOCAL_STATE_SAMPLING_MS,):
            return True
        if names[-1:] != ("sampling_period_ms",) or init.__defaults__ != (
            statesampler.DEFAULT_SAMPLING_PERIOD_MS,
        ):
            raise TypeError(
                f"StateSampler.__init__{names} has defaults {init.__defaults__}, "
                "not sampling_period_ms=DEFAULT_SAMPLING_PERIOD_MS"
            )
        init.__defaults__ = (LOCAL_STATE_SAMPLING_MS,)
        return True
    except Exception as error:
        _fell_back("shorten_state_sampling", error, "keeping Beam's sampling period")
        return False


# ------------------------------------------------------ DirectRunner, no Prism


# The command line FnApiRunner.run_pipeline gives multi_processing's workers
# (with sys.executable); the only one rewritten.
_SDK_WORKER_MODULE = "apache_beam.runners.worker.sdk_worker_main"
_SDK_WORKER_COMMAND = "{python} -m " + _SDK_WORKER_MODULE

# Prefixed to that command line (run by ``sh -c``): the worker ignores SIGINT (a
# signal ignored at exec stays ignored, and Python then installs no handler).
# A terminal's Ctrl-C reaches the whole process group; a worker that died of it
# would have Beam's job service relay its CRITICAL "sdk harness failed"
# traceback, and Beam's threads here report the broken streams, before this
# process had quieted them. The command line stops the workers itself, after
# (stop_sdk_workers). ``exec``: the worker is this process's own child.
_IGNORE_CTRL_C = "trap '' INT; exec "

# Set while this process runs a pipeline whose workers ignore Ctrl-C
# (stop_sdk_workers), cleared as the runner returns.
_running_workers_that_ignore_ctrl_c = threading.Event()
# How often workers that appear after a Ctrl-C are looked for, until the runner returns.
_STOP_LATE_WORKERS_EVERY_S = 0.05


def direct_fn_api_runner(all_options: dict, workers_log: str | None = None):
    """The runner DirectRunner uses for a batch pipeline, without its Prism attempt.

    With ``multi_processing``, its worker processes ignore Ctrl-C
    (:func:`stop_sdk_workers` stops them).

    Args:
        all_options: ``PipelineOptions.get_all_options()`` of the job.
        workers_log: A local file that multi_processing's worker processes
            append their stderr to, instead of the CLI's stderr; None: leave it.

    Returns:
        The FnApiRunner, configured as DirectRunner configures it; None when
        that no longer works with the installed Beam: the caller then lets
        Beam pick its DirectRunner from the options.
    """
    try:
        from apache_beam.portability.api import beam_provision_api_pb2
        from apache_beam.runners.portability.fn_api_runner import fn_runner
        from apache_beam.runners.portability.portable_runner import JobServiceHandle

        info = beam_provision_api_pb2.ProvisionInfo(
            pipeline_options=JobServiceHandle.encode_pipeline_options(all_options)
        )
        provision = fn_runner.ExtendedProvisionInfo(info)
        if all_options.get("direct_running_mode") != "multi_processing":
            return fn_runner.FnApiRunner(provision_info=provision)
    except Exception as error:
        _fell_back("direct_fn_api_runner", error, "using Beam's DirectRunner")
        return None
    return _runner_with_worker_command(fn_runner.FnApiRunner, workers_log)(provision_info=provision)


def worker_command(command: str, workers_log: str | None) -> str:
    """The shell command line that runs the worker ``command``: Ctrl-C ignored, and
    its stderr appended to ``workers_log`` (None: left alone)."""
    import shlex

    redirect = f" 2>>{shlex.quote(workers_log)}" if workers_log else ""
    return f"{_IGNORE_CTRL_C}{command}{redirect}"


def _runner_with_worker_command(base, workers_log: str | None):
    """A FnApiRunner class whose multi_processing workers ignore Ctrl-C and, with a
    ``workers_log``, append their stderr to it (:func:`worker_command`).

    The worker command is rewritten in the pipeline proto, where
    ``run_pipeline`` put it, just before ``run_via_runner_api`` starts the
    workers; nothing outside this runner changes.
    """

    class FnApiRunnerWithWorkerCommand(base):
        def run_via_runner_api(self, pipeline_proto, options):
            try:
                from apache_beam.portability import python_urns

                command = _SDK_WORKER_COMMAND.format(python=sys.executable)
                found = [
                    env
                    for env in pipeline_proto.components.environments.values()
                    if env.urn == python_urns.SUBPROCESS_SDK
                    and env.payload == command.encode("utf-8")
                ]
                if not found:
                    raise LookupError(f"no worker environment runs {command!r}")
                for env in found:
                    env.payload = worker_command(command, workers_log).encode("utf-8")
                _running_workers_that_ignore_ctrl_c.set()
            except Exception as error:
                _fell_back(
                    "direct_fn_api_runner",
                    error,
                    "multi_processing's workers print to this process's stderr and die of "
                    "a Ctrl-C themselves",
                )
            try:
                return super().run_via_runner_api(pipeline_proto, options)
            finally:
                _running_workers_that_ignore_ctrl_c.clear()

    return FnApiRunnerWithWorkerCommand


def parent_pid(stat: bytes) -> int:
    """The parent's PID in a ``/proc/PID/stat`` line (the command name, in
    parentheses, may itself hold spaces and parentheses)."""
    return int(stat.rpartition(b")")[2].split()[1])


def _sdk_worker_children() -> list[int]:
    """The PIDs of this process's children that run Beam's SDK worker (Linux's /proc)."""
    found = []
    me = os.getpid()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    if parent_pid(stat.read()) != me:
                        continue
                with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                    if _SDK_WORKER_MODULE.encode() in cmdline.read():
                        found.append(int(name))
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
    return found


def _kill_sdk_workers() -> None:
    for pid in _sdk_worker_children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stop_late_workers() -> None:
    # Beam starts each worker from a thread of its own: one whose start had
    # begun at the Ctrl-C appears after the first sweep, and Beam's shutdown
    # would wait for it for ever (it ignores the Ctrl-C, and no work comes).
    while _running_workers_that_ignore_ctrl_c.is_set():
        _kill_sdk_workers()
        time.sleep(_STOP_LATE_WORKERS_EVERY_S)


def stop_sdk_workers() -> None:
    """Kills the multi_processing worker processes this process started, which
    ignore Ctrl-C: for the command line's Ctrl-C, once it has quieted what
    reports their end. Beam's own shutdown then finds them gone instead of
    waiting for their bundles to finish; one Beam starts meanwhile is killed as
    it appears, until the runner returns. Does nothing where no such run is on."""
    if not _running_workers_that_ignore_ctrl_c.is_set():
        return
    _kill_sdk_workers()
    threading.Thread(target=_stop_late_workers, name="stop-late-workers", daemon=True).start()


# ------------------------------------------------------------------ fast exit


def fast_exit(status: int) -> None:
    """Ends the process now, without the interpreter's teardown. Does not return.

    For ``python -m beam_pipeline`` only, after every output is closed and
    renamed. ``os._exit`` also skips multiprocessing's clean-up, so that part
    is done here. With any Beam but :data:`BEAM_VERSION` (whose exit-time
    work was not checked) and if the clean-up fails, the interpreter exits
    normally instead.
    """
    try:
        # Without Beam in the process (the local engine) there is no Beam exit-time
        # work to skip, and no need to read its version.
        installed = BEAM_VERSION if "apache_beam" not in sys.modules else installed_beam_version()
        if installed != BEAM_VERSION:
            raise RuntimeError(f"its exit-time work was checked on Beam {BEAM_VERSION} only")
        import multiprocessing

        for child in multiprocessing.active_children():
            child.terminate()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception as error:
        _fell_back("fast_exit", error, "exiting normally")
        sys.exit(status)
    os._exit(status)
