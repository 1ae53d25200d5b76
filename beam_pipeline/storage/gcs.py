"""Google Cloud Storage helpers the generic Beam FileSystems API lacks.

Delimiter listings of the first folder level, and the ``check_*`` functions that turn
the client's exceptions into one-line :class:`UsageError` messages before work starts.
Only listings, never bucket metadata (docs/gcs.md, "IAM: who needs what").
"""

from __future__ import annotations

import logging
import os
import re
import sys

from beam_pipeline.core import errors, flags
from beam_pipeline.core.errors import UsageError

# What the converter does to OUTPUT on GCS: write shards and metadata, "rename"
# temporary shards (GCS has no rename: copy, then delete the source), delete old
# files under --overwrite, and list to find leftovers.
OUTPUT_PERMISSIONS = (
    "storage.objects.create",
    "storage.objects.delete",
    "storage.objects.get",
    "storage.objects.list",
)

# A prefix that holds only folder placeholders is empty; give up looking for a
# real object after this many placeholders (a listing page), so that the check
# stays one request on any sane bucket.
_PLACEHOLDER_SCAN_LIMIT = 1000

# Retry budget of each launch-time request. The client's default (120 s of
# retries) leaves a user without network staring at a silent prompt.
_CHECK_RETRY_TIMEOUT_S = 30.0

# --gcs_timeout_s: how long any one request to GCS keeps being retried during
# the run before the run stops (see bound_retries). Five minutes rides out
# the blips GCS clients are built to retry (a dropped connection, a burst of
# 503s, a zonal hiccup: the client's own default is 120 s per request) with
# room to spare, and still ends a run whose connection is gone for good while
# someone is likely to be watching; a rerun resumes what was converted.
DEFAULT_TIMEOUT_S = flags.Table.gcs_timeout_s.default
# The CLI passes the value to every process of the run (forked conversion
# processes, DirectRunner's workers) in this environment variable.
TIMEOUT_ENV = "IMAGERECORDS_GCS_TIMEOUT_S"

_CREDENTIALS_HELP = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, "
    "or run `gcloud auth application-default login`"
)


def split_url(url: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``.

    Raises:
        ValueError: ``url`` is not a ``gs://`` URL.
    """
    if not url.startswith("gs://"):
        raise ValueError(f"not a gs:// URL: {url}")
    bucket, _, prefix = url[len("gs://") :].partition("/")
    return bucket, prefix


def is_folder_placeholder(name: str) -> bool:
    """Whether an object name is a "folder" marker rather than a file.

    The Cloud Console's "Create folder", ``gsutil``-era tools and the Hadoop
    connector create zero-byte objects named ``dir/``. They are not images and
    must be skipped when listing files; ``FileSystems.match`` returns them as
    ordinary files named ``gs://bucket/dir/``.
    """
    return name.endswith("/")


def _folder_prefix(prefix: str) -> str:
    """``a/b`` -> ``a/b/``; the bucket root stays ``""``."""
    prefix = prefix.rstrip("/")
    return prefix + "/" if prefix else ""


def client():
    """A google-cloud-storage client for this process (Application Default Credentials),
    its requests retried for at most --gcs_timeout_s."""
    made = _client()
    bound_retries()
    return made


def _client():
    # Imported lazily: the CLI imports this module for every run, local ones too.
    from google.cloud import storage

    # Without credentials google-auth logs a warning about the GCE metadata
    # server before it raises; the UsageError built from the exception says
    # what to do, so the warning would only be a confusing extra line.
    auth_logger = logging.getLogger("google.auth._default")
    level = auth_logger.level
    auth_logger.setLevel(logging.ERROR)
    try:
        # project=None, not omitted: bucket-scoped calls need no project, and
        # an omitted one must be inferred, which fails for user credentials
        # (`gcloud auth application-default login`) without a gcloud project.
        return storage.Client(project=None)
    finally:
        auth_logger.setLevel(level)


def usage_error(error: Exception, url: str, doing: str) -> UsageError | None:
    """Translates a storage client exception into a one-line :class:`UsageError`.

    Args:
        error: what the google-cloud-storage / google-auth call raised.
        url: the ``gs://`` URL the call was about (named in the message).
        doing: what was attempted, for the message, e.g. ``"list objects in"``.

    Returns:
        The error to raise, or None when ``error`` is not a storage/auth failure
        (the caller re-raises it unchanged).
    """
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    bucket, _ = split_url(url)
    if isinstance(error, auth.DefaultCredentialsError):
        return UsageError(
            f"No Google Cloud credentials to {doing} {url} ({_first_sentence(error)}): "
            f"{_CREDENTIALS_HELP}."
        )
    if isinstance(error, (auth.RefreshError, api.Unauthorized)):
        return UsageError(
            f"Google Cloud credentials were rejected when trying to {doing} {url} "
            f"({_first_line(error)}): {_CREDENTIALS_HELP}."
        )
    if isinstance(error, api.Forbidden):
        return UsageError(
            f"Permission denied to {doing} {url}: the account needs "
            f"{_role_for(doing)} on bucket gs://{bucket} ({_first_line(error)})."
        )
    if isinstance(error, api.NotFound):
        return UsageError(f"Bucket gs://{bucket} does not exist (from {url}).")
    if isinstance(
        error, (auth.TransportError, api.RetryError, api.ServiceUnavailable, _connection_errors())
    ):
        return UsageError(f"Cannot reach Google Cloud Storage to {doing} {url}: {error}")
    return None


def _role_for(doing: str) -> str:
    if "write" in doing:
        return "roles/storage.objectAdmin (or roles/storage.objectUser)"
    return "roles/storage.objectViewer"


def _retry():
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_timeout(min(_CHECK_RETRY_TIMEOUT_S, timeout_s()))


def _first_line(error: Exception) -> str:
    text = getattr(error, "message", None) or str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def _first_sentence(error: Exception) -> str:
    return _first_line(error).split(". ")[0].rstrip(".")


def _connection_errors() -> tuple[type[BaseException], ...]:
    import requests

    return (requests.exceptions.ConnectionError, requests.exceptions.Timeout)


def _first_objects(url: str, doing: str, limit: int):
    """Yields up to ``limit`` object names under ``url``'s folder, mapping errors.

    The first page request is what reveals a missing bucket, missing permission
    or missing credentials, so every failure surfaces here as a UsageError.
    """
    bucket, prefix = split_url(url)
    if not bucket:
        raise UsageError(f"No bucket name in {url!r}: expected gs://BUCKET/PATH.")
    try:
        client = _client()
        # Small pages: the first object is nearly always a real file, so one
        # short response settles it; max_results bounds the whole scan.
        blobs = client.list_blobs(
            bucket,
            prefix=_folder_prefix(prefix),
            max_results=limit,
            page_size=min(limit, 50),
            retry=_retry(),
        )
        for blob in blobs:
            yield blob.name
    except Exception as error:
        translated = usage_error(error, url, doing)
        if translated is None:
            raise
        raise translated from error


def _holds_files(url: str, doing: str) -> bool:
    """Whether the folder ``url`` holds any object that is not a folder placeholder."""
    names = _first_objects(url, doing, _PLACEHOLDER_SCAN_LIMIT + 1)
    for count, name in enumerate(names):
        if not is_folder_placeholder(name) or count >= _PLACEHOLDER_SCAN_LIMIT:
            return True
    return False


def _object_exists(url: str, doing: str) -> bool:
    bucket, name = split_url(url)
    if not name or name.endswith("/"):
        return False
    try:
        return _client().bucket(bucket).blob(name).exists(retry=_retry())
    except Exception as error:
        translated = usage_error(error, url, doing)
        if translated is None:
            raise
        raise translated from error


def list_prefixes(url: str) -> list[str]:
    """Immediate sub-"folders" of ``url`` as ``gs://bucket/prefix/name`` (no trailing slash).

    One delimiter listing: GCS returns each first-level prefix once, so the cost
    is a few requests whatever the number of objects below. A folder placeholder
    ``url/name/`` shows up as the prefix ``name`` like any other folder.

    Raises:
        UsageError: missing bucket, permission or credentials.
    """
    return list_level(url)[0]


def list_level(url: str) -> tuple[list[str], list[str]]:
    """``(sub-folders, files)`` directly under ``url``, as full ``gs://`` URLs, sorted.

    The delimiter listing of :func:`list_prefixes`, keeping the objects it
    returns at this level too (folder placeholders ``url/`` are not files).

    Raises:
        UsageError: missing bucket, permission or credentials.
    """
    bucket, prefix = split_url(url)
    folder = _folder_prefix(prefix)
    files = []
    try:
        iterator = _client().list_blobs(bucket, prefix=folder, delimiter="/", retry=_retry())
        for page in iterator.pages:  # prefixes are filled in while pages are read
            files += [f"gs://{bucket}/{b.name}" for b in page if not b.name.endswith("/")]
    except Exception as error:
        translated = usage_error(error, url, "list folders in")
        if translated is None:
            raise
        raise translated from error
    return sorted(f"gs://{bucket}/{p.rstrip('/')}" for p in iterator.prefixes), sorted(files)


def check_input(url: str) -> None:
    """Fails early, with one clear line, when ``url`` cannot be read as input.

    ``url`` is a folder (``gs://bucket/images``; the bucket root is allowed) that
    must hold at least one object that is not a folder placeholder, or a single
    existing object (a manifest stored in GCS).

    Raises:
        UsageError: the bucket does not exist, the caller may not list it, there
            are no (valid) credentials, or nothing is stored under ``url``.
    """
    doing = "list objects in"
    if _holds_files(url, doing) or _object_exists(url, "read"):
        return
    raise UsageError(f"No objects under {url} (nor an object of that name): check the path.")


def check_output(url: str) -> bool:
    """Checks that the converter can write under ``url``.

    Args:
        url: the output folder, ``gs://bucket/prefix`` (the bucket must exist;
            the prefix need not).

    Returns:
        Whether the output folder already holds objects (folder placeholders
        do not count), so that the CLI can refuse it without ``--overwrite``.

    Raises:
        UsageError: the bucket does not exist, there are no (valid) credentials,
            or the account lacks one of :data:`OUTPUT_PERMISSIONS`.
    """
    doing = "write to"
    holds_files = _holds_files(url, doing)
    bucket, _ = split_url(url)
    try:
        # testIamPermissions needs no permission itself and answers with the
        # subset held, so a read-only account fails here and not after the
        # whole job has run and the first shard is written.
        granted = set(
            _client().bucket(bucket).test_iam_permissions(list(OUTPUT_PERMISSIONS), retry=_retry())
        )
    except Exception as error:
        translated = usage_error(error, url, doing)
        if translated is None:
            raise
        raise translated from error
    missing = [p for p in OUTPUT_PERMISSIONS if p not in granted]
    if missing:
        raise UsageError(
            f"Permission denied to write to {url}: the account lacks {', '.join(missing)} "
            f"on bucket gs://{bucket}; grant roles/storage.objectAdmin "
            "(or roles/storage.objectUser) on it."
        )
    return holds_files


# ------------------------------------------------- a lost connection ends the run


def timeout_s() -> float:
    """--gcs_timeout_s of this run (the default outside the CLI)."""
    try:
        return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)
    except ValueError:
        return DEFAULT_TIMEOUT_S


def set_timeout(seconds: float) -> None:
    """Makes ``seconds`` this run's --gcs_timeout_s, here and in every process it starts."""
    os.environ[TIMEOUT_ENV] = repr(float(seconds))
    bound_retries()


def bound_retries() -> None:
    """Caps every retried GCS request of this process at :func:`timeout_s`.

    The storage client and Beam's GcsIO retry a failed request (connection
    refused or reset, timeouts, 5xx, 429) with backoff for 120 s by default, and
    a run makes many requests one after another: a connection lost for good
    kept a run silent for many minutes, its workers asleep in retries. Their
    retry policies are shared objects (google.cloud.storage.retry.DEFAULT_RETRY,
    which the conditional policies wrap, and Beam's
    DEFAULT_RETRY_WITH_THROTTLING_COUNTER) bound as default arguments
    throughout both libraries, so their budget is set on the objects
    themselves.

    A server that accepts a request and never answers (frozen, or behind a
    black-holing firewall) is met by each attempt's own time limit, not by
    the retries: the clients give every attempt 60 s, also bound as default
    arguments, in every method. Every request of both passes through one
    transport, google-auth's ``AuthorizedSession.request``; its time limits
    are capped there (:func:`_cap_attempts`), so one attempt waits at most
    --gcs_timeout_s for the server too.

    Call it before reading or writing gs:// in a process, once the clients'
    modules are loaded (cheap; it imports nothing).
    """
    seconds = timeout_s()
    for module, name in _RETRY_POLICIES:
        # Only what this process has loaded: importing here would slow local runs.
        policy = getattr(sys.modules.get(module), name, None)
        if policy is not None and policy._timeout != seconds:
            policy._timeout = policy._deadline = seconds
    session = getattr(sys.modules.get(_TRANSPORT), "AuthorizedSession", None)
    if session is not None and not getattr(session.request, _CAPPED, False):
        session.request = _cap_attempts(session.request)


# Where the storage client's (and so GcsIO's) HTTP requests all pass.
_TRANSPORT = "google.auth.transport.requests"
_CAPPED = "_imagerecords_capped"


def capped_timeout(timeout, seconds: float):
    """A request's time limit (seconds, ``(connect, read)`` or None: none) capped at
    ``seconds``: what one attempt may wait for a server that does not answer."""
    if isinstance(timeout, (tuple, list)):
        return tuple(seconds if t is None else min(t, seconds) for t in timeout)
    return seconds if timeout is None else min(timeout, seconds)


def _cap_attempts(request):
    import functools

    @functools.wraps(request)
    def capped(self, method, url, data=None, headers=None, max_allowed_time=None, **kwargs):
        # Absent: the transport's own default (120 s), capped all the same.
        kwargs["timeout"] = capped_timeout(kwargs.get("timeout", 120.0), timeout_s())
        return request(self, method, url, data, headers, max_allowed_time, **kwargs)

    setattr(capped, _CAPPED, True)
    return capped


_range_client = None  # (pid, client): read_range's, opened again in a forked process


def read_range(url: str, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of the object ``url``, within --gcs_timeout_s.

    For what a run reads from an old dataset (``--reuse gs://OLD``): retried
    for --gcs_timeout_s at most and each attempt as long at most, so GCS out
    of reach (refusing, or hanging) stops the run instead of being waited out
    once per record.

    Raises:
        errors.StorageUnreachable: GCS did not answer within --gcs_timeout_s.
        Exception: what the storage client raised otherwise (the object is
            gone, say): the caller decides.
    """
    global _range_client
    from google.cloud.storage.constants import _DEFAULT_TIMEOUT as CLIENT_TIMEOUT
    from google.cloud.storage.retry import DEFAULT_RETRY

    if _range_client is None or _range_client[0] != os.getpid():
        _range_client = (os.getpid(), client())
    bucket, name = split_url(url)
    seconds = timeout_s()
    try:
        # checksum=None: a range has no whole-object hash (the caller checks the bytes).
        return (
            _range_client[1]
            .bucket(bucket)
            .blob(name)
            .download_as_bytes(
                start=start,
                end=stop - 1,
                checksum=None,
                raw_download=True,
                retry=DEFAULT_RETRY.with_timeout(seconds),
                timeout=capped_timeout(CLIENT_TIMEOUT, seconds),
            )
        )
    except Exception as error:
        raise_if_unreachable(error, url)
        raise


# The shared retry policies of the storage client and of Beam's GcsIO.
_RETRY_POLICIES = (
    ("google.cloud.storage.retry", "DEFAULT_RETRY"),
    ("apache_beam.io.gcp.gcsio_retry", "DEFAULT_RETRY_WITH_THROTTLING_COUNTER"),
)


def _causes(error: BaseException):
    """``error``, what it wraps, and what caused it (Beam's BeamIOError holds a dict)."""
    seen, todo = set(), [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__]
        details = getattr(current, "exception_details", None)
        if isinstance(details, dict):
            todo += [e for e in details.values() if isinstance(e, BaseException)]
        todo += [a for a in getattr(current, "args", ()) if isinstance(a, BaseException)]


def is_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says GCS could not be reached, after the client's retries.

    What the storage client itself retries (connection errors, timeouts, 429,
    5xx: ``google.cloud.storage.retry``) or its retry giving up. A missing
    object or a refused permission is an answer, not a lost connection.
    """
    from google.api_core import exceptions as api
    from google.cloud.storage.retry import _should_retry  # the client's own transient rule

    def transient(cause: BaseException) -> bool:
        try:
            return isinstance(cause, Exception) and bool(_should_retry(cause))
        except (IndexError, AttributeError):  # an auth TransportError without its cause
            return False

    return any(isinstance(cause, api.RetryError) or transient(cause) for cause in _causes(error))


def _root_cause(error: BaseException) -> str:
    """The innermost error's type and first line (a retry's last attempt, the socket's)."""
    current, seen = error, set()
    while id(current) not in seen:
        seen.add(id(current))
        details = getattr(current, "exception_details", None)  # Beam's BeamIOError
        wrapped = (
            [e for e in details.values() if isinstance(e, BaseException)]
            if isinstance(details, dict)
            else []
        )
        inner = (
            getattr(current, "cause", None)  # api_core's RetryError: the last attempt's error
            or current.__cause__
            or (wrapped[0] if wrapped else None)
            or current.__context__
        )
        if not isinstance(inner, BaseException):
            break
        current = inner
    text = str(current).strip()
    return f"{type(current).__name__}: {text.splitlines()[0] if text else ''}"[:240]


def unreachable(url: str, error: BaseException) -> errors.StorageUnreachable:
    """The error that stops the run: ``url`` could not be reached within --gcs_timeout_s."""
    return errors.StorageUnreachable(
        f"lost the connection to Google Cloud Storage: could not reach {url} within "
        f"--gcs_timeout_s {timeout_s():g} ({_root_cause(error)}); {errors.NOT_FINISHED}; "
        f"{errors.RESUME_HINT}"
    )


def raise_if_unreachable(error: BaseException, url: str) -> None:
    """Raises :func:`unreachable` when ``error`` is a lost connection to GCS about ``url``.

    Reading an image that GCS cannot serve right now is no fault of the image:
    the run stops (and resumes later) instead of rejecting it.
    """
    if url.startswith("gs://") and not isinstance(error, errors.RunStopped):
        if is_unreachable(error):
            raise unreachable(url, error) from error


# A lost connection as a worker process reports it: only the text comes back.
_UNREACHABLE_TEXT = re.compile(
    r"RetryError|Timeout of [\d.]+s exceeded|ConnectionError|Connection refused|"
    r"ServiceUnavailable|Max retries exceeded"
)
_GCS_URL = re.compile(r"gs://[^\s'\"\]\[(){}]+")


def unreachable_from(error: BaseException, roots: list[str]) -> errors.StorageUnreachable | None:
    """What a runner's error amounts to when it is GCS out of reach; None otherwise.

    For the errors raised where no URL was at hand (Beam's own listing of
    gs:// folders, a worker's error text): the URL is the first one the error
    names, else the first of ``roots`` (the job's gs:// input and output).
    """
    if not roots or isinstance(error, errors.RunStopped):
        return None
    if not is_unreachable(error) and not _UNREACHABLE_TEXT.search(str(error)):
        return None
    named = []
    for cause in _causes(error):
        details = getattr(cause, "exception_details", None)
        if isinstance(details, dict):
            named += [key for key in details if isinstance(key, str)]
        named += _GCS_URL.findall(str(cause))
    urls = [url.split("*")[0].rstrip("/") for url in named if url.startswith("gs://")]
    return unreachable((urls + roots)[0], error)
