"""A stand-in S3 store for the tests: an HTTP proxy in front of moto's server that behaves like the stores dinops
must live with, in its own process (the training under test does not share its GIL).

- strict: it refuses what older S3-compatible stores (older Ceph RGW and MinIO, several hosted clones) refuse, the
  integrity checksums boto3 sends by default since 1.36 (https://github.com/boto/boto3/issues/4392): any
  ``x-amz-checksum-*``, ``x-amz-sdk-checksum-algorithm`` or ``x-amz-trailer`` header, and ``aws-chunked`` bodies, answer
  400 ``InvalidArgument: Unsupported header(s)``, the answer such a store gave to ``dinops train --output-s3``;
  a body without Content-Length answers 411 ``MissingContentLength``.
- outage: between ``/__stand_in__/down`` and ``/__stand_in__/up`` every S3 request is answered 503
  ``ServiceUnavailable`` (a store or a load balancer in trouble); botocore retries it, then gives up.

Run as ``python s3_stand_in.py UPSTREAM PORT [--strict]``; :func:`start` does that and waits until it answers.
"""

from __future__ import annotations

import http.client
import http.server
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

CONTROL = "/__stand_in__/"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def _error(code: str, message: str) -> bytes:
    xml = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{xml}'.encode()


def unsupported_headers(headers) -> list[str]:
    """The request headers a store without the newer checksums refuses, lower case."""
    names = sorted(
        name.lower()
        for name in headers
        if name.lower().startswith("x-amz-checksum-")
        or name.lower() in ("x-amz-sdk-checksum-algorithm", "x-amz-trailer")
    )
    if "aws-chunked" in headers.get("Content-Encoding", "") or headers.get("x-amz-content-sha256", "").startswith(
        "STREAMING-"
    ):
        names.append("content-encoding: aws-chunked")
    return names


class _Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's pool expects
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {"Content-Type": "application/xml"}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes | None:
        if "Content-Length" not in self.headers:
            return None
        return self.rfile.read(int(self.headers["Content-Length"]))

    def _handle(self) -> None:
        if self.path.startswith(CONTROL):
            self.server.down = self.path == CONTROL + "down"
            self._answer(200, b"ok", {"Content-Type": "text/plain"})
            return
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "")
        body = self._body()
        if self.server.down:
            self.close_connection = chunked
            self._answer(503, _error("ServiceUnavailable", "Please reduce your request rate."))
            return
        if self.server.strict and (refused := unsupported_headers(self.headers)):
            self.close_connection = chunked  # the body was not read: this connection cannot carry another request
            self._answer(400, _error("InvalidArgument", "Unsupported header(s): " + ", ".join(refused)))
            return
        if chunked or (body is None and self.command in ("PUT", "POST")):
            self.close_connection = True
            self._answer(411, _error("MissingContentLength", "You must provide the Content-Length HTTP header."))
            return
        upstream = http.client.HTTPConnection(self.server.upstream.hostname, self.server.upstream.port, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            forwarded = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP | {"content-length"}}
            self.send_response(response.status)
            for name, value in forwarded.items():
                self.send_header(name, value)
            # a HEAD answer names the object's length without a body
            self.send_header("Content-Length", response.getheader("Content-Length", str(len(data))))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    upstream: urllib.parse.SplitResult
    strict: bool
    down = False


@dataclass
class StandIn:
    """A running stand-in: ``.endpoint`` for clients; :meth:`down` and :meth:`up` switch the outage."""

    endpoint: str
    process: subprocess.Popen

    def _control(self, what: str) -> None:
        connection = http.client.HTTPConnection(urllib.parse.urlsplit(self.endpoint).netloc, timeout=10)
        try:
            connection.request("GET", CONTROL + what)
            assert connection.getresponse().status == 200
        finally:
            connection.close()

    def down(self) -> None:
        self._control("down")

    def up(self) -> None:
        self._control("up")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def start(upstream: str, strict: bool) -> StandIn:
    """The stand-in in front of ``upstream`` (moto's server) on a free port of 127.0.0.1, once it answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, str(Path(__file__)), upstream, str(port), *(["--strict"] if strict else [])]
    process = subprocess.Popen(command)
    stand_in = StandIn(f"http://127.0.0.1:{port}", process)
    deadline = time.monotonic() + 30
    while True:
        try:
            stand_in.up()
            return stand_in
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"the S3 stand-in did not start (rc {process.poll()})") from None
            time.sleep(0.05)


def _serve(upstream: str, port: int, strict: bool) -> None:
    server = _Server(("127.0.0.1", port), _Proxy)
    server.upstream = urllib.parse.urlsplit(upstream)
    server.strict = strict
    threading.current_thread().name = "s3-stand-in"
    server.serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), "--strict" in sys.argv[3:])
