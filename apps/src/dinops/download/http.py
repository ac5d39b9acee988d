"""Resumable, verified HTTP downloads: several Range connections per file, retries with backoff.

A file is written as ``NAME.part`` with a sidecar ``NAME.part.json`` that records, per piece, how many bytes
are on disk; an interrupted run (a cut connection, a killed pod) continues where it stopped, as long as the
server's size and ETag are unchanged. Only a file whose checksum matches is renamed to ``NAME``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter

from dinops.digests import file_digests

log = logging.getLogger(__name__)

CHUNK = 1 << 20
READ_CHUNK = 64 << 10  # small enough that a cut connection loses little of what it delivered


class Progress:
    """Receives a file's size once known (again if the download starts over) and each batch of bytes."""

    def start(self, total: int | None) -> None:
        pass

    def update(self, count: int) -> None:
        pass


class DownloadError(RuntimeError):
    """A file could not be fetched or verified; the message names the URL and the last cause."""


class ChecksumError(DownloadError):
    pass


@dataclass(frozen=True)
class Remote:
    size: int | None
    ranges: bool
    validator: str  # ETag or Last-Modified: a change means the file changed


@dataclass
class Policy:
    connections: int = 4
    piece_size: int = 16 << 20
    retries: int = 8
    backoff_s: float = 1.0
    timeout_s: float = 60.0

    def delay(self, attempt: int) -> float:
        return min(60.0, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)


class _Sessions(threading.local):
    """One requests.Session per thread (sessions are not thread-safe), pooled connections within it."""

    def get(self, pool: int) -> requests.Session:
        if not hasattr(self, "session"):
            self.session = requests.Session()
            adapter = HTTPAdapter(pool_connections=4, pool_maxsize=max(4, pool))
            self.session.mount("http://", adapter)
            self.session.mount("https://", adapter)
            self.session.headers["User-Agent"] = "dinops-download"
        return self.session


_sessions = _Sessions()


def verify(path: Path, digests: dict[str, str], what: str) -> None:
    if not digests:
        return
    actual = file_digests(path, sorted(digests))
    wrong = [f"{a} {actual[a]} (expected {digests[a]})" for a in sorted(digests) if actual[a] != digests[a]]
    if wrong:
        raise ChecksumError(f"{what}: checksum mismatch: " + "; ".join(wrong))


class Fetcher:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def _session(self) -> requests.Session:
        return _sessions.get(self.policy.connections)

    def _retry(self, what: str, action: Callable[[int], None]) -> None:
        last: Exception | None = None
        for attempt in range(self.policy.retries):
            try:
                action(attempt)
                return
            except (requests.RequestException, OSError, _Incomplete) as exc:
                last = exc
                if attempt + 1 < self.policy.retries:
                    delay = self.policy.delay(attempt)
                    log.warning("%s: attempt %d failed (%s); retrying in %.1f s", what, attempt + 1, exc, delay)
                    time.sleep(delay)
        raise DownloadError(f"{what}: gave up after {self.policy.retries} attempts; last error: {last}")

    def probe(self, url: str) -> Remote:
        found: list[Remote] = []

        def attempt(_: int) -> None:
            with self._session().get(
                url, headers={"Range": "bytes=0-0"}, stream=True, timeout=self.policy.timeout_s
            ) as response:
                _raise_for_status(response, url)
                validator = response.headers.get("ETag") or response.headers.get("Last-Modified") or ""
                if response.status_code == 206 and "/" in response.headers.get("Content-Range", ""):
                    total = response.headers["Content-Range"].rsplit("/", 1)[1]
                    found.append(Remote(int(total) if total.isdigit() else None, total.isdigit(), validator))
                else:
                    length = response.headers.get("Content-Length")
                    found.append(Remote(int(length) if length and length.isdigit() else None, False, validator))

        self._retry(f"{url} (probe)", attempt)
        return found[0]

    def fetch(self, url: str, target: Path, digests: dict[str, str], progress: Progress | None = None) -> None:
        """Download ``url`` to ``target`` (atomically, verified). Up to three full attempts on a bad checksum."""
        progress = progress or Progress()
        for attempt in range(3):
            remote = self.probe(url)
            progress.start(remote.size)
            part = target.with_name(target.name + ".part")
            if remote.ranges and remote.size is not None and remote.size > 0:
                self._fetch_ranged(url, part, remote, progress)
            else:
                self._fetch_single(url, part, progress)
            try:
                verify(part, digests, url)
            except ChecksumError:
                _discard(part)
                if attempt == 2:
                    raise
                log.warning("%s: checksum mismatch; downloading it again", url)
                continue
            os.replace(part, target)
            _state_path(part).unlink(missing_ok=True)
            return

    def fetch_small(self, url: str, target: Path, progress: Progress | None = None) -> None:
        """One GET, no probe (for many small files such as single images); atomic, retried."""
        part = target.with_name(target.name + ".part")
        self._fetch_single(url, part, progress or Progress())
        os.replace(part, target)

    def _fetch_single(self, url: str, part: Path, progress: Progress) -> None:
        """No Range support: one stream from the start (a retry starts over)."""
        _state_path(part).unlink(missing_ok=True)

        def attempt(_: int) -> None:
            with self._session().get(url, stream=True, timeout=self.policy.timeout_s) as response:
                _raise_for_status(response, url)
                expected = response.headers.get("Content-Length")
                written = 0
                try:
                    with open(part, "wb") as fh:
                        for chunk in response.iter_content(READ_CHUNK):
                            fh.write(chunk)
                            written += len(chunk)
                            progress.update(len(chunk))
                        fh.flush()
                        os.fsync(fh.fileno())
                    if expected is not None and written != int(expected):
                        raise _Incomplete(f"got {written} of {expected} bytes")
                except BaseException:
                    progress.update(-written)  # a retry starts from zero
                    raise

        self._retry(url, attempt)

    def _fetch_ranged(self, url: str, part: Path, remote: Remote, progress: Progress) -> None:
        assert remote.size is not None
        state = _State.load_or_new(part, url, remote, self.policy.piece_size)
        progress.update(state.done_bytes())
        fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, remote.size)
            todo = [i for i, (start, end) in enumerate(state.pieces) if state.done[i] < end - start]
            workers = min(self.policy.connections, len(todo)) or 1
            with ThreadPoolExecutor(workers, thread_name_prefix="piece") as pool:
                futures = [pool.submit(self._fetch_piece, url, fd, state, i, remote, progress) for i in todo]
                errors = [f.exception() for f in futures]
            state.save()
            failed = [e for e in errors if e is not None]
            if failed:
                raise failed[0]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _fetch_piece(self, url: str, fd: int, state: _State, index: int, remote: Remote, progress: Progress) -> None:
        start, end = state.pieces[index]

        def attempt(_: int) -> None:
            offset = start + state.done[index]
            if offset >= end:
                return
            headers = {"Range": f"bytes={offset}-{end - 1}"}
            if remote.validator:
                headers["If-Range"] = remote.validator
            with self._session().get(url, headers=headers, stream=True, timeout=self.policy.timeout_s) as response:
                _raise_for_status(response, url)
                if response.status_code != 206 or not response.headers.get("Content-Range", "").startswith(
                    f"bytes {offset}-"
                ):
                    raise DownloadError(
                        f"{url}: the server stopped honouring byte ranges (or the file changed on the server)"
                    )
                position = offset
                for chunk in response.iter_content(READ_CHUNK):
                    chunk = chunk[: end - position]
                    os.pwrite(fd, chunk, position)
                    position += len(chunk)
                    state.advance(index, len(chunk))
                    progress.update(len(chunk))
                    if position >= end:
                        break
                if position < end:
                    raise _Incomplete(f"bytes {offset}-{end - 1}: connection ended at {position}")

        self._retry(f"{url} bytes {start}-{end - 1}", attempt)


class _Incomplete(Exception):
    pass


def _raise_for_status(response: requests.Response, url: str) -> None:
    if response.status_code in (408, 425, 429) or response.status_code >= 500:
        raise requests.HTTPError(f"HTTP {response.status_code}", response=response)  # worth retrying
    if response.status_code >= 400:
        raise DownloadError(f"{url}: HTTP {response.status_code} {response.reason}")


def _state_path(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _discard(part: Path) -> None:
    part.unlink(missing_ok=True)
    _state_path(part).unlink(missing_ok=True)


class _State:
    """Bytes done per piece of a ``.part`` file, saved (atomically) at most once a second."""

    def __init__(self, part: Path, url: str, remote: Remote, pieces: list[tuple[int, int]], done: list[int]) -> None:
        self.part, self.url, self.remote, self.pieces, self.done = part, url, remote, pieces, done
        self._lock = threading.Lock()
        self._saved = time.monotonic()

    @classmethod
    def load_or_new(cls, part: Path, url: str, remote: Remote, piece_size: int) -> _State:
        path = _state_path(part)
        if path.exists() and part.exists():
            try:
                saved = json.loads(path.read_text())
                if (saved["url"], saved["size"], saved["validator"]) == (url, remote.size, remote.validator):
                    pieces = [tuple(p) for p in saved["pieces"]]
                    log.info("%s: resuming, %d of %d bytes already on disk", url, sum(saved["done"]), remote.size)
                    return cls(part, url, remote, pieces, list(saved["done"]))
                log.info("%s: the file changed on the server; starting over", url)
            except (ValueError, KeyError, TypeError):
                log.warning("%s: unreadable resume state %s; starting over", url, path)
        _discard(part)
        size = remote.size or 0
        piece = max(CHUNK, piece_size)
        pieces = [(s, min(size, s + piece)) for s in range(0, size, piece)]
        return cls(part, url, remote, pieces, [0] * len(pieces))

    def done_bytes(self) -> int:
        return sum(self.done)

    def advance(self, index: int, count: int) -> None:
        with self._lock:
            self.done[index] += count
            if time.monotonic() - self._saved > 1.0:
                self._save_locked()

    def save(self) -> None:
        with self._lock:
            self._save_locked()

    def _save_locked(self) -> None:
        path = _state_path(self.part)
        tmp = path.with_name(path.name + ".tmp")
        body = {"url": self.url, "size": self.remote.size, "validator": self.remote.validator}
        tmp.write_text(json.dumps({**body, "pieces": self.pieces, "done": self.done}))
        os.replace(tmp, path)
        self._saved = time.monotonic()
