"""One conversion job, shaped like Beam's wordcount: arguments -> config -> build -> run -> summary.

:func:`run` parses the arguments (``arguments.py``), finds the input's
layout, checks ``--output`` and an earlier run's leftovers (``resume.py``),
starts the local conversion processes, turns the arguments into a
:class:`~beam_pipeline.stages.job_config.JobConfig` (``arguments.parse_args`` made it),
runs it on the engine :func:`choice.choose_engine` picks (the local engine, or the
Beam graph: :func:`build_and_run`) and prints the summary (``summary.py``).
Beam's flags are read once, by ``arguments.parse_args``
(:class:`~beam_pipeline.beam_internals.beam_options.BeamFlags`); everything
here reads them from there. The tricks that make a local run fast by reaching
into Beam's private modules live in ``beam_internals/beam_private.py``.
"""

from __future__ import annotations

import os

# The local conversion pool forks; gRPC (loaded by Beam) then logs that it
# skips its fork handlers. The children never use gRPC, so turn the handlers off
# before gRPC is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import contextlib  # noqa: E402
import gc
import json
import sys
import time

from beam_pipeline.beam_internals import beam_options, beam_private
from beam_pipeline.cli import arguments, summary
from beam_pipeline.core import errors, metadata, settings, spill
from beam_pipeline.core.errors import UsageError
from beam_pipeline.engines import choice, local_engine, local_pool, progress
from beam_pipeline.stages import resume, reuse
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


def check_output(output: str, input_root: str | None, overwrite: bool) -> None:
    """Refuses an output inside the input, one we cannot write to, or one holding
    a finished dataset or others' files (unless --overwrite). Reads only.

    An unfinished run of this job is resumed; :func:`resume.prepare` decides.
    """

    out = paths.normalize_root(output)
    # As places (symbolic links and ".." resolved), not as strings: no spelling
    # of the input is written to.
    if input_root and paths.inside(out, input_root):
        raise UsageError(f"--output {output} lies inside --input; choose a folder outside it")
    if paths.is_gcs(out):
        gcs.check_output(out)
    elif paths.is_local(out):
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--output {output} is a file, not a folder")
    resume.check(out, overwrite)


def check_reuse(config: JobConfig, say) -> None:
    """--reuse: a finished dataset of the same image settings, all its shards there,
    not --output under any spelling. Reads only its metadata and lists its
    shards (reuse.py)."""

    if config.reuse:
        old = reuse.open_old(config.reuse)
        reuse.check(old, config.output, settings.image_settings(config.image))
        note = reuse.version_note(old)
        if note:
            say(note)


def _report_leftovers(found, output: str, spill_dir: str | None, say) -> dict:
    """Says what the run does with an earlier run's files; returns the resumable records."""

    if found.others and found.kind != "empty":
        say(
            f"imagerecords: left {len(found.others)} unrelated files in --output, "
            f"e.g. {found.others[0]}"
        )
    done = spill.load_index(spill_dir) if spill_dir else {}
    if found.kind == "unfinished":
        if done:
            say(
                f"imagerecords: resuming the unfinished run in {output}: "
                f"{len(done)} images already converted"
            )
        else:
            say(f"imagerecords: starting over the unfinished run in {output}")
    return done


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

    ``beam_flags``: Beam's flags (``arguments.with_local_defaults``'s).
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
        workers = arguments.direct_workers(beam_flags, config.conversion_processes)
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


def _run_local_engine(config: JobConfig, quiet: bool, pool, say) -> dict[str, int]:
    """Runs the job on the local engine with the conversion processes ``pool``; its counters."""

    processes = pool.processes
    _describe_input(config.layout, say)
    say(
        f"imagerecords: running on the local engine ({processes} conversion processes; "
        "--runner DirectRunner runs the same job on Beam)"
    )
    with _collector_skips_the_graph():
        return local_engine.run(config, progress.Reporter(enabled=not quiet), pool)


def _workers_log_path(output: str) -> str:
    """Where multi_processing's worker processes write their stderr (always local)."""

    if "://" not in output:
        return os.path.join(output, metadata.TMP_DIR, WORKERS_LOG)
    return os.path.join(spill.default_dir(output), WORKERS_LOG)


def _point_to_workers_log(workers_log: str | None) -> None:
    """One plain line before the ``error:`` line: where the workers' tracebacks went."""
    if workers_log and os.path.isfile(workers_log) and os.path.getsize(workers_log):
        print(f"imagerecords: the worker processes' messages are in {workers_log}", file=sys.stderr)


def _convert_ahead(config: JobConfig, pool, spill_dir: str | None, done: dict) -> None:
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
        pool.convert_ahead(
            [ref for ref in refs if ref.image_id not in done],
            (config.image, config.seed, layout.classes, spill_dir),
        )


def run(argv: list[str] | None = None, parsed=None) -> dict:
    """Validates arguments, builds and runs the pipeline; returns imagerecords.json, parsed.

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
    options, given_beam = command.options, command.beam
    if options.dry_run:
        from beam_pipeline.cli import dryrun

        return dryrun.run(command, check_output)
    started, cpu_started = time.monotonic(), summary.cpu_seconds()
    if not options.wait and given_beam.on_dask:
        raise UsageError("--wait=false is for Dataflow: a Dask job stops when its client leaves")
    beam, processes = arguments.with_local_defaults(given_beam, options.local_processes)
    say = (
        (lambda *a: None) if options.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    )

    # Every process of this run (forked or started) retries GCS this long at most.
    gcs.set_timeout(options.gcs_timeout_s)
    # Local input and output are checked without Beam, so that the conversion
    # processes can start (and start converting) while Beam loads.
    config = arguments.discover(command).config
    layout, output = config.layout, config.output
    # Every refusal before anything is written: the output is prepared (cleared
    # with --overwrite) only below. OLD first: an --output that is OLD is refused as such.
    check_reuse(config, say)
    check_output(output, layout.root if layout.kind != "manifest" else None, options.overwrite)
    # (with_local_defaults gave the local engine its processes: one per core by default)
    engine = choice.choose_engine(given_beam, layout, output)
    spill_dir = (
        spill.default_dir(output) if processes > 1 or engine == choice.LOCAL_ENGINE else None
    )
    workers_log = (
        None if options.verbose or engine == choice.LOCAL_ENGINE else _workers_log_path(output)
    )
    template = beam.given("template_location")
    # A template build writes nothing to --output: it neither locks nor prepares it.
    with _owning(output, lock=not template) as held:
        if template:
            found = resume.Leftovers("empty")
        else:
            found = resume.prepare(output, resume.key(config), options.overwrite, spill_dir)
        try:
            try:
                pool = None
                if engine == choice.LOCAL_ENGINE or processes > 1:
                    # Fork the conversion processes before the resume index is read
                    # (children that inherit it would each map, and count, its pages)
                    # and before Beam's runner and gRPC start threads (see local_pool).
                    pool = local_pool.start(processes)
                done = _report_leftovers(found, output, spill_dir, say)
                if engine == choice.LOCAL_ENGINE:
                    counted = _run_local_engine(config, options.quiet, pool, say)
                    return _finish(output, started, cpu_started, counted, True)
                if pool is not None:
                    _convert_ahead(config, pool, spill_dir, done)
                    uses_gcs = not choice.all_local(layout, output) or paths.is_gcs(
                        config.reuse or ""
                    )
                    beam_private.import_beam_for_local_run(uses_gcs=uses_gcs)
                if held is not None:
                    held.start_heartbeat()  # a thread: only once the pool has forked
                _describe_input(layout, say)
                try:
                    shown = progress.Reporter(enabled=not options.quiet)
                    result = build_and_run(
                        config, beam, options.wait, say, workers_log, pool, shown
                    )
                except BaseException:
                    _point_to_workers_log(workers_log)
                    raise
            finally:
                # On every way out (an error, Ctrl-C): no conversion process outlives the run.
                local_pool.shutdown_all()
                spill.forget_indexes()
        except UsageError:
            if found.kind == "empty":  # nothing of value was there: leave nothing behind
                resume.discard(output, spill_dir)
            raise
        if workers_log and os.path.exists(workers_log):
            # (a local output's temp folder goes with the lock; a gs:// one's spill stays)
            os.remove(workers_log)
        if result is None:
            return {}  # --wait=false: submitted; the lock covered the launch only
        counted = summary.counters(result)
        return _finish(output, started, cpu_started, counted, beam.on_direct_runner)


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
