"""An HTTPS forward proxy that lets TensorFlow's GCS filesystem talk to a local emulator.

TensorFlow's built-in ``gs://`` filesystem has its endpoints compiled in
(``https://www.googleapis.com/storage/v1/`` for metadata and listings,
``https://storage.googleapis.com/BUCKET/OBJECT`` for reads) and ignores
``STORAGE_EMULATOR_HOST``. Its libcurl does honour ``https_proxy`` and
``CURL_CA_BUNDLE``, so this proxy accepts ``CONNECT`` for those two hosts,
terminates TLS with a leaf certificate signed by a throwaway CA (made by
:func:`make_certificates`), and forwards each request inside the tunnel to the
emulator over plain HTTP:

* ``www.googleapis.com/storage/v1/...`` and ``/upload/storage/v1/...``: the
  emulator serves the same JSON API paths, forwarded unchanged.
* ``storage.googleapis.com/BUCKET/OBJECT`` (TF's ranged reads): rewritten to the
  emulator's ``/download/storage/v1/b/BUCKET/o/OBJECT?alt=media``, so a bucket
  named like an API path segment (``b``, ``download``) cannot be misrouted.

Emulator quirks the proxy smooths over (real GCS behaves as the proxy answers):

* A ``Range`` that starts at or after the end of the object gets 206 with a
  bogus ``Content-Range`` from the emulator; GCS answers 416, which is what TF
  treats as end-of-file.
* Resumable-upload ``Location`` headers point at the emulator's own address;
  they are rewritten to ``https://www.googleapis.com`` so the upload continues
  through the tunnel.

Bounded and local on purpose: it binds 127.0.0.1 only, tunnels only to the two
Google hosts on port 443, serves at most ``MAX_CONNECTIONS`` connections at a
time with socket timeouts, caps request bodies, and exits when its standard
input closes (the test session ended or died) or after ``--max-seconds``.

Run as ``python -m tests.gcs_proxy --upstream http://127.0.0.1:PORT --cert C
--key K``; it prints its port on the first line of stdout.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import re
import socket
import ssl
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
MAX_CONNECTIONS = 64
MAX_BODY_BYTES = 1 << 30
SOCKET_TIMEOUT_S = 60

# Headers that describe one hop, not the message; never forwarded.
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "content-length",
    "host",
}


def make_certificates(directory: Path) -> dict[str, Path]:
    """Writes a throwaway CA and a leaf certificate for the Google storage hosts.

    EC P-256 keys: generating them takes milliseconds (RSA takes ~100 ms each on
    a loaded box) and TF's libcurl accepts them.

    Returns:
        Paths ``{"ca": ..., "cert": ..., "key": ...}`` (PEM).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "imagerecords test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(h) for h in GOOGLE_HOSTS]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    paths = {
        "ca": directory / "ca.pem",
        "cert": directory / "leaf.pem",
        "key": directory / "leaf.key",
    }
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(leaf_cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, upstream: str, tls: ssl.SSLContext):
        super().__init__(address, _ConnectHandler)
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port or 80
        self.upstream_base = f"http://{parsed.hostname}:{self.upstream_port}"
        self.tls = tls
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request, client_address):
        # Refuse rather than queue without bound: a stuck client must not pile
        # up threads.
        if not self.slots.acquire(timeout=SOCKET_TIMEOUT_S):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _ConnectHandler(BaseHTTPRequestHandler):
    """Answers ``CONNECT host:443``, then serves HTTP inside the TLS tunnel."""

    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S

    def do_CONNECT(self):  # noqa: N802 - http.server naming
        host, _, port = self.path.rpartition(":")
        if host not in GOOGLE_HOSTS or port != "443":
            self.send_error(403, f"this test proxy only tunnels to {GOOGLE_HOSTS} on 443")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        try:
            tunnel = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError) as error:
            _log(f"TLS handshake for {host} failed: {error}")
            self.close_connection = True
            return
        try:
            # The handler serves keep-alive requests until the client hangs up.
            _TunnelHandler(tunnel, self.client_address, self.server, tunnel_host=host)
        except OSError as error:  # the client vanished mid-request
            _log(f"tunnel to {host} ended: {error}")
        finally:
            # wrap_socket took over the file descriptor; the server closes only
            # the (now detached) plain socket.
            tunnel.close()
        self.close_connection = True

    def _refuse(self):
        self.send_error(405, "only CONNECT is supported")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _refuse  # noqa: N815

    def log_message(self, format, *args):  # noqa: A002 - http.server signature
        _log("connect: " + format % args)


class _TunnelHandler(BaseHTTPRequestHandler):
    """One TLS connection from TF's libcurl; each request goes to the emulator."""

    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S

    def __init__(self, request, client_address, server, tunnel_host: str):
        self.tunnel_host = tunnel_host
        super().__init__(request, client_address, server)

    def _forward(self):
        body = self._read_body()
        if body is None:
            return
        host = self.headers.get("Host", self.tunnel_host).split(":")[0]
        path = self._upstream_path(host)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
        object_size = self._object_size(path, headers) if self.command == "GET" else None
        if object_size is not None:
            # Range past the end: answer as GCS does; the emulator would not.
            self._send(416, {"Content-Range": f"bytes */{object_size}"}, b"")
            return
        upstream = http.client.HTTPConnection(
            self.server.upstream_host, self.server.upstream_port, timeout=SOCKET_TIMEOUT_S
        )
        try:
            upstream.request(self.command, path, body=body or None, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
            out_headers = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS}
        finally:
            upstream.close()
        if "Location" in out_headers:
            out_headers["Location"] = out_headers["Location"].replace(
                self.server.upstream_base, "https://www.googleapis.com"
            )
        self._send(response.status, out_headers, payload, reason=response.reason)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward  # noqa: N815

    def _read_body(self) -> bytes | None:
        """The request body (``b""`` when there is none), or None after answering 413."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks, total = [], 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                total += size
                if total > MAX_BODY_BYTES:
                    self.send_error(413)
                    return None
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.send_error(413)
            return None
        return self.rfile.read(length) if length else b""

    def _upstream_path(self, host: str) -> str:
        if host == "storage.googleapis.com":
            # TF reads objects as https://storage.googleapis.com/BUCKET/OBJECT.
            split = urllib.parse.urlsplit(self.path)
            bucket, _, name = split.path.lstrip("/").partition("/")
            name = urllib.parse.quote(urllib.parse.unquote(name), safe="")
            query = "alt=media" + (f"&{split.query}" if split.query else "")
            return f"/download/storage/v1/b/{bucket}/o/{name}?{query}"
        return self.path

    def _object_size(self, path: str, headers: dict[str, str]) -> int | None:
        """The object's size when a download ``Range`` starts at or past its end, else None."""
        match = re.fullmatch(r"\s*bytes=(\d+)-\d*\s*", headers.get("Range", "") or "")
        is_media = "alt=media" in path
        if not match or not is_media:
            return None
        meta_path = re.sub(r"^/download", "", path.split("?")[0])
        upstream = http.client.HTTPConnection(
            self.server.upstream_host, self.server.upstream_port, timeout=SOCKET_TIMEOUT_S
        )
        try:
            upstream.request("GET", meta_path)
            response = upstream.getresponse()
            payload = response.read()
        finally:
            upstream.close()
        if response.status != 200:
            return None
        size = int(json.loads(payload).get("size") or 0)
        return size if int(match.group(1)) >= size else None

    def _send(self, status: int, headers: dict[str, str], payload: bytes, reason=None):
        self.send_response(status, reason)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def log_message(self, format, *args):  # noqa: A002 - http.server signature
        _log(f"{self.tunnel_host}: " + format % args)


def serve(upstream: str, cert: Path, key: Path, max_seconds: float) -> None:
    """Runs the proxy on 127.0.0.1 (free port, printed on stdout) until stdin closes."""
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    # Only HTTP/1.1 inside the tunnel: if libcurl were offered h2 it would use it.
    tls.set_alpn_protocols(["http/1.1"])
    server = _ProxyServer(("127.0.0.1", 0), upstream, tls)
    server.socket.settimeout(None)
    print(server.server_address[1], flush=True)
    stop = threading.Event()

    def watch_stdin():
        sys.stdin.buffer.read()  # returns at EOF: the parent closed the pipe or died
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop.wait(max_seconds)
    server.shutdown()
    server.server_close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="emulator URL, http://127.0.0.1:PORT")
    parser.add_argument("--cert", required=True, type=Path)
    parser.add_argument("--key", required=True, type=Path)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    args = parser.parse_args(argv)
    socket.setdefaulttimeout(SOCKET_TIMEOUT_S)
    serve(args.upstream, args.cert, args.key, args.max_seconds)


if __name__ == "__main__":
    main()
