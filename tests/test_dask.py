"""The converter on a real Dask cluster: a scheduler and two worker processes on localhost.

The job goes through the command line with ``--runner DaskRunner
--dask_client_address tcp://...`` and must write the same bytes as the
DirectRunner, file for file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from beam_pipeline.__main__ import main
from tests import contract
from tests.gcs_fixtures import _die_with_parent, free_port
from tests.image_factory import add_bad_files, make_class_folders

pytestmark = pytest.mark.e2e

distributed = pytest.importorskip("distributed")

START_TIMEOUT_S = 60


def _spawn(args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a process group of its own: teardown kills it whole
        preexec_fn=_die_with_parent,
    )


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """``dask scheduler`` + two ``dask worker`` processes (1 thread each); the address."""
    log_dir = tmp_path_factory.mktemp("dask")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    processes = []
    try:
        processes.append(
            _spawn(
                ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port)]
                + ["--no-dashboard"],
                (log_dir / "scheduler.log").open("wb"),
            )
        )
        for n in range(2):
            processes.append(
                _spawn(
                    ["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny"]
                    + ["--no-dashboard", "--name", f"worker-{n}"],
                    (log_dir / f"worker-{n}.log").open("wb"),
                )
            )
        with distributed.Client(address, timeout=START_TIMEOUT_S) as client:
            client.wait_for_workers(2, timeout=START_TIMEOUT_S)
        yield address
    finally:
        for process in reversed(processes):
            _kill_group(process)
        # Each was waited for (or had ended): none still runs.
        left = [p.pid for p in processes if p.poll() is None]
        assert not left, f"Dask processes left running: {left}"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("dask-images") / "images"
    make_class_folders(str(root), per_class=12)
    add_bad_files(str(root))
    return root


def _convert(images, out, *extra) -> int:
    return main(
        ["--input", str(images), "--output", str(out), "--quiet", "--min_shards", "3"]
        + ["--max_reject_fraction", "0.2", *extra]
    )


def test_dask_cluster_writes_the_directrunner_bytes(dask_cluster, images, tmp_path, capsys):
    assert _convert(images, tmp_path / "direct", "--direct_running_mode=in_memory") == 0
    on_dask = ["--runner", "DaskRunner", "--dask_client_address", dask_cluster]
    assert _convert(images, tmp_path / "dask", *on_dask) == 0
    assert "images/s" in capsys.readouterr().out

    direct = contract.all_files(str(tmp_path / "direct"))
    dask = contract.all_files(str(tmp_path / "dask"))
    assert sorted(dask) == sorted(direct)
    assert [name for name in direct if dask[name] != direct[name]] == []
    # The comparison means something: records in several shards, and rejections.
    by_split = contract.check_output(str(tmp_path / "dask"), str(images))
    assert sum(len(rows) for rows in by_split.values()) == 36
    assert len(contract.read_rejects(str(tmp_path / "dask"))) == 2
    assert sum(name.endswith(".tfrecord") for name in dask) >= 6


def test_a_grouped_folder_on_dask_is_what_the_local_engine_and_directrunner_write(
    dask_cluster, tmp_path, capsys
):
    """--group_by on every engine: no group in two splits, the same bytes."""
    from tests import test_groups

    root = tmp_path / "images"
    test_groups.grouped_folder(str(root))
    common = ["--input", str(root), "--quiet", "--group_by", test_groups.GROUP_BY]
    on_dask = ["--runner", "DaskRunner", "--dask_client_address", dask_cluster]
    for out, extra in [("local", []), ("direct", ["--runner", "DirectRunner"]), ("dask", on_dask)]:
        assert main([*common, "--output", str(tmp_path / out), *extra]) == 0
    capsys.readouterr()
    local = contract.all_files(str(tmp_path / "local"))
    assert contract.all_files(str(tmp_path / "direct")) == local
    assert contract.all_files(str(tmp_path / "dask")) == local
    found = test_groups.splits_by_id(tmp_path / "dask")
    by_group = test_groups.splits_by_group(found)
    assert len(by_group) == test_groups.PATIENTS
    assert all(len(splits) == 1 for splits in by_group.values())
    assert len(set(found.values())) == 3


def test_near_copies_on_dask_are_what_the_local_engine_and_directrunner_write(
    dask_cluster, tmp_path, capsys
):
    """The near-duplicate search on every engine: the same records, pairs and groups."""
    pytest.importorskip("skimage")
    from tests import near_fixtures

    root = near_fixtures.near_folder(str(tmp_path / "images"))
    on_dask = ["--runner", "DaskRunner", "--dask_client_address", dask_cluster]
    for out, extra in [("local", []), ("direct", ["--runner", "DirectRunner"]), ("dask", on_dask)]:
        assert main(["--input", root, "--quiet", "--output", str(tmp_path / out), *extra]) == 0
    capsys.readouterr()
    local = contract.all_files(str(tmp_path / "local"))
    assert contract.all_files(str(tmp_path / "direct")) == local
    assert contract.all_files(str(tmp_path / "dask")) == local
    assert near_fixtures.near_groups(tmp_path / "dask") == near_fixtures.GROUPS


def test_a_local_dask_run_logs_nothing_of_dask_without_verbose(images, tmp_path):
    """Without --dask_client_address Beam starts a local cluster in the command's
    process; its scheduler and workers log every start and close at INFO."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    command = [sys.executable, "-m", "beam_pipeline", "--input", str(images)]
    command += [
        "--output",
        str(tmp_path / "o"),
        "--runner",
        "DaskRunner",
        "--max_reject_fraction",
        "0.2",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "imagerecords: running on DaskRunner (a new local Dask cluster)" in done.stderr
    # (A warning Dask has reason for, such as an event loop stalled by a loaded machine, shows.)
    assert "INFO distributed" not in done.stderr, done.stderr
    assert contract.all_files(str(tmp_path / "o"))


def test_dask_wait_false_is_refused_before_work(dask_cluster, images, tmp_path, capsys):
    status = _convert(
        images,
        tmp_path / "out",
        "--runner=DaskRunner",
        f"--dask_client_address={dask_cluster}",
        "--wait=false",
    )
    assert status == 2
    assert "--wait=false" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_runner_spreads_work_and_computes_side_inputs_once(dask_cluster, tmp_path):
    """What beam_pipeline/beam_internals/dask_runner.py fixes, on a small graph of the same shape.

    A Reshuffle of one Create partition feeds a step whose output is read three
    ways: through a multi-output ParDo's two tags and a count, all as side inputs.
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.pvalue import AsList, AsSingleton

    from beam_pipeline.beam_internals.dask_runner import DaskRunner

    calls, report = tmp_path / "calls", tmp_path / "report.json"
    calls.mkdir()

    def work(x, folder):
        import uuid

        import distributed

        task = str(distributed.get_worker().get_current_task())
        (Path(folder) / f"{x}-{uuid.uuid4().hex}").write_text(task)
        return x, task

    class Split(beam.DoFn):
        def process(self, pair):
            yield pair[0] if pair[0] % 2 == 0 else beam.pvalue.TaggedOutput("odd", pair[0])

        def finish_bundle(self):  # outputs here must not be lost
            yield beam.transforms.window.GlobalWindows.windowed_value(-1)

    def collect(_, path, worked, total, even, odd):
        Path(path).write_text(
            json.dumps(
                {
                    "worked": sorted(x for x, _ in worked),
                    "total": total,
                    "even": sorted(even),
                    "odd": sorted(odd),
                }
            )
        )

    options = PipelineOptions([f"--dask_client_address={dask_cluster}"])
    p = beam.Pipeline(runner=DaskRunner(), options=options)
    worked = (
        p
        | "Numbers" >> beam.Create(list(range(40)))
        | "Spread" >> beam.Reshuffle()
        | "Work" >> beam.Map(work, str(calls))
    )
    total = worked | "Count" >> beam.combiners.Count.Globally()
    split = worked | "Split" >> beam.ParDo(Split()).with_outputs("odd", main="even")
    _ = (
        p
        | "Start" >> beam.Create([None])
        | "Collect"
        >> beam.Map(
            collect,
            str(report),
            worked=AsList(worked),
            total=AsSingleton(total),
            even=AsList(split.even),
            odd=AsList(split.odd),
        )
    )
    result = p.run()
    try:
        result.wait_until_finish()
    finally:
        result.client.close()
    got = json.loads(report.read_text())
    # Once per element, though four side inputs read the step's output.
    tasks = [call.read_text() for call in calls.iterdir()]
    assert len(tasks) == 40
    assert got["worked"] == list(range(40))
    assert got["total"] == 40
    # Spread: the one Create partition became several tasks, so that every
    # worker can take a share (which worker takes which is the scheduler's call).
    assert len(set(tasks)) > 1, set(tasks)
    finished = got["even"].count(-1)
    assert finished >= 1  # one per bundle of Split
    assert [x for x in got["even"] if x >= 0] == list(range(0, 40, 2))
    assert got["odd"] == list(range(1, 40, 2))


def test_a_reuse_run_on_dask_writes_what_a_full_conversion_writes(dask_cluster, images, tmp_path):
    """--reuse on Dask: OLD's shards scanned on the workers, joined to the images by ID."""
    import shutil

    from tests.image_factory import jpeg_bytes, photo

    assert _convert(images, tmp_path / "old") == 0
    grown = tmp_path / "grown"
    shutil.copytree(images, grown)
    (grown / "cat" / "new.jpg").write_bytes(jpeg_bytes(photo(90, 70, seed=5)))
    (grown / "dog" / "dog_0001.jpg").write_bytes(jpeg_bytes(photo(80, 70, seed=6)))
    on_dask = ["--runner", "DaskRunner", "--dask_client_address", dask_cluster]
    assert _convert(grown, tmp_path / "full", "--direct_running_mode=in_memory") == 0
    assert _convert(grown, tmp_path / "new", "--reuse", str(tmp_path / "old"), *on_dask) == 0

    full = contract.all_files(str(tmp_path / "full"))
    new = contract.all_files(str(tmp_path / "new"))
    info = json.loads(new.pop("imagerecords.json"))
    assert info.pop("reuse") == {"dataset": str(tmp_path / "old"), "images_reused": 35}
    assert json.loads(full.pop("imagerecords.json")) == info
    assert new == full


def test_label_conflicts_on_dask_are_what_the_local_engine_writes(dask_cluster, tmp_path, capsys):
    """A picture in two classes (identical, and near under --dedupe near): the same
    ``label_conflicts`` block and bytes on Dask as locally."""
    pytest.importorskip("skimage")
    import shutil

    from tests import near_fixtures

    root = near_fixtures.near_folder(str(tmp_path / "images"))
    shutil.copy(os.path.join(root, "train/a/coffee.jpg"), os.path.join(root, "train/b/mug.jpg"))
    on_dask = ["--runner", "DaskRunner", "--dask_client_address", dask_cluster]
    common = ["--input", root, "--quiet", "--dedupe", "near", "--max_reject_fraction", "0.6"]
    for out, extra in [("local", []), ("dask", on_dask)]:
        assert main([*common, "--output", str(tmp_path / out), *extra]) == 0
    capsys.readouterr()
    local = contract.all_files(str(tmp_path / "local"))
    assert contract.all_files(str(tmp_path / "dask")) == local
    block = contract.load_info(str(tmp_path / "dask"))["label_conflicts"]
    assert block["exact"] == 1 and block["near"] >= 1
