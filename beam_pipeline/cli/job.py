"""One conversion job, shaped like Beam's wordcount: arguments -> config -> build -> run -> summary.

:func:`run` runs the steps, each taking the typed value the one before returns, so they
run in one order only (docs/architecture.md, "One run of the local engine").
"""

from __future__ import annotations

import os

# The local conversion pool forks; gRPC (loaded by Beam) then logs that it
# skips its fork handlers. The children never use gRPC, so turn the handlers off
# before gRPC is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import contextlib  # noqa: E402
import dataclasses
import gc
import json
import sys
import time
from typing import ClassVar

from beam_pipeline.beam_internals import beam_options, beam_private
from beam_pipeline.cli import arguments, summary
from beam_pipeline.core import errors, metadata, spill
from beam_pipeline.core.errors import UsageError
from beam_pipeline.engines import choice, local_engine, local_pool, progress
from beam_pipeline.features.reuse import stage as reuse
from beam_pipeline.stages import convert, resume
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.storage import discovery, gcs, paths, reading
from beam_pipeline.storage import lock as output_lock

# Images converted while Beam loads (enough to cover its start-up on web-size
# images), and a bound on the results held before the pipeline claims them.
CONVERT_AHEAD_LIMIT = 1024
CONVERT_AHEAD_BYTES = 512 * 2**20  # of source files

# The stderr of DirectRunner's multi_processing worker processes (not with --verbose):
# Beam's worker prints a traceback per failed bundle there.
WORKERS_LOG = "workers.log"


def check_output(
    output: paths.Place,
    input_root: paths.Place | None,
    overwrite: bool,
    config: JobConfig | None = None,
) -> None:
    """Refuses an output inside the input, one we cannot write to, one holding
    links or others' files, or a finished dataset (unless --overwrite). Reads only.

    An unfinished run of this job is resumed, and ``config``'s own published
    dataset has its clean-up finished; :func:`resume.prepare` decides.
    """

    out = output  # a place (paths.place, where the flag entered)
    # As places (symbolic links and ".." resolved, and as filesystem objects:
    # paths.inside), not as strings: no spelling of the input is written to.
    if input_root and paths.inside(out, input_root):
        raise UsageError(f"--output {output} lies inside --input; choose a folder outside it")
    if paths.is_gcs(out):
        gcs.check_output(out)
    elif paths.is_local(out):
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--output {output} is a file, not a folder")
    resume.check(out, overwrite, config)


def check_reuse(config: JobConfig, say) -> None:
    """--reuse: a finished dataset of the same image settings, all its shards there,
    not --output under any spelling. Reads only its metadata and lists its
    shards (reuse.py)."""

    if config.reuse:
        old = reuse.open_old(config.reuse, config.image)
        reuse.check(old, config.output, config.image)
        note = reuse.version_note(old)
        if note:
            say(note)


def _report_leftovers(found: resume.Leftovers, output: str, resumable: int, say) -> None:
    """Says what the run does with an earlier run's files (``resumable``: its records kept)."""

    if found.kind == "unfinished":
        if resumable:
            say(
                f"imagerecords: resuming the unfinished run in {output}: "
                f"{resumable} images already converted"
            )
        else:
            say(f"imagerecords: starting over the unfinished run in {output}")


def _describe_input(layout, say) -> None:
    if layout.kind == "manifest":
        say(
            f"imagerecords: {layout.num_manifest_rows} images in manifest, {len(layout.classes)} classes"
        )
    else:
        say(
            f"imagerecords: {len(layout.classes)} classes in {len(layout.folders)} folders "
            f"({layout.kind} layout) under {layout.root}"
        )


@contextlib.contextmanager
def _collector_skips_the_graph():
    """Python's cycle collector leaves alone what exists now, until the block ends.

    Beam's modules and the pipeline graph (about 100,000 objects) live for the
    whole run, yet every full collection walks them again, and a local run
    does all its work inside ``p.run()`` in this process. Nothing is leaked:
    whatever was frozen goes back to the collector afterwards.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def build_and_run(
    config,
    beam_flags,
    wait: bool,
    say,
    workers_log: str | None = None,
    pool=None,
    shown: progress.Reporter = progress.SILENT,
):
    """Builds the pipeline for ``config``, runs it on the chosen runner; the result,
    or None when not waiting (``wait`` false, or a Dataflow template was written).

    ``beam_flags``: Beam's flags (``choice.with_local_defaults``'s).
    ``workers_log``: a local file for the stderr of DirectRunner's
    multi_processing worker processes (None: they share this process's stderr).
    ``pool``: the local conversion processes (``local_pool.Pool``) for the pooled path.
    ``shown``: where the conversion's progress goes when it runs in this process.
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipeline.engines import pipeline

    if beam_flags.on_dask:
        import beam_pipeline.beam_internals.dask_runner  # noqa: F401  registers Beam's --dask_* options

    options = PipelineOptions(list(beam_flags.args))
    runner_name = beam_flags.runner or beam_options.DIRECT
    runner = None
    if beam_flags.on_direct_runner:
        beam_private.shorten_state_sampling()
        mode = beam_flags.direct_running_mode
        if mode != "multi_processing":
            workers_log = None
        elif workers_log:
            os.makedirs(os.path.dirname(workers_log), exist_ok=True)
            open(workers_log, "w").close()  # a resumed run's log starts empty
        runner = beam_private.direct_fn_api_runner(options.get_all_options(), workers_log)
        workers = choice.direct_workers(beam_flags, config.conversion_processes)
        runner_name = f"DirectRunner ({mode}, {workers} conversion processes)"
    elif beam_flags.on_dask:
        # Beam knows the Dask runner by its dotted path only; all these names
        # get the fixed one (beam_pipeline/beam_internals/dask_runner.py).
        from beam_pipeline.beam_internals.dask_runner import DaskRunner

        runner = DaskRunner()
        scheduler_file = beam_flags.get("scheduler_file")  # --dask_scheduler_file
        address = (
            beam_flags.get("address")  # --dask_client_address
            or (scheduler_file and f"scheduler file {scheduler_file}")
            or "a new local Dask cluster"
        )
        runner_name = f"DaskRunner ({address})"
    say(f"imagerecords: running on {runner_name}")
    try:
        p = beam.Pipeline(runner=runner, options=options)
    except (ImportError, ValueError, AttributeError) as error:  # a runner Beam cannot make
        raise UsageError(f"--runner {runner_name}: {error}") from None
    in_process = beam_flags.on_direct_runner and beam_flags.direct_running_mode == "in_memory"
    pipeline.build(p, config, pool, shown if in_process else None)

    gcs.bound_retries()  # Beam's GCS client is loaded now
    with _collector_skips_the_graph():
        result = p.run()
    template = beam_flags.template_location
    if template:
        # DataflowRunner wrote the job description and staged the job; nothing
        # runs until someone launches the template.
        print(f"imagerecords: wrote the Dataflow template {template}; no job was started")
        return None
    if not wait:
        job = getattr(result, "job_id", lambda: None)()
        print(f"imagerecords: submitted{f' job {job}' if job else ''}; not waiting (--wait=false)")
        return None
    try:
        result.wait_until_finish()
    finally:
        client = getattr(result, "client", None)  # DaskRunner's connection to the scheduler
        if client is not None:
            client.close()
    return result


def _workers_log_path(output: str) -> str:
    """Where multi_processing's worker processes write their stderr (always local)."""

    if "://" not in output:
        return os.path.join(output, metadata.TMP_DIR, WORKERS_LOG)
    return os.path.join(spill.default_dir(output), WORKERS_LOG)


def _point_to_workers_log(workers_log: str | None) -> None:
    """One plain line before the ``error:`` line: where the workers' tracebacks went."""
    if workers_log and os.path.isfile(workers_log) and os.path.getsize(workers_log):
        print(f"imagerecords: the worker processes' messages are in {workers_log}", file=sys.stderr)


# ------------------------------------------------------------------ the steps
#
# run() is these steps in this order; each takes the value the one before it
# returns, so the order is the data flow. The order matters: the conversion
# processes fork before the resume index is read (children that inherited it
# would each map, and count, its pages) and before anything starts a thread
# (Beam's runner and gRPC, the gs:// lock's heartbeat: see local_pool), and
# Beam is imported only once they have forked.


class StepOutOfOrder(TypeError):
    """A step of :func:`run` was given something other than what the step before it returns."""


def _require(value, kind: type, step: str) -> None:
    if not isinstance(value, kind):
        raise StepOutOfOrder(
            f"job.{step} takes the {kind.__name__} that job.{kind.made_by} returns, "
            f"not {type(value).__name__}: the steps of job.run go in its order"
        )


@dataclasses.dataclass(frozen=True)
class Checked:
    """The job, checked: every refusal made, nothing written (:func:`check`)."""

    made_by: ClassVar[str] = "check"
    config: JobConfig  # its layout found
    options: arguments.RunOptions
    engine: choice.Engine  # which, Beam's flags as run, the local processes
    spill_dir: str | None  # where the local pool spills (None: no pool)
    workers_log: str | None  # multi_processing workers' stderr (None: this process's)

    @property
    def template(self) -> str | None:
        """The Dataflow template this run writes instead of running a job."""
        return self.engine.beam.given("template_location")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """--output locked and made ready: an earlier run's files cleared or kept (:func:`prepare`)."""

    made_by: ClassVar[str] = "prepare"
    checked: Checked
    # None: a template build, which writes nothing there.
    held: output_lock.LocalLock | output_lock.GcsLock | None
    found: resume.Leftovers


@dataclasses.dataclass(frozen=True)
class Forked:
    """The local conversion processes forked, before any thread (:func:`fork`)."""

    made_by: ClassVar[str] = "fork"
    prepared: Prepared
    pool: local_pool.Pool | None


@dataclasses.dataclass(frozen=True)
class Resumed:
    """An earlier run's spilled records read, after the fork (:func:`read_leftovers`)."""

    made_by: ClassVar[str] = "read_leftovers"
    forked: Forked
    done: spill.Index | dict  # image ID -> its spilled record

    @property
    def checked(self) -> Checked:
        return self.forked.prepared.checked


@dataclasses.dataclass(frozen=True)
class Launched:
    """Beam's graph about to run: conversion begun ahead, Beam imported, the lock's
    heartbeat started (:func:`launch`)."""

    made_by: ClassVar[str] = "launch"
    resumed: Resumed


def check(command: arguments.Command, say) -> Checked:
    """Finds the input and makes every refusal before anything is written: --reuse,
    --output, the engine. Reads only.

    Local input and output are checked without Beam, so that the conversion
    processes can start (and start converting) while Beam loads.
    """
    options, given_beam = command.options, command.beam
    if not options.wait and given_beam.on_dask:
        raise UsageError("--wait=false is for Dataflow: a Dask job stops when its client leaves")
    # Every process of this run (forked or started) retries GCS this long at most.
    gcs.set_timeout(options.gcs_timeout_s)
    config = arguments.discover(command).config
    layout, output = config.layout, config.output
    # OLD first: an --output that is OLD is refused as such.
    check_reuse(config, say)
    root = layout.root if layout.kind != "manifest" else None
    check_output(output, root, options.overwrite, config)
    engine = choice.plan(given_beam, options.local_processes, layout, output)
    spill_dir = config.spill_directory if engine.pooled else None
    workers_log = None if options.verbose or engine.local else _workers_log_path(output)
    return Checked(config, options, engine, spill_dir, workers_log)


def prepare(checked: Checked, held: output_lock.LocalLock | output_lock.GcsLock | None) -> Prepared:
    """Makes --output ready under its lock ``held`` (``resume.prepare``); a template
    build writes nothing there."""
    _require(checked, Checked, "prepare")
    if checked.template:
        found = resume.Leftovers("empty")
    else:
        config = checked.config
        settings_key = resume.key(config)
        found = resume.prepare(
            config.output, settings_key, checked.options.overwrite, checked.spill_dir, config
        )
    return Prepared(checked, held, found)


def fork(prepared: Prepared) -> Forked:
    """Forks the local conversion processes, where the job has any."""
    _require(prepared, Prepared, "fork")
    checked = prepared.checked
    engine = checked.engine
    return Forked(prepared, local_pool.start(engine.processes) if engine.pooled else None)


def read_leftovers(forked: Forked, say) -> Resumed:
    """Reads what an earlier, unfinished run spilled, and says what the run does with it."""
    _require(forked, Forked, "read_leftovers")
    checked = forked.prepared.checked
    done = spill.load_index(checked.spill_dir) if checked.spill_dir else {}
    _report_leftovers(forked.prepared.found, checked.config.output, len(done), say)
    return Resumed(forked, done)


def run_local(resumed: Resumed, say) -> dict[str, int]:
    """Runs the job on the local engine with the forked processes; its counters."""
    _require(resumed, Resumed, "run_local")
    checked, pool = resumed.checked, resumed.forked.pool
    _describe_input(checked.config.layout, say)
    say(
        f"imagerecords: running on the local engine ({pool.processes} conversion processes; "
        "--runner DirectRunner runs the same job on Beam)"
    )
    shown = progress.Reporter(enabled=not checked.options.quiet)
    with _collector_skips_the_graph():
        return local_engine.run(checked.config, shown, pool)


def launch(resumed: Resumed, say) -> Launched:
    """Readies a Beam run: the pool converts the first images while Beam is
    imported, then the lock's heartbeat (a thread) starts."""
    _require(resumed, Resumed, "launch")
    checked, pool = resumed.checked, resumed.forked.pool
    config = checked.config
    if pool is not None:
        _convert_ahead(config, pool, resumed.done)
        uses_gcs = not choice.all_local(config.layout, config.output) or paths.is_gcs(
            config.reuse or ""
        )
        beam_private.import_beam_for_local_run(uses_gcs=uses_gcs)
    held = resumed.forked.prepared.held
    if held is not None:
        held.start_heartbeat()
    _describe_input(config.layout, say)
    return Launched(resumed)


def run_beam(launched: Launched, say):
    """Runs the Beam graph (:func:`build_and_run`); its result, None when not waited for."""
    _require(launched, Launched, "run_beam")
    resumed = launched.resumed
    checked = resumed.checked
    shown = progress.Reporter(enabled=not checked.options.quiet)
    try:
        return build_and_run(
            checked.config,
            checked.engine.beam,
            checked.options.wait,
            say,
            checked.workers_log,
            resumed.forked.pool,
            shown,
        )
    except BaseException:
        _point_to_workers_log(checked.workers_log)
        raise


def _convert_ahead(config: JobConfig, pool: local_pool.Pool, done) -> None:
    """Has the conversion processes convert the first images while Beam loads."""

    layout = config.layout
    # (Under --reuse most images need no conversion: none is begun ahead.)
    if layout.kind != "manifest" and paths.is_local(layout.root) and not config.reuse:
        refs = discovery.local_refs(
            layout,
            CONVERT_AHEAD_LIMIT,
            CONVERT_AHEAD_BYTES,
            config.seed,
            config.splits,
            config.group_by,
        )
        pending = [ref for ref in refs if ref.image_id not in done]
        pool.convert_ahead(pending, convert.SpillTask.of(config))


def _say(quiet: bool):
    if quiet:
        return lambda *a: None
    return lambda *a: print(*a, file=sys.stderr, flush=True)


def run(argv: list[str] | None = None, parsed=None) -> dict:
    """Validates arguments, then runs the steps above in order; returns
    imagerecords.json, parsed.

    Args:
        argv: The command line (default ``sys.argv[1:]``).
        parsed: The :class:`arguments.Command` of it, when already parsed.

    Raises:
        UsageError: bad arguments or input, before any work starts.
        lock.OutputInUse: another live run writes --output (a UsageError).
        BooksDoNotBalance: the job lost, doubled or rejected too many images.
        errors.RunStopped: GCS out of reach for --gcs_timeout_s, a file that
            could not be written (the error names it).
    """
    command = parsed or arguments.parse_args(list(sys.argv[1:] if argv is None else argv))
    if command.options.dry_run:
        from beam_pipeline.cli import dryrun

        return dryrun.run(command, check_output)
    started, cpu_started = time.monotonic(), summary.cpu_seconds()
    say = _say(command.options.quiet)
    checked = check(command, say)
    output = checked.config.output
    with _owning(output, lock=not checked.template) as held:
        prepared = prepare(checked, held)
        if prepared.found.kind == "done":  # this command's dataset, its clean-up finished
            say(
                f"imagerecords: {output} already holds the dataset of this command; its run "
                "was stopped while it cleared its temporary folder, and that is done now"
            )
            return _finish(output, started, cpu_started, {}, True)
        try:
            try:
                resumed = read_leftovers(fork(prepared), say)
                if checked.engine.local:
                    counted = run_local(resumed, say)
                    return _finish(output, started, cpu_started, counted, True)
                result = run_beam(launch(resumed, say), say)
            finally:
                # On every way out (an error, Ctrl-C): no conversion process outlives the run.
                local_pool.shutdown_all()
                spill.forget_indexes()
        except UsageError:
            if prepared.found.kind == "empty":  # nothing of value was there: leave nothing behind
                resume.discard(output, checked.spill_dir)
            raise
        workers_log = checked.workers_log
        if workers_log and os.path.exists(workers_log):
            # (a local output's temp folder goes with the lock; a gs:// one's spill stays)
            os.remove(workers_log)
        if result is None:
            return {}  # --wait=false: submitted; the lock covered the launch only
        counted = summary.counters(result)
        return _finish(output, started, cpu_started, counted, checked.engine.beam.on_direct_runner)


@contextlib.contextmanager
def _owning(output: str, lock: bool):
    """Holds --output's lock (lock.py) for the block: taken before the output is
    prepared, given back on every way out, after the metadata file and the summary.

    Yields the lock (None when ``lock`` is false).

    Raises:
        lock.OutputInUse: another live run holds it.
        lock.OutputTakenOver: another run took a gs:// lock this run could not renew.
    """

    held = output_lock.acquire(output) if lock else None
    try:
        yield held
    except BaseException as error:
        if held is not None and held.lost:
            raise output_lock.OutputTakenOver(
                f"another run took over --output {output} while this run could not renew its "
                f"lock for {output_lock.STALE_AFTER} heartbeats (GCS out of reach?); this run "
                f"stopped: let the other run finish, or stop it and {errors.RESUME_HINT}"
            ) from error
        raise
    finally:
        if held is not None:
            held.release()


def _finish(output: str, started: float, cpu_started: float, counted, local: bool) -> dict:
    """Prints the summary of a finished run; its imagerecords.json, parsed."""

    seconds = time.monotonic() - started
    info = json.loads(reading.read_bytes(paths.join(output, metadata.INFO_FILE)))
    cpu = summary.cpu_seconds() - cpu_started if local else None
    print(summary.format_summary(info, seconds, counted, cpu), flush=True)
    return info
