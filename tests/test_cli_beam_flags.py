"""Beam's flags are read once, as Beam reads them, and every part of the CLI agrees.

A repeated flag (the last one wins, as in Beam's argparse), ``--runner=X`` and
``--runner X``, a runner's other names (``direct``, ``directrunner``) and a
flag's aliases (``--worker_machine_type``) give one answer to the engine
choice, the local processes, the runner the job starts and the dry run's
report.
"""

from __future__ import annotations

import os
import re

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.beam_internals import beam_options
from beam_pipeline.core.errors import UsageError
from tests import contract
from tests.image_factory import make_class_folders

# What the job reads of Beam's flags (BeamFlags' properties read these dests).
READ = ("runner", "direct_running_mode", "direct_num_workers", "machine_type", "template_location")


@pytest.mark.parametrize(
    "args",
    [
        ["--runner", "DirectRunner", "--runner", "DaskRunner"],
        ["--runner=DaskRunner", "--runner=direct"],
        ["--direct_running_mode", "in_memory", "--direct_running_mode=multi_processing"],
        ["--direct_running_mode=multi_processing", "--direct_running_mode", "in_memory"],
        ["--direct_num_workers", "4", "--direct_num_workers=0"],
        ["--machine_type", "n2-standard-8", "--worker_machine_type=c3-highcpu-4"],
        ["--worker_machine_type=c3-highcpu-4", "--machine_type", "n2-standard-8"],
        ["--template_location", "gs://b/t1", "--template_location=gs://b/t2"],
        ["--experiments=a", "--experiment", "b", "--no_pipeline_type_check"],
    ],
)
def test_the_flags_are_read_as_beams_own_parser_reads_them(args):
    from apache_beam.options.pipeline_options import PipelineOptions

    import beam_pipeline.beam_internals.dask_runner  # noqa: F401  Beam's --dask_* options

    beam = beam_options.check(args)
    assert beam.args == tuple(args)
    by_beam = PipelineOptions(args).get_all_options()
    read = [dest for dest in READ if beam.given(dest)]  # not given: Beam's default
    for dest in read:
        assert beam.get(dest) == by_beam[dest], dest
    assert beam.get("experiments", ()) == tuple(by_beam["experiments"] or ())
    assert beam.get("pipeline_type_check", True) == by_beam["pipeline_type_check"]


@pytest.mark.parametrize(
    "name, runner",
    [
        ("DirectRunner", "DirectRunner"),
        ("direct", "DirectRunner"),
        ("directrunner", "DirectRunner"),
        ("apache_beam.runners.direct.direct_runner.DirectRunner", "DirectRunner"),
        ("dataflow", "DataflowRunner"),
        ("DaskRunner", "DaskRunner"),
        ("dask", "DaskRunner"),
        ("apache_beam.runners.dask.dask_runner.DaskRunner", "DaskRunner"),
        ("my.module.MyRunner", "my.module.MyRunner"),
    ],
)
@pytest.mark.parametrize("form", ["--runner={}", "--runner {}"])
def test_a_runner_by_any_of_its_names_and_either_form_is_one_runner(name, runner, form):
    beam = beam_options.check(form.format(name).split(" "))
    assert beam.runner == runner
    assert beam.on_direct_runner == (runner == "DirectRunner")
    assert beam.on_dask == (runner == "DaskRunner")


@pytest.mark.parametrize("abbreviated", ["--runne", "--run", "--direct_running", "--machine"])
def test_no_flag_is_abbreviated_neither_here_nor_by_beam(abbreviated):
    """Beam's parser (allow_abbrev=False) would drop ``--runne X``; the CLI refuses it."""
    from apache_beam.options.pipeline_options import PipelineOptions

    assert PipelineOptions([abbreviated, "x"]).get_all_options()["runner"] is None
    # Refused (a close one suggested, never taken).
    with pytest.raises(
        UsageError, match=rf"unknown option {abbreviated}( \(did you mean --\w+\?\))?$"
    ):
        beam_options.check([abbreviated, "x"])


# ------------------------------------------------------------------ the dry run


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("flags") / "images"
    make_class_folders(str(root), classes=("a", "b"), per_class=6)
    return root


def _dry_run_line(images, tmp_path, capsys, *flags) -> str:
    argv = ["--input", str(images), "--output", str(tmp_path / "o"), "--dry_run", *flags]
    assert main(argv) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("local run (")]
    return line[: line.index("): ") + 1]


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--runner", "DirectRunner", "--runner", "DaskRunner"],
            "local run (local engine, 3 conversion processes; the job runs on DaskRunner)",
        ),
        (
            ["--runner", "DaskRunner", "--runner", "DirectRunner"],
            "local run (Beam DirectRunner in_memory, 3 conversion processes)",
        ),
        (
            ["--runner=directrunner"],
            "local run (Beam DirectRunner in_memory, 3 conversion processes)",
        ),
        (
            ["--direct_running_mode", "in_memory", "--direct_running_mode", "multi_processing"],
            "local run (Beam DirectRunner multi_processing, 2 conversion processes)",
        ),
        (
            ["--direct_running_mode=multi_processing", "--direct_running_mode=in_memory"],
            "local run (Beam DirectRunner in_memory, 3 conversion processes)",
        ),
    ],
)
def test_the_dry_run_reports_the_runner_and_processes_the_job_would_use(
    images, tmp_path, capsys, flags, expected
):
    extra = ["--local_processes", "3", "--direct_num_workers", "2"]
    assert _dry_run_line(images, tmp_path, capsys, *flags, *extra) == expected


@pytest.mark.parametrize(
    "flags, cpus, expected",
    [
        (["--direct_running_mode=multi_processing", "--direct_num_workers=9"], 2, 8),
        (["--direct_running_mode=multi_processing", "--direct_num_workers=8"], 2, None),
        (["--direct_running_mode=multi_processing", "--direct_num_workers=5"], 1, 4),
        (["--direct_running_mode=multi_processing", "--direct_num_workers=0"], 1, None),
        (["--direct_running_mode=multi_processing"], 1, None),
        # Only multi_processing forks a process per worker.
        (["--direct_running_mode=in_memory", "--direct_num_workers=100"], 1, None),
        (["--direct_num_workers=100"], 1, None),
        (["--runner=DaskRunner", "--direct_running_mode=multi_processing"], 1, None),
        (
            ["--runner=DaskRunner", "--direct_running_mode=multi_processing"]
            + ["--direct_num_workers=100"],
            1,
            None,
        ),
        # The last of a repeated flag is the one capped, as Beam reads it.
        (
            ["--direct_running_mode=multi_processing", "--direct_num_workers=100"]
            + ["--direct_num_workers", "3"],
            1,
            None,
        ),
        (
            ["--direct_running_mode=multi_processing", "--direct_num_workers=3"]
            + ["--direct_num_workers", "100"],
            1,
            4,
        ),
    ],
)
def test_direct_num_workers_beyond_four_per_core_are_capped_in_multi_processing(
    flags, cpus, expected
):
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipeline.cli.arguments import capped_direct_workers

    given = beam_options.check(flags)
    beam, note = capped_direct_workers(given, cpus)
    if expected is None:
        assert (beam, note) == (given, None)
        return
    assert beam.direct_num_workers == expected
    # Beam itself reads the capped count from the flags the job hands it.
    assert PipelineOptions(list(beam.args)).get_all_options()["direct_num_workers"] == expected
    requested = given.direct_num_workers
    assert note == (
        f"--direct_num_workers {requested} is more than {expected} (4 per core "
        f"on this machine's {cpus} cores); running {expected}"
    )


def test_a_capped_direct_num_workers_is_said_once_and_is_what_the_dry_run_reports(
    images, tmp_path, capsys
):
    from beam_pipeline.core.flags import MAX_PROCESSES_PER_CORE

    cap = MAX_PROCESSES_PER_CORE * (os.cpu_count() or 1)
    argv = ["--input", str(images), "--output", str(tmp_path / "o"), "--dry_run"]
    argv += ["--direct_running_mode=multi_processing", f"--direct_num_workers={cap + 1}"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if "is more than" in line]
    assert notes == [
        f"imagerecords: --direct_num_workers {cap + 1} is more than {cap} "
        f"({MAX_PROCESSES_PER_CORE} per core on this machine's {os.cpu_count() or 1} cores); "
        f"running {cap}"
    ]
    assert f"local run (Beam DirectRunner multi_processing, {cap} conversion processes): " in (
        captured.out
    )


@pytest.mark.e2e
def test_the_dry_run_of_a_gcs_input_reports_beam_as_the_job_would_run_it(
    gcs_emulator, images, tmp_path, capsys
):
    """No Beam flag, but a gs:// input: the job runs on Beam (choice.choose_engine), so
    the dry run's estimate is Beam's, not the local engine's."""
    bucket = gcs_emulator.create_bucket()
    gcs_emulator.upload_dir(images, f"gs://{bucket}/images")
    argv = ["--input", f"gs://{bucket}/images", "--output", str(tmp_path / "o"), "--dry_run"]
    assert main([*argv, "--local_processes", "2"]) == 0
    out = capsys.readouterr().out
    assert "local run (Beam DirectRunner in_memory, 2 conversion processes): " in out, out


# ------------------------------------------------------------------ the job


def _running_on(err: str) -> str:
    (line,) = [x for x in err.splitlines() if x.startswith("imagerecords: running on")]
    return line.removeprefix("imagerecords: running on ")


@pytest.fixture(scope="module")
def reference(images, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "o"
    assert main(["--input", str(images), "--output", str(out), "--quiet"]) == 0
    return contract.all_files(str(out))


@pytest.mark.e2e
@pytest.mark.parametrize(
    "flags, runner, pool",
    [
        # The last --runner is DirectRunner: it runs in_memory on --local_processes.
        (
            ["--runner", "DaskRunner", "--runner=DirectRunner", "--local_processes", "2"],
            "DirectRunner (in_memory, 2 conversion processes)",
            {2},
        ),
        (
            ["--runner=directrunner", "--local_processes", "2"],
            "DirectRunner (in_memory, 2 conversion processes)",
            {2},
        ),
        (
            ["--direct_running_mode=multi_processing", "--direct_running_mode", "in_memory"]
            + ["--local_processes", "2"],
            "DirectRunner (in_memory, 2 conversion processes)",
            {2},
        ),
        # The last mode is multi_processing: Beam's two workers convert, and no
        # local pool is started for them.
        (
            ["--direct_running_mode", "in_memory", "--direct_running_mode=multi_processing"]
            + ["--direct_num_workers", "2", "--local_processes", "2"],
            "DirectRunner (multi_processing, 2 conversion processes)",
            set(),
        ),
    ],
)
def test_the_job_runs_on_the_last_runner_and_mode_given(
    images, reference, tmp_path, capsys, monkeypatch, flags, runner, pool
):
    from beam_pipeline.engines import local_pool

    started, start = set(), local_pool.start

    def recorded(processes):  # the real pool starts; which size is noted
        started.add(processes)
        return start(processes)

    monkeypatch.setattr(local_pool, "start", recorded)
    out = tmp_path / "o"
    assert main(["--input", str(images), "--output", str(out), *flags]) == 0
    assert _running_on(capsys.readouterr().err) == runner
    assert started == pool
    assert contract.all_files(str(out)) == reference


# ------------------------------------------------------------------ --verbose


@pytest.mark.parametrize(
    "verbose, traceback",
    [(["--verbose"], True), (["--verbose=true"], True), (["--verbose", "false"], False)],
)
def test_a_usage_error_shows_its_traceback_as_the_last_verbose_says(capsys, verbose, traceback):
    assert main(["--output", "o", *verbose, "--seed", "x"]) == 2
    err = capsys.readouterr().err
    assert ("Traceback" in err) == traceback, err
    assert re.search(r"^error: .*--seed", err, re.M), err


# ------------------------------------------------- what a runner needs, before work

GS = "gs://b/tmp"


@pytest.mark.parametrize(
    "args, environ, gcloud, missing",
    [
        (["--runner", "DirectRunner"], {}, None, None),
        ([], {}, None, None),
        (
            ["--runner", "DataflowRunner"],
            {},
            None,
            "needs --project PROJECT, --region REGION and --temp_location gs://BUCKET/PATH",
        ),
        (["--runner=dataflow", "--project", "p", "--region", "r"], {}, None, "--temp_location"),
        (["--runner=Dataflow", "--project=p", "--temp_location", GS], {}, None, "--region"),
        (["--runner=dataflow", "--region", "r", "--staging_location", GS], {}, None, "--project"),
        # Beam takes the region from the environment, then from gcloud.
        (
            ["--runner=dataflow", "--project=p", "--temp_location", GS],
            {"CLOUDSDK_COMPUTE_REGION": "r"},
            None,
            None,
        ),
        (["--runner=dataflow", "--project=p", "--temp_location", GS], {}, "europe-west4", None),
        # A temporary folder that is not in GCS is none to Dataflow.
        (
            ["--runner=dataflow", "--project=p", "--region=r", "--temp_location=/tmp/x"],
            {},
            None,
            "--temp_location",
        ),
        (
            ["--runner=dataflow", "--project=p", "--region=r", "--staging_location", GS],
            {},
            None,
            None,
        ),
        (["--runner", "DaskRunner"], {}, None, None),  # Beam starts a local Dask cluster
        (["--runner", "DaskRunner", "--dask_client_address=tcp://h:8786"], {}, None, None),
        (
            ["--runner", "DaskRunner", "--dask_client_address=tcp://h:8786"]
            + ["--dask_scheduler_file", __file__],
            {},
            None,
            "give one of them",
        ),
        (["--runner", "DaskRunner", "--dask_scheduler_file", __file__], {}, None, None),
        (
            ["--runner", "DaskRunner", "--dask_scheduler_file", "/no/such.json"],
            {},
            None,
            "does not exist",
        ),
    ],
)
def test_what_the_runner_needs_is_named_in_one_line(args, environ, gcloud, missing):
    found = beam_options.missing_runner_options(
        beam_options.check(args), environ, default_region=lambda: gcloud
    )
    if missing is None:
        assert found is None
    else:
        assert missing in found and "\n" not in found


@pytest.mark.e2e
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--runner", "Dataflow"], "error: --runner DataflowRunner needs --project PROJECT"),
        (
            ["--runner", "DataflowRunner", "--project", "p", "--region", "r"],
            "error: --runner DataflowRunner needs --temp_location gs://BUCKET/PATH",
        ),
        (
            ["--runner", "DaskRunner", "--dask_scheduler_file", "/no/such.json"],
            "error: --dask_scheduler_file /no/such.json does not exist",
        ),
    ],
)
def test_a_runner_without_what_it_needs_is_refused_before_the_input_is_listed(
    images, tmp_path, capsys, flags, message
):
    assert main(["--input", str(images), "--output", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    # The one line: no "imagerecords: N classes ..." and no "running on" before it.
    assert err.startswith(message) and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_a_flex_template_launch_leaves_the_runner_options_to_its_launcher(monkeypatch):
    from beam_pipeline.cli import arguments

    monkeypatch.setenv("IMAGERECORDS_LENIENT_OPTIONS", "1")
    beam = arguments.parse_args(
        ["--input", "gs://b/i", "--output", "gs://b/o", "--runner=dataflow"]
    ).beam
    assert beam.runner == "DataflowRunner"
