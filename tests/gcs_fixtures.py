"""A real GCS API server for the tests: the ``gcp-storage-emulator`` package.

``tests/conftest.py`` offers these fixtures to every test module; ask for
them by name.

* ``gcs_emulator`` (session): starts the emulator as a subprocess on a free
  127.0.0.1 port, points ``STORAGE_EMULATOR_HOST`` at it and sets
  ``GOOGLE_APPLICATION_CREDENTIALS`` to a fake authorized-user file. Without
  that file Beam's GCS client looks for credentials before going anonymous,
  which costs ~30 s per process; with it google-auth finds a (fake) access
  token valid until 2999 and never refreshes it. The variables stay set for
  the whole session (``pytest -n`` gives each worker its own emulator), so
  subprocesses and DirectRunner ``multi_processing`` workers inherit them.
* ``gcs_bucket``: a fresh, uniquely named bucket per test (no wiping needed).
* ``tf_gcs_env`` (session): environment variables for a *subprocess* whose
  TensorFlow reads ``gs://`` through :mod:`tests.gcs_proxy`.
* ``gcs_account``: points the storage client (in this process) at a server
  that answers like GCS for an account with only some permissions; the
  emulator grants everything to everyone.

The :class:`GcsEmulator` object the fixture yields has helpers to create
buckets and move files in and out with google-cloud-storage.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30

# The fake token google-auth (Beam, the storage client) and TensorFlow present.
FAKE_TOKEN = "imagerecords-test-token"
FAKE_PROJECT = "imagerecords-test"


# Runs the emulator with two fixes. It builds an object's ``mediaLink`` from the
# raw object name, so a name with "#" or "?" yields a URL that points elsewhere
# (the client downloads through mediaLink and gets 404). GCS percent-encodes the
# name there; so does this wrapper, before the emulator's own entry point. And
# it ignores generation preconditions, which this wrapper checks as GCS does.
_EMULATOR_MAIN = """
import sys
import urllib.parse

from gcp_storage_emulator.handlers import objects

_make_object_resource = objects._make_object_resource


def make_object_resource(base_url, bucket_name, object_name, *args, **kwargs):
    obj = _make_object_resource(base_url, bucket_name, object_name, *args, **kwargs)
    quoted = urllib.parse.quote(object_name, safe="")
    obj["mediaLink"] = obj["mediaLink"].replace(f"/o/{object_name}?", f"/o/{quoted}?", 1)
    obj["selfLink"] = obj["selfLink"].replace(f"/o/{object_name}", f"/o/{quoted}", 1)
    return obj


objects._make_object_resource = make_object_resource

# Generation preconditions (ifGenerationMatch, ifGenerationNotMatch), which the
# emulator ignores: GCS answers 412 when one does not hold, and 0 matches only
# an object that does not exist. (The output lock relies on them.)
from http import HTTPStatus

from gcp_storage_emulator.exceptions import NotFound


def _object_name(request):
    if "object_id" in request.params:
        return request.params["object_id"]
    if "name" in request.query:
        return request.query["name"][0]
    data = request.data if isinstance(request.data, dict) else {}
    return (data.get("meta") or data).get("name")


def _precondition_holds(request, storage):
    wanted = request.query.get("ifGenerationMatch", [None])[0]
    unwanted = request.query.get("ifGenerationNotMatch", [None])[0]
    if wanted is None and unwanted is None:
        return True
    try:
        current = str(storage.get_file_obj(request.params["bucket_name"], _object_name(request))["generation"])
    except NotFound:
        current = "0"
    return (wanted is None or wanted == current) and (unwanted is None or unwanted != current)


def _with_preconditions(handler):
    def checked(request, response, storage, *args, **kwargs):
        if not _precondition_holds(request, storage):
            response.status = HTTPStatus.PRECONDITION_FAILED
            message = "At least one of the pre-conditions you specified did not hold."
            response.json({"error": {"code": 412, "message": message,
                                     "errors": [{"reason": "conditionNotMet", "message": message}]}})
            return None
        return handler(request, response, storage, *args, **kwargs)

    return checked


for _name in ("insert", "get", "download", "delete"):
    setattr(objects, _name, _with_preconditions(getattr(objects, _name)))

from gcp_storage_emulator.__main__ import main

main(sys.argv[1:])
"""


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM if pytest dies without tearing down."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def write_fake_credentials(path: Path) -> Path:
    """An authorized-user ADC file whose access token never needs refreshing.

    google-auth reads ``token`` and ``expiry`` from the file; with a far expiry
    it uses the token as is, so nothing ever contacts oauth2.googleapis.com.
    """
    path.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "imagerecords-test.apps.googleusercontent.com",
                "client_secret": "not-a-secret",
                "refresh_token": "not-a-refresh-token",
                "token": FAKE_TOKEN,
                "expiry": "2999-01-01T00:00:00Z",
            }
        )
    )
    return path


class GcsEmulator:
    """A running ``gcp-storage-emulator`` and helpers to use it from tests."""

    def __init__(self, url: str, process: subprocess.Popen, log: Path):
        self.url = url
        self.process = process
        self.log = log
        self._client = None

    @classmethod
    def start(cls, log_dir: Path) -> GcsEmulator:
        """Starts the emulator (in memory) on a free port and waits until it answers."""
        last_error = ""
        for _ in range(3):  # another process may grab the free port first
            port = free_port()
            log = log_dir / f"emulator-{port}.log"
            process = subprocess.Popen(
                [sys.executable, "-c", _EMULATOR_MAIN, "start"]
                + ["--host", "127.0.0.1", "--port", str(port), "--in-memory", "-q"],
                stdin=subprocess.DEVNULL,
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and process.poll() is None:
                if _answers(url + "/"):
                    return cls(url, process, log)
                time.sleep(0.05)
            _stop(process)
            last_error = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"gcp-storage-emulator did not start:\n{last_error}")

    def stop(self) -> None:
        _stop(self.process)

    def client(self):
        """A google-cloud-storage client bound to this emulator (whatever the env says)."""
        if self._client is None:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            self._client = storage.Client(
                project=FAKE_PROJECT,
                credentials=AnonymousCredentials(),
                client_options={"api_endpoint": self.url},
            )
        return self._client

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(name)
        return name

    def _blob(self, url: str):
        bucket, _, name = url[len("gs://") :].partition("/")
        return self.client().bucket(bucket).blob(name)

    def upload_bytes(self, url: str, data: bytes | str) -> None:
        self._blob(url).upload_from_string(data)

    def read_bytes(self, url: str) -> bytes:
        return self._blob(url).download_as_bytes()

    def upload_dir(self, local_dir: Path, url: str) -> list[str]:
        """Uploads every file under ``local_dir`` to the folder ``url``; returns the URLs."""
        urls = []
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file():
                target = f"{url.rstrip('/')}/{path.relative_to(local_dir).as_posix()}"
                self._blob(target).upload_from_filename(str(path))
                urls.append(target)
        return urls

    def list_names(self, url: str) -> list[str]:
        """Object names (relative to the folder ``url``) under it, sorted; placeholders too."""
        bucket, _, prefix = url[len("gs://") :].partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        return sorted(
            blob.name[len(prefix) :] for blob in self.client().list_blobs(bucket, prefix=prefix)
        )

    def download_dir(self, url: str, local_dir: Path) -> Path:
        """Copies every object under the folder ``url`` into ``local_dir``."""
        for name in self.list_names(url):
            if name and not name.endswith("/"):
                target = Path(local_dir) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(self.read_bytes(f"{url.rstrip('/')}/{name}"))
        return Path(local_dir)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """The session's emulator, with the GCS environment variables set for the session."""
    directory = tmp_path_factory.mktemp("gcs")
    emulator = GcsEmulator.start(directory)
    patch = pytest.MonkeyPatch()
    try:
        patch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
        patch.setenv(
            "GOOGLE_APPLICATION_CREDENTIALS",
            str(write_fake_credentials(directory / "fake-adc.json")),
        )
        # Otherwise google-auth warns and probes for a project on every client.
        patch.setenv("GOOGLE_CLOUD_PROJECT", FAKE_PROJECT)
        yield emulator
    finally:
        patch.undo()
        emulator.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator) -> str:
    """A new empty bucket's name."""
    return gcs_emulator.create_bucket()


@pytest.fixture(scope="session")
def gcs_proxy(gcs_emulator, tmp_path_factory):
    """Runs :mod:`tests.gcs_proxy` for the session; yields ``(port, ca_path, log_path)``."""
    from tests.gcs_proxy import make_certificates

    directory = tmp_path_factory.mktemp("gcs-proxy")
    certs = make_certificates(directory)
    log = directory / "proxy.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.gcs_proxy", "--upstream", gcs_emulator.url]
        + ["--cert", str(certs["cert"]), "--key", str(certs["key"])],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,  # closing it stops the proxy
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        preexec_fn=_die_with_parent,
    )
    try:
        line = process.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"gcs proxy did not start:\n{log.read_text(errors='replace')}")
        yield int(line), certs["ca"], log
    finally:
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _stop(process)


@pytest.fixture(scope="session")
def tf_gcs_env(gcs_proxy) -> dict[str, str]:
    """The full environment for a subprocess whose TensorFlow reads gs:// from the emulator.

    TensorFlow's GCS filesystem reads these when it first touches ``gs://``:
    ``https_proxy`` (libcurl tunnels through the proxy), ``CURL_CA_BUNDLE`` (trust
    the throwaway CA), ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` (skip OAuth entirely) and
    ``NO_GCE_CHECK`` (do not probe the GCE metadata server).
    """
    port, ca, _ = gcs_proxy
    env = dict(os.environ)
    for name in ("no_proxy", "NO_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        env.pop(name, None)
    env.update(
        https_proxy=f"http://127.0.0.1:{port}",
        HTTPS_PROXY=f"http://127.0.0.1:{port}",
        CURL_CA_BUNDLE=str(ca),
        GOOGLE_AUTH_TOKEN_FOR_TESTING=FAKE_TOKEN,
        NO_GCE_CHECK="true",
        # Quieter TF start-up; errors still print.
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
    )
    return env


# ------------------------------------------------ IAM (the emulator has none)


class _GcsDenies(BaseHTTPRequestHandler):
    """Answers like GCS for an account with only ``granted`` permissions on a bucket."""

    granted: tuple[str, ...] = ()
    status = 403

    def do_GET(self):  # noqa: N802 - http.server naming
        if "/iam/testPermissions" in self.path:
            self._json(
                200,
                {"kind": "storage#testIamPermissionsResponse", "permissions": list(self.granted)},
            )
        elif "/o" in self.path and "storage.objects.list" in self.granted:
            self._json(200, {"kind": "storage#objects", "items": [], "prefixes": []})
        else:
            message = (
                "alice@example.com does not have storage.objects.list access to the Google "
                "Cloud Storage bucket. Permission 'storage.objects.list' denied on resource "
                "(or it may not exist)."
            )
            if self.status == 401:
                message = "Invalid Credentials"
            self._json(
                self.status,
                {
                    "error": {
                        "code": self.status,
                        "message": message,
                        "errors": [{"message": message}],
                    }
                },
            )

    def _json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def gcs_account(monkeypatch):
    """Points the storage client at a server that denies; yields a function to set the grants."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_GcsDenies,), {}))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_address[1]}")

    def account(*granted, status=403):
        server.RequestHandlerClass.granted = granted
        server.RequestHandlerClass.status = status

    yield account
    server.shutdown()
    server.server_close()
