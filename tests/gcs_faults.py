"""A plain-HTTP proxy in front of the GCS emulator that can lose the connection for good.

The converter's storage clients (google-cloud-storage, Beam's GcsIO) reach
the emulator through ``STORAGE_EMULATOR_HOST``; point that at a
:class:`DroppingProxy` instead and every request passes through it, until
the proxy *drops*: it closes its listening socket and every connection it
holds, so from then on each request fails as it does when the network to
GCS is gone (connection refused or reset), and nothing ever comes back.

It drops when a request matches ``drop_at`` for the ``after``-th time (the
request that matches last is not answered either), or when the test calls
:meth:`DroppingProxy.drop`. So a test can lose GCS at a chosen point of a
run: after so many image downloads, at the first upload, ...

With ``hang=True`` it fails the other way a storage service fails: from the
drop on it still accepts every connection and reads every request, and never
answers (as a frozen server, a black-holing firewall or a stuck load
balancer do), so each request waits for its client's own time limit.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Headers of one hop, not of the message: never forwarded.
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}
# A request for an object's bytes (the converter reading an image).
MEDIA_DOWNLOAD = re.compile(r"^GET .*[?&]alt=media")
# The start of a shard's upload (to its temporary name; the object name is in the body).
SHARD_UPLOAD = re.compile(r"^POST /upload/.*\n.*\.imagerecords-tmp/\w+-\d{5}\.[0-9a-f]{32}", re.S)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60

    def setup(self):
        super().setup()
        self.server.proxy.connections.add(self.connection)

    def finish(self):
        self.server.proxy.connections.discard(self.connection)
        super().finish()

    def _forward(self):
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        head = (body or b"")[:4096].decode("latin-1")
        if proxy.dropped.is_set() or proxy.count(f"{self.command} {self.path}\n{head}"):
            proxy.leave_unanswered(f"{self.command} {self.path}")
            proxy.stall()
            self.close_connection = True
            return  # no answer: the connection is lost
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
            out = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS]
        finally:
            upstream.close()
        if proxy.dropped.is_set():
            proxy.leave_unanswered(f"{self.command} {self.path}")
            proxy.stall()
            self.close_connection = True
            return
        if "json" in response.getheader("Content-Type", ""):
            # Links to objects (mediaLink, which downloads use) lead through the proxy too.
            payload = payload.replace(proxy.upstream.encode(), proxy.url.encode())
        self.send_response(response.status, response.reason)
        for key, value in out:
            if key.lower() == "location":  # resumable uploads continue through the proxy
                value = value.replace(proxy.upstream, proxy.url)
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward  # noqa: N815

    def log_message(self, *args):
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that hung up (it does, once the proxy drops) is no news


class DroppingProxy:
    """Forwards HTTP to ``upstream`` until it drops (see the module docstring).

    Args:
        upstream: The emulator's URL, ``http://127.0.0.1:PORT``.
        drop_at: A pattern searched in ``"METHOD PATH\\nBODY"`` of each request (the
            body's first 4 KB, as Latin-1).
        after: Drop at the ``after``-th matching request (0: only on :meth:`drop`).
        hang: Once dropped, accept and read requests but never answer them
            (instead of refusing connections).
    """

    def __init__(
        self, upstream: str, drop_at: re.Pattern | None = None, after: int = 0, hang: bool = False
    ):
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = upstream.rstrip("/")
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port or 80
        self._drop_at, self._after, self._seen = drop_at, after, 0
        self._lock = threading.Lock()
        self.dropped = threading.Event()
        # "METHOD PATH" of every request read and never answered (from the drop on).
        self.unanswered: list[str] = []
        self.hang = hang
        self._closing = threading.Event()
        self.connections: set[socket.socket] = set()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))
        self._thread.daemon = True
        self._thread.start()

    def count(self, request: str) -> bool:
        """Counts a request; whether it is the one to drop at (then drops)."""
        if self._drop_at is None or not self._after or not self._drop_at.search(request):
            return False
        with self._lock:
            self._seen += 1
            hit = self._seen >= self._after
        if hit:
            threading.Thread(target=self.drop, daemon=True).start()
        return hit

    def leave_unanswered(self, request: str) -> None:
        """Notes a request this proxy read and will never answer."""
        with self._lock:
            self.unanswered.append(request)

    @property
    def seen(self) -> int:
        return self._seen

    def stall(self) -> None:
        """In a request's handler, after the drop: with ``hang``, wait (no answer) until
        the proxy closes."""
        if self.hang:
            self._closing.wait()

    def drop(self) -> None:
        """Loses the connection for good: nothing listens, open connections are cut
        (with ``hang``: everything is accepted and nothing answered, until :meth:`close`)."""
        if self.dropped.is_set():
            return
        self.dropped.set()
        if not self.hang:
            self._cut()

    def _cut(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        for connection in list(self.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.dropped.set()
        self._closing.set()
        self._cut()
        self._thread.join(timeout=5)
