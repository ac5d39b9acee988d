"""A local HTTP file server for the downloader's tests and benchmark: byte ranges, ETags, and faults on demand
(connections cut mid-file, corrupt bytes, no Range support, a per-connection bandwidth cap). 127.0.0.1 only."""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Faults:
    cut_after: int | None = None  # bytes sent before the connection is cut...
    cuts: int = 0  # ...for this many responses
    corrupt: int = 0  # responses whose bytes are flipped
    ranges: bool = True
    bytes_per_s: float | None = None  # per connection


@dataclass
class FileServer:
    files: dict[str, bytes] = field(default_factory=dict)
    faults: dict[str, Faults] = field(default_factory=dict)
    log: list[tuple[str, str]] = field(default_factory=list)  # (path, Range header or "")

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._etags: dict[tuple[str, int, int], str] = {}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def reset(self) -> None:
        with self._lock:
            self.files.clear()
            self.faults.clear()
            self.log.clear()
            self._etags.clear()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def etag(self, path: str, data: bytes) -> str:
        key = (path, len(data), id(data))
        if key not in self._etags:
            self._etags[key] = '"' + hashlib.md5(data).hexdigest() + '"'
        return self._etags[key]

    def _take(self, path: str, kind: str) -> bool:
        with self._lock:
            faults = self.faults.get(path)
            if faults is None or getattr(faults, kind) <= 0:
                return False
            setattr(faults, kind, getattr(faults, kind) - 1)
            return True


def _handler(server: FileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - quiet
            pass

        def do_HEAD(self):
            self._serve(body=False)

        def do_GET(self):
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            header = self.headers.get("Range", "")
            server.log.append((path, header))
            data = server.files.get(path)
            if data is None:
                self.send_error(404)
                return
            faults = server.faults.get(path, Faults())
            etag = server.etag(path, data)
            start, end, status = 0, len(data) - 1, 200
            match = _RANGE.match(header)
            if_range = self.headers.get("If-Range")
            if match and faults.ranges and (if_range is None or if_range == etag):
                start = int(match.group(1))
                end = min(int(match.group(2)) if match.group(2) else len(data) - 1, len(data) - 1)
                if start >= len(data) or start > end:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
            chunk = data[start : end + 1]
            probe = header == "bytes=0-0"  # a client's size probe: never faulted
            if not probe and server._take(path, "corrupt"):
                chunk = bytes(b ^ 0xFF for b in chunk)
            self.send_response(status)
            self.send_header("Content-Length", str(len(chunk)))
            self.send_header("ETag", etag)
            if faults.ranges:
                self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.end_headers()
            if not body:
                return
            limit = len(chunk)
            if not probe and faults.cut_after is not None and server._take(path, "cuts"):
                limit = min(limit, faults.cut_after)
            try:
                self._write(chunk[:limit], faults.bytes_per_s)
            except (BrokenPipeError, ConnectionResetError):  # the client hung up (a probe, a cancelled run)
                self.close_connection = True
                return
            if limit < len(chunk):
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True

        def _write(self, data: bytes, rate: float | None) -> None:
            block = 64 << 10
            started = time.perf_counter()
            for offset in range(0, len(data), block):
                self.wfile.write(data[offset : offset + block])
                if rate:
                    ahead = (offset + block) / rate - (time.perf_counter() - started)
                    if ahead > 0:
                        time.sleep(ahead)

    return Handler
