"""Command line: ``python -m beam_pipeline --input PATH --output PATH [...]``.

Flags not listed here are Apache Beam pipeline options (``--runner``,
``--project``, ``--direct_num_workers``, ...) and pass through unchanged.
"""

from __future__ import annotations

import os

# The local conversion pool forks; gRPC (loaded by Beam) then logs that it
# skips its fork handlers. The children never use gRPC, so turn the handlers off
# before gRPC is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import argparse  # noqa: E402
import json
import logging
import re
import resource
import sys
import time
import traceback

from beam_pipeline import beam_options, duplicates, errors, images, keys, metadata
from beam_pipeline.errors import BooksDoNotBalance, UsageError

EXAMPLE = (
    "example: python -m beam_pipeline --input ./flowers --output ./flowers-records "
    "--splits train=0.9,val=0.1 --image_size 256"
)


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# A switch that also takes a value: `--overwrite` and `--overwrite=true` both work,
# as Dataflow Flex Templates pass every parameter as --name=value.
_FLAG = {"nargs": "?", "const": True, "default": False, "type": _boolean, "metavar": "BOOL"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline",
        description="Convert an image-folder dataset into shuffled, split TFRecord shards. "
        "Any other flag is an Apache Beam pipeline option (--runner, --project, ...).",
        epilog=EXAMPLE,
        allow_abbrev=False,
    )
    add = parser.add_argument
    add(
        "--input",
        help="Image root: INPUT/<class>/**/<image>, or INPUT/{train,val,test}/<class>/...; "
        "with --manifest, the folder its relative paths start from",
    )
    add("--output", required=True, help="Output folder (local path or gs://bucket/prefix)")
    add(
        "--manifest",
        help="CSV or JSONL with path,label[,split] rows instead of class folders; relative "
        "paths start from --input if given, else from the manifest's own folder",
    )
    add(
        "--splits",
        default=keys.DEFAULT_SPLITS,
        help="NAME=FRACTION,... summing to 1 (default %(default)s)",
    )
    add("--seed", type=int, default=42, help="Seed of the split and shuffle hashes (default 42)")
    add("--image_size", type=int, default=256, help="Target size in pixels (default 256)")
    add(
        "--resize",
        default="shorter",
        help="shorter: shorter side = size; longer: longer side = size; crop: centre "
        "crop to exactly size x size (smaller images are enlarged first); pad: exactly "
        "size x size, letterboxed with black bars (smaller images are centred, not "
        "enlarged, unless --upscale); none (default shorter)",
    )
    add(
        "--upscale",
        **_FLAG,
        help="Also enlarge images smaller than --image_size (shorter, longer, pad; "
        "crop always does)",
    )
    add("--jpeg_quality", type=int, default=90, help="JPEG quality 1-100 (default 90)")
    add(
        "--resample",
        default="bicubic",
        help="Downscaling filter: bicubic|bilinear (faster, softer)|lanczos (sharper, slower); "
        "default bicubic",
    )
    add(
        "--image_timeout_s",
        type=float,
        default=60.0,
        help="Reject an image whose conversion takes longer than this (default 60; 0: no limit)",
    )
    add(
        "--target_shard_mb", type=float, default=200.0, help="Target shard size in MB (default 200)"
    )
    add("--min_shards", type=int, default=1, help="Minimum shards per split (default 1)")
    add(
        "--max_reject_fraction",
        type=float,
        default=0.01,
        help="Fail (and write no dataset_info.json) if more images are rejected (default 0.01)",
    )
    add("--overwrite", **_FLAG, help="Replace the outputs of an earlier run in --output")
    add(
        "--dedupe",
        **_FLAG,
        help="Keep one image of each group of identical source files (the smallest ID); "
        "reject the others as 'duplicate of <id>' (they do not count towards "
        "--max_reject_fraction). Groups are always reported in duplicates.jsonl",
    )
    add(
        "--index_files",
        **_FLAG,
        help="Also write <shard>.tfrecord.idx files ('offset length' per record, the "
        "format NVIDIA DALI's TFRecord reader needs)",
    )
    add(
        "--local_processes",
        type=int,
        default=None,
        help="DirectRunner in_memory only: convert images in this many local processes, "
        "at least 1 (default: all cores when no --direct_running_mode is given, else 1)",
    )
    add(
        "--dry_run",
        **_FLAG,
        help="Write nothing: list the input, convert a sample in memory and print what the "
        "job would produce (records, bytes and shards per split, likely rejects) and take "
        "(local time, Dataflow vCPU-hours and cost for --machine_type)",
    )
    add("--quiet", **_FLAG, help="Print only the summary")
    add("--verbose", **_FLAG, help="Show the traceback of an error, not only its one line")
    add(
        "--wait",
        type=_boolean,
        default=True,
        metavar="true|false",
        help="Wait for the job and print its summary (default true; a Flex Template "
        "launch passes false and returns once the job is submitted)",
    )
    return parser


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, no usage dump
        raise _ArgumentError(message)


def _runner_name(beam_args: list[str]) -> str | None:
    """The --runner value among the Beam args (the last one wins, as in Beam)."""
    found = re.findall(r"--runner(?:=|\s+)(\S+)", " ".join(beam_args))
    return found[-1] if found else None


def _require_dask(beam_args: list[str]) -> None:
    """Refuses the Dask runner, before any work, where Dask is not installed."""
    from importlib.util import find_spec

    if _runner_name(beam_args) in beam_options.DASK_RUNNER_NAMES and not (
        find_spec("dask") and find_spec("distributed")
    ):
        raise UsageError(
            "the Dask runner needs Dask: pip install 'imagerecords[dask]' "
            "(dask[distributed], here and on every worker)"
        )


def _check_beam_args(beam_args: list[str]) -> None:
    """Every Beam flag and its value, checked without importing Beam (see beam_options)."""
    # The Flex Template launcher may add flags of its own; warn, don't fail.
    lenient = bool(os.environ.get("IMAGERECORDS_LENIENT_OPTIONS"))
    beam_options.check(beam_args, _OWN_FLAGS, lenient=lenient)
    _require_dask(beam_args)


_OWN_FLAGS = {opt for a in build_parser()._actions for opt in a.option_strings}


def parse_args(argv: list[str]):
    """-> (our namespace, beam args). Raises UsageError for any bad argument, Beam's included.

    Imports no Beam, so a bad flag is refused before any process is forked.
    """
    parser = build_parser()
    parser.__class__ = _Parser
    try:
        args, beam_args = parser.parse_known_args(argv)
    except _ArgumentError as error:
        raise UsageError(str(error)) from None
    _check_beam_args(beam_args)
    if not args.input and not args.manifest:
        raise UsageError("--input is required (or --manifest FILE)")
    try:
        args.split_fractions = keys.parse_splits(args.splits)
        args.image_spec = images.ImageSpec(
            resize=args.resize,
            size=args.image_size,
            upscale=args.upscale,
            jpeg_quality=args.jpeg_quality,
            resample=args.resample,
            timeout_s=args.image_timeout_s,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    if not args.target_shard_mb > 0:
        raise UsageError(f"--target_shard_mb must be positive, got {args.target_shard_mb:g}")
    if args.local_processes is not None and args.local_processes < 1:
        raise UsageError(f"--local_processes must be at least 1, got {args.local_processes}")
    if args.min_shards < 1:
        raise UsageError(f"--min_shards must be at least 1, got {args.min_shards}")
    if not 0.0 <= args.max_reject_fraction <= 1.0:
        raise UsageError(
            f"--max_reject_fraction must be in [0, 1], got {args.max_reject_fraction:g}"
        )
    return args, beam_args


LOCAL_DEFAULT_MODE = os.environ.get("IMAGERECORDS_LOCAL_MODE", "pool")


def _with_local_defaults(beam_args: list[str], processes: int | None) -> tuple[list[str], int]:
    """DirectRunner with no explicit mode: use every core, not one in-memory thread.

    Returns the Beam args and the number of local conversion processes.
    ``multi_threading`` is avoided on purpose (docs/format.md section 5: it was seen
    to lose records under load).
    """
    joined = " ".join(beam_args)
    runner = re.search(r"--runner[= ](\S+)", joined)
    if runner and runner.group(1) not in ("DirectRunner", "direct"):
        return beam_args, 1
    mode = re.search(r"--direct_running_mode[= ](\S+)", joined)
    cores = os.cpu_count() or 1
    if mode:
        in_memory = mode.group(1) == "in_memory"
        return beam_args, (processes or 1) if in_memory else 1
    if LOCAL_DEFAULT_MODE == "multi_processing":
        extra = ["--direct_running_mode=multi_processing"]
        if "--direct_num_workers" not in joined:
            extra.append(f"--direct_num_workers={cores}")
        return beam_args + extra, 1
    extra = ["--direct_running_mode=in_memory"]
    if "pipeline_type_check" not in joined:
        # Beam's construction-time type checks guard user-written pipelines; this
        # one is fixed and tested, and checking it costs CPU on every run while
        # the conversion processes need the cores.
        extra.append("--no_pipeline_type_check")
    return beam_args + extra, processes or cores


def check_output(output: str, input_root: str | None, overwrite: bool) -> None:
    """Refuses an output inside the input, one we cannot write to, or one holding
    a finished dataset or others' files (unless --overwrite). Reads only.

    An unfinished run of this job is resumed; :func:`resume.prepare` decides.
    """
    from beam_pipeline import listing, resume

    out = listing.normalize_root(output)
    if input_root and (out == input_root or out.startswith(input_root.rstrip("/") + "/")):
        raise UsageError(f"--output {output} lies inside --input; choose a folder outside it")
    if listing.is_gcs(out):
        from beam_pipeline import gcs

        gcs.check_output(out)
    elif listing.is_local(out):
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--output {output} is a file, not a folder")
    resume.check(out, overwrite)


def _report_leftovers(found, output: str, spill_dir: str | None, say) -> dict:
    """Says what the run does with an earlier run's files; returns the resumable records."""
    from beam_pipeline import spill

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


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of the children it has waited for.

    The children are the local conversion pool and DirectRunner's worker
    processes, all reaped before the summary; a remote runner's workers are not
    among them.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _summary(info: dict, seconds: float, counters: dict[str, int], cpu: float | None) -> str:
    lines = [f"{'split':<12}{'records':>10}{'rejected':>10}{'shards':>8}{'MB':>10}"]
    rejected = info["rejected"].get("by_split", {})
    for name, split in info["splits"].items():
        lines.append(
            f"{name:<12}{split['num_examples']:>10}{rejected.get(name, 0):>10}"
            f"{len(split['shards']):>8}{split['num_bytes'] / 1e6:>10.1f}"
        )
    written = sum(s["num_examples"] for s in info["splits"].values())
    total = written + info["rejected"]["count"]
    lines.append(
        f"{'total':<12}{written:>10}{info['rejected']['count']:>10}"
        f"{sum(len(s['shards']) for s in info['splits'].values()):>8}"
        f"{sum(s['num_bytes'] for s in info['splits'].values()) / 1e6:>10.1f}"
    )
    rate = f"{total} images read in {seconds:.1f} s wall time: {total / max(seconds, 1e-9):.1f} images/s"
    if cpu is None:
        lines.append(f"{rate} (CPU time not measured: the work ran on the runner's workers)")
    else:
        # What a small local run tells about the cost of a big one (docs/scale.md).
        lines.append(
            f"{rate}, {cpu / max(total, 1):.4f} CPU-s/image "
            f"({cpu:.1f} CPU-s in this process and its local worker processes)"
        )
    skipped = info.get("skipped", {})
    if skipped.get("count"):
        reasons = ", ".join(f"{n} {why}" for why, n in skipped.get("by_reason", {}).items())
        lines.append(
            f"skipped {skipped['count']} files that are not images to convert ({reasons}): "
            f"listed in {skipped['file']} in the output folder"
        )
    splits = list(info["splits"])
    first = "train" if "train" in splits else (splits[0] if splits else "train")
    deduped = bool(info.get("config", {}).get("dedupe"))
    lines += duplicates.summary_lines(info.get("duplicates") or {}, first, deduped)
    if counters:
        lines.append("counters: " + ", ".join(f"{k}={v}" for k, v in sorted(counters.items())))
    return "\n".join(lines)


def _counters(result) -> dict[str, int]:
    from apache_beam.metrics.metric import MetricsFilter

    from beam_pipeline.pipeline import NAMESPACE

    try:
        queried = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    except Exception:  # some runners do not report metrics
        return {}
    out = {}
    for counter in queried["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        out[counter.key.metric.name] = out.get(counter.key.metric.name, 0) + (value or 0)
    return out


# Images converted while Beam loads (enough to cover its start-up on web-size
# images), and a bound on the results held before the pipeline claims them.
CONVERT_AHEAD_LIMIT = 1024
CONVERT_AHEAD_BYTES = 512 * 2**20  # of source files


# Beam's state sampler thread sleeps up to this long between samples, and every
# bundle's end waits for it to wake (Beam's own comment: "may have to wait up to
# sampling_period_ms"). With Beam's default (200 ms) the end of the long
# conversion bundle idled on the critical path of a short local run.
_LOCAL_STATE_SAMPLING_MS = 20


def _shorten_state_sampling() -> None:
    """Lowers the state sampler's period for bundles run in this process.

    The sampler thread runs without the GIL, so sampling more often costs
    nothing measurable. Applied only when Beam's default is still in place.
    """
    from apache_beam.runners.worker import statesampler

    init = statesampler.StateSampler.__init__
    if init.__defaults__ == (statesampler.DEFAULT_SAMPLING_PERIOD_MS,):
        init.__defaults__ = (_LOCAL_STATE_SAMPLING_MS,)


def _direct_fn_api_runner(all_options: dict):
    """The runner DirectRunner uses for a batch pipeline, without its Prism attempt.

    Beam 2.77's DirectRunner first tries to download and start the Prism
    runner (a Go binary from GitHub) and falls back to the FnApiRunner only when
    that fails. Prism ignores ``--direct_running_mode``, and the local
    conversion pool needs the whole graph in this process (in_memory), so a
    DirectRunner job here goes straight to the FnApiRunner, configured exactly
    as DirectRunner configures it: the same engine offline and online, no
    download at run time. ``--runner=PrismRunner`` still selects Prism.
    """
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    _shorten_state_sampling()
    info = beam_provision_api_pb2.ProvisionInfo(
        pipeline_options=JobServiceHandle.encode_pipeline_options(all_options)
    )
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(info))


def _run_pipeline(args, beam_args, processes, layout, output, say):
    """Builds and runs the pipeline; the result, or None when not waiting."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipeline import pipeline

    config = pipeline.JobConfig(
        layout=layout,
        output=output,
        splits=args.split_fractions,
        seed=args.seed,
        image=args.image_spec,
        target_shard_bytes=int(args.target_shard_mb * 2**20),
        min_shards=args.min_shards,
        max_reject_fraction=args.max_reject_fraction,
        index_files=args.index_files,
        conversion_processes=processes,
        dedupe=args.dedupe,
    )
    if layout.kind == "manifest":
        say(
            f"imagerecords: {layout.num_manifest_rows} images in manifest, {len(layout.classes)} classes"
        )
    else:
        say(
            f"imagerecords: {len(layout.classes)} classes in {len(layout.folders)} folders "
            f"({layout.kind} layout) under {layout.root}"
        )
    if _runner_name(beam_args) in beam_options.DASK_RUNNER_NAMES:
        import beam_pipeline.dask_runner  # noqa: F401  registers Beam's --dask_* options

    options = PipelineOptions(beam_args)
    chosen = options.get_all_options()
    runner_name = chosen.get("runner") or "DirectRunner"
    runner = None
    if runner_name in ("DirectRunner", "direct"):
        runner = _direct_fn_api_runner(chosen)
        mode = chosen.get("direct_running_mode")
        workers = processes if mode == "in_memory" else chosen.get("direct_num_workers")
        runner_name = f"DirectRunner ({mode}, {workers} conversion processes)"
    elif runner_name in beam_options.DASK_RUNNER_NAMES:
        # Beam knows the Dask runner by its dotted path only; all these names
        # get the fixed one (beam_pipeline/dask_runner.py).
        from beam_pipeline.dask_runner import DaskOptions, DaskRunner

        runner = DaskRunner()
        address = options.view_as(DaskOptions).address or "a new local Dask cluster"
        runner_name = f"DaskRunner ({address})"
    say(f"imagerecords: running on {runner_name}")
    try:
        p = beam.Pipeline(runner=runner, options=options)
    except (ImportError, ValueError, AttributeError) as error:  # a runner Beam cannot make
        raise UsageError(f"--runner {runner_name}: {error}") from None
    pipeline.build(p, config)
    result = p.run()
    template = chosen.get("template_location")
    if template:
        # DataflowRunner wrote the job description and staged the job; nothing
        # runs until someone launches the template.
        print(f"imagerecords: wrote the Dataflow template {template}; no job was started")
        return None
    if not args.wait:
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


# Optional packages that ``import apache_beam`` loads whenever they are installed
# (Beam guards each import with ``except ImportError``): MongoDB IO, Pub/Sub IO,
# Arrow type conversion, BigQuery IO and the Dataflow API client. A local
# conversion uses none of them, and loading them costs CPU while the
# conversion processes need the cores.
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
# requests, regex). Hidden only when the input and the
# output are both local, so Beam registers no gs:// filesystem in that process.
_CLOUD_ONLY_MODULES = ("google.cloud.storage", "apitools", "apache_beam.io.gcp.bigquery")


def _import_beam_for_local_run(uses_gcs: bool = True) -> None:
    """Imports Apache Beam without the optional packages a local run never uses.

    The packages are hidden only during the import and importable again after
    it; Beam's modules that wanted them stay in their "not installed" state.

    Args:
        uses_gcs: Some path is on gs://: keep Beam's GCS filesystem.
    """
    if "apache_beam" in sys.modules:
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


def _all_local(layout, output: str) -> bool:
    """Input folder and output are local (a manifest may name gs:// images: not local)."""
    from beam_pipeline import listing

    return layout.kind != "manifest" and listing.is_local(layout.root) and listing.is_local(output)


def run(argv: list[str] | None = None, parsed=None) -> dict:
    """Validates arguments, builds and runs the pipeline; returns dataset_info.

    Args:
        argv: The command line (default ``sys.argv[1:]``).
        parsed: What :func:`parse_args` returned for it, when already parsed.

    Raises:
        UsageError: bad arguments or input, before any work starts.
        BooksDoNotBalance: the job lost, doubled or rejected too many images.
    """
    args, beam_args = parsed or parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.dry_run:
        from beam_pipeline import dryrun

        return dryrun.run(args, beam_args, check_output)
    started, cpu_started = time.monotonic(), cpu_seconds()
    if not args.wait and _runner_name(beam_args) in beam_options.DASK_RUNNER_NAMES:
        raise UsageError("--wait=false is for Dataflow: a Dask job stops when its client leaves")
    beam_args, processes = _with_local_defaults(beam_args, args.local_processes)
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))

    from beam_pipeline import listing, local_pool, resume, spill

    # Local input and output are checked without Beam, so that the conversion
    # processes can start (and start converting) while Beam loads.
    layout = listing.discover(args.input, args.manifest)
    output = listing.normalize_root(args.output)
    check_output(output, layout.root if layout.kind != "manifest" else None, args.overwrite)
    spill_dir = spill.default_dir(output) if processes > 1 else None
    if any(arg.startswith("--template_location") for arg in beam_args):
        found = resume.Leftovers("empty")  # a template build writes nothing to --output
    else:
        found = resume.prepare(output, resume.settings(args, layout), args.overwrite, spill_dir)
    try:
        try:
            done = _report_leftovers(found, output, spill_dir, say)
            if processes > 1:
                # Fork before Beam's runner and gRPC start threads (see local_pool).
                local_pool.start(processes)
                if layout.kind != "manifest" and listing.is_local(layout.root):
                    refs = listing.local_refs(
                        layout,
                        CONVERT_AHEAD_LIMIT,
                        CONVERT_AHEAD_BYTES,
                        args.seed,
                        args.split_fractions,
                    )
                    local_pool.convert_ahead(
                        [ref for ref in refs if ref.image_id not in done],
                        (args.image_spec, args.seed, layout.classes, spill_dir),
                        processes,
                    )
                _import_beam_for_local_run(uses_gcs=not _all_local(layout, output))
            result = _run_pipeline(args, beam_args, processes, layout, output, say)
        finally:
            # On every way out (an error, Ctrl-C): no conversion process outlives the run.
            local_pool.shutdown_all()
            spill.forget_indexes()
    except UsageError:
        if found.kind == "empty":  # nothing of value was there: leave nothing behind
            resume.discard(output, spill_dir)
        raise
    if result is None:
        return {}
    from apache_beam.io.filesystems import FileSystems

    seconds = time.monotonic() - started
    with FileSystems.open(listing.join(output, metadata.INFO_FILE)) as stream:
        info = json.load(stream)
    runner = _runner_name(beam_args)
    cpu = cpu_seconds() - cpu_started if runner in (None, "DirectRunner", "direct") else None
    print(_summary(info, seconds, _counters(result), cpu), flush=True)
    return info


def _books_message(error: BaseException) -> str | None:
    """The BooksDoNotBalance message inside a runner's wrapped exception, if any."""
    text = str(error)
    if isinstance(error, BooksDoNotBalance):
        text = "BooksDoNotBalance: " + text
    match = re.search(r"BooksDoNotBalance: (.*?)(?: \[while running|\n|$)", text)
    return match.group(1) if match else None


def _print_books_error(message: str, verbose: bool) -> None:
    """The error line, after the most common reasons when too many images were rejected."""
    message, reasons = errors.split_reasons(message)
    if reasons:
        print("most common reasons for rejection:", file=sys.stderr)
        for count, reason in reasons:
            print(f"  {count:>6}  {reason}", file=sys.stderr)
    _error(message, verbose)


# What Ctrl-C prints after "error: interrupted". Nothing the run wrote looks
# finished (no dataset_info.json), and the same command carries on: a local
# run keeps what it converted (docs/scale.md).
RESUME_HINT = "rerun the same command to resume"


def _error(message: str, verbose: bool) -> None:
    if verbose:
        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr, flush=True)


_JOB_SERVICE_LOG = "apache_beam.runners.portability.local_job_service"


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0, 1 failed, 2 bad usage, 130 Ctrl-C)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # multi_processing workers relay their start-up chatter (unparseable runner
    # flags, no semi_persistent_directory) as warnings; they mean nothing here.
    logging.getLogger(_JOB_SERVICE_LOG).setLevel(logging.ERROR)
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv  # before parsing: a usage error can show its traceback too
    try:
        parsed = parse_args(argv)
        verbose = parsed[0].verbose
        if not verbose:
            # Beam logs an error raised in a step (with its traceback) before
            # re-raising it; the CLI reports it in one line instead.
            for name in ("apache_beam.runners.common", _JOB_SERVICE_LOG):
                logging.getLogger(name).setLevel(logging.CRITICAL)
        if not parsed[0].quiet:
            # Progress lines from the conversion step ("converted N images (R images/s)").
            logging.getLogger("beam_pipeline").setLevel(logging.INFO)
        run(argv, parsed)
    except UsageError as error:
        _error(str(error), verbose)
        return 2
    except BooksDoNotBalance as error:
        _print_books_error(_books_message(error) or str(error), verbose)
        return 1
    except KeyboardInterrupt:
        _error(f"interrupted; no dataset_info.json was written; {RESUME_HINT}", verbose)
        return 130
    except Exception as error:
        message = _books_message(error)
        if message is not None:
            _print_books_error(message, verbose)
            return 1
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        message = f"{type(error).__name__}: {first}"
        if not verbose:
            message += " (--verbose shows the traceback)"
        _error(message, verbose)
        return 1
    return 0


if __name__ == "__main__":
    status = main()
    # Every output is closed and renamed by now. Skipping the interpreter's
    # teardown of Beam's runner state shortens a local run's wall time;
    # os._exit also skips multiprocessing's clean-up, so do its part here.
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
