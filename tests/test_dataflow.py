"""The Dataflow job, built offline: the CLI writes a template instead of submitting.

``--template_location FILE`` makes Beam's DataflowRunner do everything a
submission does up to the API call: translate the graph into the pipeline
proto, build and stage the worker package, write the job description. With
``--temp_location``/``--staging_location`` in the GCS emulator, nothing
leaves this machine. What this proves, and what it cannot, is in
deploy/README.md ("What the offline test proves").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests import worker_env
from tests.image_factory import make_class_folders

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "us-central1-docker.pkg.dev/my-project-123/imagerecords/imagerecords:abc123"
ACCOUNT = "converter@my-project-123.iam.gserviceaccount.com"
# The composite steps (docs/format.md) and the primitives that do the work.
STEPS = [
    "ListImages",
    "ListImages/ListFolder",
    "ConvertImages",
    "ConvertImages/Convert",
    "PlanShards",
    "PlanShards/TallyPerSplit",
    "WriteShards",
    "WriteShards/GroupByShard",
    "WriteShards/WriteShard",
    "Finalize",
]


@pytest.fixture(scope="module")
def template(gcs_emulator, tmp_path_factory):
    """Builds the template through the CLI, as a user would; the job file and staged files."""
    base = tmp_path_factory.mktemp("dataflow")
    bucket = gcs_emulator.create_bucket()
    make_class_folders(str(base / "images"), per_class=2)
    gcs_emulator.upload_dir(base / "images", f"gs://{bucket}/images")
    job_file = base / "template.json"
    command = [sys.executable, "-m", "beam_pipeline"]
    command += ["--input", f"gs://{bucket}/images", "--output", f"gs://{bucket}/records"]
    command += ["--runner", "DataflowRunner", "--project", "my-project-123"]
    command += ["--region", "europe-west4", "--template_location", str(job_file)]
    command += ["--temp_location", f"gs://{bucket}/tmp"]
    command += ["--staging_location", f"gs://{bucket}/staging"]
    command += ["--setup_file", str(ROOT / "setup.py"), "--sdk_container_image", IMAGE]
    command += ["--machine_type", "c3-standard-8", "--max_num_workers", "37"]
    command += ["--service_account_email", ACCOUNT]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr[-3000:]  # (else nothing is staged to look at)
    staged = gcs_emulator.download_dir(f"gs://{bucket}/staging", base / "staged")
    (job_dir,) = [p for p in staged.iterdir() if p.is_dir()]
    return {
        "done": done,
        "job": json.loads(job_file.read_text()),
        "staged": job_dir,
        "output_names": gcs_emulator.list_names(f"gs://{bucket}/records"),
        "base": base,
    }


def _pipeline_proto(staged: Path):
    from apache_beam.portability.api import beam_runner_api_pb2

    return beam_runner_api_pb2.Pipeline.FromString((staged / "pipeline.pb").read_bytes())


def test_template_build_ends_with_one_line_naming_the_template(template):
    done = template["done"]
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and str(template["base"] / "template.json") in lines[0], done.stdout
    assert "Traceback" not in done.stderr
    assert template["output_names"] == []  # nothing ran


def test_job_description_carries_the_users_options(template):
    environment = template["job"]["environment"]
    (pool,) = environment["workerPools"]
    assert pool["machineType"] == "c3-standard-8"
    assert pool["autoscalingSettings"]["maxNumWorkers"] == 37
    assert [c["containerImage"] for c in pool["sdkHarnessContainerImages"]] == [IMAGE]
    assert "use_runner_v2" in environment["experiments"]
    options = {d["key"]: d["value"] for d in environment["sdkPipelineOptions"]["display_data"]}
    assert options["project"] == "my-project-123"
    assert options["region"] == "europe-west4"
    assert options["service_account_email"] == ACCOUNT
    assert options["sdk_container_image"] == IMAGE
    # Runner v2: the graph is not in the job file but in the staged pipeline proto.
    assert "steps" not in template["job"]
    assert "workflow.tar.gz" in {p["name"] for p in pool["packages"]}  # setup.py's sdist
    assert (template["staged"] / "pipeline.pb").exists()


def test_staged_pipeline_has_the_steps_and_the_container(template):
    proto = _pipeline_proto(template["staged"])
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert [s for s in STEPS if s not in names] == []
    (environment,) = proto.components.environments.values()
    from apache_beam.portability.api import beam_runner_api_pb2

    docker = beam_runner_api_pb2.DockerPayload.FromString(environment.payload)
    assert docker.container_image == IMAGE
    artifacts = {
        beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(d.role_payload).staged_name
        for d in environment.dependencies
    }
    assert "workflow.tar.gz" in artifacts


def test_workers_install_setup_py_without_tensorflow(template):
    sdist = template["staged"] / "workflow.tar.gz"
    requires = worker_env.install_requires(sdist)
    assert [r for r in requires if "tensorflow" in r.lower()] == []
    assert (
        {r.split("[")[0].split(">")[0].split("=")[0] for r in requires}
        == {
            "apache-beam",
            "pillow",
            "google-cloud-storage",
            "google-crc32c",
            "protobuf",
            "simplejpeg",  # libjpeg-turbo's strict decode (beam_pipeline/core/jpeg.py)
            "regex",  # --group_by's time-bounded match (core/groups.py); Beam[gcp] needs it too
            "tqdm",  # the launcher's progress line (beam_pipeline/engines/progress.py); small, pure Python
        }
    )
    with tarfile.open(sdist) as tar:
        names = {m.name.split("/", 1)[-1] for m in tar.getmembers()}
    assert {
        "setup.py",
        "beam_pipeline/engines/pipeline.py",
        "beam_pipeline/stages/convert.py",
    } <= names
    # Nothing a worker would pull in through the closure is TensorFlow either.
    assert [n for n in worker_env.closure(requires) if "tensorflow" in n] == []


# Runs in the worker-only interpreter: every pickled payload of the staged
# pipeline, loaded the way the SDK harness loads it (bundle_processor: DoFns and
# CombineFns with pickler.loads, pickled coders with deserialize_coder), then the
# main session. Prints what it loaded as JSON.
_LOAD_EVERYTHING = """
import importlib.util, json, sys
from apache_beam.coders import coders
from apache_beam.internal import pickler
from apache_beam.portability.api import beam_runner_api_pb2 as api

proto = api.Pipeline.FromString(open(sys.argv[1], "rb").read())
loaded = {}
for t in proto.components.transforms.values():
    if t.spec.urn == "beam:transform:pardo:v1":
        fn = pickler.loads(api.ParDoPayload.FromString(t.spec.payload).do_fn.payload)[0]
    elif t.spec.urn == "beam:transform:combine_per_key:v1":
        fn = pickler.loads(api.CombinePayload.FromString(t.spec.payload).combine_fn.payload)
    elif t.spec.urn == "beam:transform:pickled_python:v1":
        fn = pickler.loads(t.spec.payload)
    else:
        continue
    loaded[t.unique_name] = type(fn).__module__ + "." + type(fn).__qualname__
coders_loaded = 0
for coder in proto.components.coders.values():
    if coder.spec.urn == "beam:coder:pickled_python:v1":
        coders.deserialize_coder(coder.spec.payload)
        coders_loaded += 1
pickler.load_session(sys.argv[2])
for t in proto.components.transforms.values():
    if t.unique_name.endswith("ParDo(_ConvertFn)"):
        fn = pickler.loads(api.ParDoPayload.FromString(t.spec.payload).do_fn.payload)[0]
        fn.setup()
        fn.start_bundle()
        list(fn.process(("cat/one.jpg", sys.argv[3], 0, "train")))
        (batch,) = [out.value for out in fn.finish_bundle()]
        converted = [type(batch).__name__, [e.label for e in batch.entries]]
modules = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "dask", "tests"))
hidden = [n for n in ("tensorflow", "dask", "pytest", "tests.gcs_fixtures")
          if importlib.util.find_spec(n.split(".")[0]) and importlib.util.find_spec(n)]
print(json.dumps({"hidden": hidden, "loaded": loaded, "coders": coders_loaded,
                  "converted": converted,
                  "modules": modules}))
"""


@pytest.fixture(scope="module")
def worker_site(template, tmp_path_factory):
    return worker_env.build_site(
        template["staged"] / "workflow.tar.gz", tmp_path_factory.mktemp("worker") / "site"
    )


def test_every_pickled_step_loads_with_only_the_workers_packages(template, worker_site):
    staged = template["staged"]
    done = worker_env.run_python(
        worker_site,
        _LOAD_EVERYTHING,
        cwd=worker_site.parent,
        args=[
            str(staged / "pipeline.pb"),
            str(staged / "pickled_main_session"),
            str(next((template["base"] / "images" / "cat").rglob("*.jpg"))),
        ],
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["hidden"] == []  # the interpreter really lacks the test-only packages
    assert report["modules"] == []
    loaded = report["loaded"]
    ours = "beam_pipeline.engines.pipeline."
    assert loaded["ConvertImages/Convert/ParDo(_ConvertFn)"] == ours + "_ConvertFn"
    assert loaded["WriteShards/WriteShard"] == ours + "_WriteShardFn"
    assert loaded["Finalize"] == ours + "_Finalize"
    assert any(name.startswith("ListImages/ListFolder") for name in loaded)
    # The unpickled conversion DoFn converts an image with the worker's Pillow.
    assert report["converted"] == ["RecordBatch", [0]]
    proto = _pipeline_proto(staged)
    pickled = [
        t.unique_name
        for t in proto.components.transforms.values()
        if t.spec.urn
        in (
            "beam:transform:pardo:v1",
            "beam:transform:combine_per_key:v1",
            "beam:transform:pickled_python:v1",
        )
    ]
    assert sorted(loaded) == sorted(pickled)
