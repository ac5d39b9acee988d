"""A checkpoint in S3 as the inference service follows it: ``s3://bucket/key.pth``, or ``s3://bucket/prefix/`` for
the latest checkpoint that ``dinops train --output-s3`` published there (its ``latest.json`` manifest).

No torch here: the CLI checks the object before gunicorn forks its workers.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dinops import s3

log = logging.getLogger(__name__)
# what fetch() and s3.download_verified() name a worker's files: checkpoint-<pid>-<digest>.pth and, while it downloads,
# .checkpoint-<pid>-<digest>.pth.<pid>.part
_DOWNLOAD = re.compile(r"^\.?checkpoint-(\d+)-\w+\.pth(\.\d+\.part)?$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only the existence check (kill(2))
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_dead_downloads(cache_dir: Path) -> list[Path]:
    """Delete the downloads of workers that are gone (killed by the OOM killer or gunicorn's timeout, they never
    removed theirs): each is a whole checkpoint, and a few fill an emptyDir or a tmpfs. Returns what was deleted."""
    removed = []
    for path in cache_dir.glob("*checkpoint-*") if cache_dir.is_dir() else ():
        match = _DOWNLOAD.match(path.name)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.info("removed %d checkpoint download(s) of workers that are gone from %s", len(removed), cache_dir)
    return removed


@dataclass(frozen=True)
class ObjectIdentity:
    """What tells one checkpoint in S3 from the next: the object (ETag) or the manifest's entry (key, sha256)."""

    url: str
    etag: str
    size: int
    sha256: str

    def describe(self) -> dict[str, object]:
        return {"url": self.url, "etag": self.etag, "size": self.size, "sha256": self.sha256}


class S3Checkpoint:
    """A checkpoint object, or the latest one of a ``dinops train --output-s3`` prefix (its manifest)."""

    def __init__(self, url: str, endpoint: str, cache_dir: str) -> None:
        self.location = s3.parse_url(url, "--checkpoint (DINO_CHECKPOINT)")
        self.follows_manifest = url.endswith("/") or not self.location.prefix or url.endswith("/" + s3.MANIFEST)
        if self.follows_manifest and self.location.prefix.endswith(s3.MANIFEST):
            self.location = s3.S3Url(self.location.bucket, self.location.prefix[: -len(s3.MANIFEST)].strip("/"))
        self.client = s3.make_client(endpoint)
        self.cache_dir = Path(cache_dir or tempfile.gettempdir()) / "dinops-s3"
        self._current: Path | None = None
        remove_dead_downloads(self.cache_dir)  # at each worker's start

    def identity(self) -> ObjectIdentity | None:
        """None while there is no such object (or no manifest yet); :class:`s3.S3Error` when S3 cannot say."""
        if self.follows_manifest:
            manifest = s3.Manifest.read(self.client, self.location)
            if manifest is None:
                return None
            return ObjectIdentity(self.location.url(manifest.key), "", manifest.size, manifest.sha256)
        head = s3.head(self.client, self.location.bucket, self.location.prefix)
        if head is None:  # a HEAD answers 404 for a missing bucket too: tell the two apart
            s3.check_access(self.client, s3.S3Url(self.location.bucket, ""))
            return None
        sha256 = head.get("Metadata", {}).get(s3.SHA256_METADATA, "")
        return ObjectIdentity(self.location.url(), head["ETag"].strip('"'), head["ContentLength"], sha256)

    def fetch(self, identity: ObjectIdentity) -> Path:
        """Download the object the identity names, size- and sha256-checked (the sha256 when dinops wrote it)."""
        bucket, key = s3.parse_url(identity.url).bucket, s3.parse_url(identity.url).prefix
        digest = (identity.sha256 or identity.etag or "object")[:16]
        target = self.cache_dir / f"checkpoint-{os.getpid()}-{digest}.pth"
        return s3.download_verified(self.client, bucket, key, target, identity.size, identity.sha256)

    def loaded(self, path: Path) -> None:
        """``path`` is the model in use: this worker's previous download goes."""
        if self._current is not None and self._current != path:
            self._current.unlink(missing_ok=True)
        self._current = path
