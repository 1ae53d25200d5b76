"""beam_pipeline.storage.gcs against a real GCS API server (the emulator), plus the failure modes.

The emulator does not enforce IAM, so permission errors come from the
``gcs_account`` server, which answers the way GCS does when an account lacks a
permission (status, JSON error body); the storage client is the real one either way.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from beam_pipeline.core.errors import UsageError
from beam_pipeline.storage import gcs, paths
from tests import gcs_fixtures
from tests.gcs_fixtures import REPO_ROOT

pytestmark = pytest.mark.e2e

# Fixtures used by name in this module (an import would read as unused to linters).


@pytest.fixture
def images(gcs_emulator, gcs_bucket):
    """``gs://BUCKET/in`` with class folders, nested files and folder placeholders."""
    for name in [
        "in/",  # placeholder for the input folder itself
        "in/cat/a.jpg",
        "in/cat/deeper/b.jpg",
        "in/dog/c.jpg",
        "in/fish/",  # a class folder created in the Console, still empty
        "in/readme.txt",  # a file beside the class folders is not a class
        "income/x.jpg",  # shares the prefix "in" but is another folder
    ]:
        gcs_emulator.upload_bytes(f"gs://{gcs_bucket}/{name}", b"" if name.endswith("/") else b"x")
    return f"gs://{gcs_bucket}/in"


def test_split_url():
    assert gcs.split_url("gs://bucket/a/b/") == ("bucket", "a/b/")
    assert gcs.split_url("gs://bucket") == ("bucket", "")
    with pytest.raises(ValueError):
        gcs.split_url("/local/path")


@pytest.mark.parametrize(
    "relative, hidden",
    [
        ("cat/a.jpg", False),
        ("cat/.DS_Store", True),
        (".cache/cat/a.jpg", True),
        ("cat/.thumbs/a.jpg", True),
        ("cat/back\\.slash.jpg", False),  # a backslash is part of the name, not a separator
        ("cat\\.x/a.jpg", False),
        ("cat/a.b.jpg", False),
        ("/cat/a.jpg", False),
    ],
)
def test_hidden_means_a_leading_dot_in_a_slash_separated_component(relative, hidden):
    assert paths.is_hidden(relative) is hidden


def test_folder_placeholders_are_names_ending_in_a_slash():
    assert gcs.is_folder_placeholder("in/fish/")
    assert not gcs.is_folder_placeholder("in/fish/a.jpg")


@pytest.mark.parametrize("suffix", ["", "/"])
def test_list_prefixes_gives_immediate_folders_only(images, suffix):
    bucket = gcs.split_url(images)[0]
    assert gcs.list_prefixes(images + suffix) == [
        f"gs://{bucket}/in/cat",
        f"gs://{bucket}/in/dog",
        f"gs://{bucket}/in/fish",
    ]
    assert gcs.list_prefixes(f"gs://{bucket}") == [f"gs://{bucket}/in", f"gs://{bucket}/income"]
    assert gcs.list_prefixes(images + "/cat") == [f"gs://{bucket}/in/cat/deeper"]
    assert gcs.list_prefixes(images + "/dog") == []


def test_check_input_accepts_a_folder_a_bucket_root_and_a_single_object(images):
    bucket = gcs.split_url(images)[0]
    gcs.check_input(images)
    gcs.check_input(images + "/")
    gcs.check_input(f"gs://{bucket}")
    gcs.check_input(images + "/readme.txt")  # e.g. a manifest stored in GCS


def test_check_input_missing_bucket(gcs_emulator):
    with pytest.raises(UsageError, match=r"^Bucket gs://no-such-bucket-7 does not exist"):
        gcs.check_input("gs://no-such-bucket-7/images")


@pytest.mark.parametrize(
    "path",
    [
        "nothing-here",  # no object at all
        "in/fish",  # only a folder placeholder
        "in/ca",  # a prefix of a folder name is not a folder
    ],
)
def test_check_input_empty_prefix(images, path):
    url = f"gs://{gcs.split_url(images)[0]}/{path}"
    with pytest.raises(
        UsageError, match=rf"^No objects under {url} \(nor an object of that name\)"
    ):
        gcs.check_input(url)


def test_check_output_says_whether_the_folder_holds_files(images):
    bucket = gcs.split_url(images)[0]
    assert gcs.check_output(images) is True
    assert gcs.check_output(f"gs://{bucket}/new/output") is False
    assert gcs.check_output(f"gs://{bucket}/in/fish") is False  # placeholder only
    with pytest.raises(UsageError, match=r"^Bucket gs://no-such-bucket-7 does not exist"):
        gcs.check_output("gs://no-such-bucket-7/out")


# ------------------------------------------------------------ IAM failures


def test_no_permission_to_read_names_the_role(gcs_account):
    gcs_account()
    for check in (gcs.check_input, gcs.list_prefixes):
        with pytest.raises(UsageError) as error:
            check("gs://private/images")
        message = str(error.value)
        assert message.startswith("Permission denied to list ")
        assert "gs://private/images" in message
        assert "roles/storage.objectViewer" in message
        assert "storage.objects.list" in message  # GCS's own reason is kept
        assert "\n" not in message


def test_read_only_account_cannot_be_the_output(gcs_account):
    gcs_account("storage.objects.get", "storage.objects.list")
    with pytest.raises(UsageError) as error:
        gcs.check_output("gs://shared/out")
    message = str(error.value)
    assert message.startswith("Permission denied to write to gs://shared/out")
    assert "storage.objects.create, storage.objects.delete" in message
    assert "roles/storage.objectAdmin" in message


def test_writable_account_passes_check_output(gcs_account):
    gcs_account(*gcs.OUTPUT_PERMISSIONS)
    assert gcs.check_output("gs://shared/out") is False


def test_unauthenticated_request_asks_for_credentials(gcs_account):
    # The client is anonymous here (STORAGE_EMULATOR_HOST); GCS answers 401 to an
    # anonymous request for a private bucket and the client cannot refresh.
    gcs_account(status=401)
    with pytest.raises(
        UsageError, match="^No Google Cloud credentials to list objects in gs://priv"
    ):
        gcs.check_input("gs://private/images")


def test_user_credentials_without_a_project(images, gcs_emulator, monkeypatch, tmp_path):
    """`gcloud auth application-default login` without a gcloud project still lists.

    API_ENDPOINT_OVERRIDE (unlike STORAGE_EMULATOR_HOST) keeps the client on the
    session's fake authorized-user credentials, which carry no project.
    """
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT")
    monkeypatch.setenv("API_ENDPOINT_OVERRIDE", gcs_emulator.url)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud default project
    gcs.check_input(images)
    assert gcs.check_output(images) is True
    assert len(gcs.list_prefixes(images)) == 3


def test_unreachable_storage_is_one_line_after_a_short_retry(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{gcs_fixtures.free_port()}")
    monkeypatch.setattr(gcs, "_CHECK_RETRY_TIMEOUT_S", 1.0)
    with pytest.raises(UsageError) as error:
        gcs.check_input("gs://some-bucket/images")
    message = str(error.value)
    assert message.startswith("Cannot reach Google Cloud Storage to list objects in gs://some")
    assert "\n" not in message


# ------------------------------------------------------------ no credentials


def _offline_env(tmp_path, **extra) -> dict[str, str]:
    """An environment with no credentials anywhere and no emulator."""
    env = {k: v for k, v in os.environ.items() if k not in {"STORAGE_EMULATOR_HOST"}}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    env.update(
        HOME=str(tmp_path),  # no ~/.config/gcloud/application_default_credentials.json
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
        NO_GCE_CHECK="true",  # do not wait for a GCE metadata server
        PATH=os.path.dirname(sys.executable),  # no gcloud binary to ask
        PYTHONPATH=str(REPO_ROOT),
        **extra,
    )
    return env


@pytest.mark.parametrize(
    "adc, side",
    [(None, "input"), ("missing.json", "input"), (None, "output")],
    ids=["input", "input-adc-file-missing", "output"],
)
def test_no_credentials_fail_fast_with_the_fix(tmp_path, adc, side):
    """Through the CLI, as a user sees it: one line, exit status 2, in about a second."""
    extra = {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / adc)} if adc else {}
    local = tmp_path / "images"
    (local / "cat").mkdir(parents=True)
    (local / "cat" / "a.jpg").write_bytes(b"not read: the job stops before")
    paths = {
        "input": ["--input", "gs://some-bucket/images", "--output", str(tmp_path / "out")],
        "output": ["--input", str(local), "--output", "gs://some-bucket/out"],
    }[side]
    result = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", *paths],
        env=_offline_env(tmp_path, **extra),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip()
    doing = "list objects in gs://some-bucket/images" if side == "input" else "write to gs://some"
    assert message.startswith(f"error: No Google Cloud credentials to {doing}"), message
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message
    assert "gcloud auth application-default login" in message
    assert len(message.splitlines()) == 1
    if adc:
        assert "missing.json was not found" in message


# --------------------------------------------------- --gcs_timeout_s and lost connections


@pytest.fixture
def retry_policies():
    """The shared retry policies --gcs_timeout_s sets, restored afterwards."""
    import apache_beam.io.gcp.gcsio_retry  # noqa: F401 - loaded, as in a run that reads gs://
    import google.cloud.storage.retry as storage_retry

    policies = [
        storage_retry.DEFAULT_RETRY,
        apache_beam.io.gcp.gcsio_retry.DEFAULT_RETRY_WITH_THROTTLING_COUNTER,
    ]
    before = [p._timeout for p in policies]
    yield policies
    for policy, timeout in zip(policies, before, strict=True):
        policy._timeout = policy._deadline = timeout


def test_gcs_timeout_bounds_the_clients_shared_retries(retry_policies, monkeypatch):
    monkeypatch.setenv(gcs.TIMEOUT_ENV, "7")
    gcs.bound_retries()
    assert [p.timeout for p in retry_policies] == [7.0, 7.0]
    # The conditional policies (requests with a generation precondition) wrap the default.
    from google.cloud.storage.retry import DEFAULT_RETRY_IF_GENERATION_SPECIFIED

    assert DEFAULT_RETRY_IF_GENERATION_SPECIFIED.retry_policy.timeout == 7.0


@pytest.mark.parametrize(
    "timeout, capped",
    [
        (60.0, 5.0),
        (3.0, 3.0),
        (None, 5.0),  # no limit at all: the cap
        ((61.0, 60.0), (5.0, 5.0)),  # (connect, read)
        ((2.0, None), (2.0, 5.0)),
    ],
)
def test_an_attempts_time_limit_is_capped_at_the_gcs_timeout(timeout, capped):
    assert gcs.capped_timeout(timeout, 5.0) == capped


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "hanging"])
def test_a_request_to_a_lost_gcs_gives_up_at_the_deadlines_gcs_timeout_sets(
    gcs_emulator, gcs_bucket, monkeypatch, retry_policies, hang
):
    """Through the storage client as the run makes it (its own 60 s per attempt, 120 s
    of retries by default), GCS lost: the client gives up at --gcs_timeout_s on both
    counts, and says so. The deadlines are read from what the client reports, not
    from a clock."""
    import requests
    from google.api_core import exceptions as api

    from tests.gcs_faults import DroppingProxy

    url = f"gs://{gcs_bucket}/an-image.jpg"
    gcs_emulator.upload_bytes(url, b"jpeg")
    proxy = DroppingProxy(gcs_emulator.url, hang=hang)
    try:
        proxy.drop()
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        monkeypatch.setenv(gcs.TIMEOUT_ENV, "1")
        bucket, name = gcs.split_url(url)
        with pytest.raises(api.RetryError) as error:
            gcs.client().bucket(bucket).blob(name).download_as_bytes()
    finally:
        proxy.close()
    assert "Timeout of 1.0s exceeded" in str(error.value)  # the retries' deadline
    assert isinstance(error.value.cause, requests.RequestException)
    if hang:  # each attempt's own limit: the server was waited for 1 s, not 60
        assert isinstance(error.value.cause, requests.ReadTimeout)
        assert "read timeout=1.0" in str(error.value.cause)
        assert proxy.unanswered, "the request never reached the hanging server"
    else:
        assert isinstance(error.value.cause, requests.ConnectionError)
    assert gcs.is_unreachable(error.value)


def test_read_range_reads_bytes_and_stops_the_run_when_gcs_hangs(
    gcs_emulator, gcs_bucket, monkeypatch, retry_policies
):
    from beam_pipeline.core.errors import StorageUnreachable
    from tests.gcs_faults import DroppingProxy

    url = f"gs://{gcs_bucket}/old/a.tfrecord"
    gcs_emulator.upload_bytes(url, b"0123456789")
    monkeypatch.setattr(gcs, "_range_client", None)
    assert gcs.read_range(url, 2, 5) == b"234"
    proxy = DroppingProxy(gcs_emulator.url, hang=True)
    try:
        proxy.drop()  # from now on: connections accepted, requests read, nothing answered
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        monkeypatch.setenv(gcs.TIMEOUT_ENV, "1")
        monkeypatch.setattr(gcs, "_range_client", None)
        with pytest.raises(StorageUnreachable, match=rf"could not reach {url} within "):
            gcs.read_range(url, 2, 5)
    finally:
        proxy.close()
        monkeypatch.setattr(gcs, "_range_client", None)


def test_only_a_lost_connection_counts_as_unreachable():
    import requests
    from google.api_core import exceptions as api

    lost = api.RetryError("Timeout of 5.0s exceeded", requests.ConnectionError("refused"))
    assert gcs.is_unreachable(lost)
    assert gcs.is_unreachable(api.ServiceUnavailable("try later"))
    assert not gcs.is_unreachable(api.NotFound("no such object"))
    assert not gcs.is_unreachable(api.Forbidden("denied"))
    assert not gcs.is_unreachable(ValueError("a bad image"))
    error = gcs.unreachable("gs://b/images/x.jpg", lost)
    assert str(error).startswith(
        "lost the connection to Google Cloud Storage: could not reach gs://b/images/x.jpg "
        "within --gcs_timeout_s "
    )
    assert "(ConnectionError: refused)" in str(error)


def test_gs_paths_work_after_a_local_run_in_the_same_process(gcs_emulator, gcs_bucket, tmp_path):
    """A local run imports Beam without its GCS filesystem; a later gs:// job (or
    call) in the same process must still reach GCS, not fail 'Unable to get filesystem'."""
    code = (
        "import sys\n"
        "from beam_pipeline.beam_internals import beam_private\n"
        "from beam_pipeline.storage import output, paths\n"
        "beam_private.import_beam_for_local_run(uses_gcs=False)\n"
        "assert 'apache_beam' in sys.modules\n"
        "target = sys.argv[1] + '/labels.txt'\n"
        "output.write_atomically(target, b'cat\\n')\n"
        "with paths.filesystems().open(target) as stream:\n"
        "    assert stream.read() == b'cat\\n'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, f"gs://{gcs_bucket}/out"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert gcs_emulator.read_bytes(f"gs://{gcs_bucket}/out/labels.txt") == b"cat\n"
